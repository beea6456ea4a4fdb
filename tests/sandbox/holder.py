"""A stand-in executor for the kill tests: runs one sandboxed command until it is killed.

`python holder.py HOME BACKEND COMMAND [off-layer ...]` starts a real Sandbox over HOME
and runs COMMAND in it; the test SIGKILLs this process and checks the tree.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from sbhelp import TEST_POLICY

from actors.sandbox import Sandbox, SandboxConfig
from actors.tools.process import run_command


async def main(home: Path, backend: str, command: str, off: frozenset[str]) -> None:
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), home / "workspaces", hide=(home,))
    sandbox.start(subreaper=True)
    policy = TEST_POLICY.lowered(off=off, backend=backend)
    await run_command(
        command, sandbox.workspace("held"), timeout_s=60, cap=4096,
        spawn=sandbox.spawner("shell", policy),
    )


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], frozenset(sys.argv[4:])))
