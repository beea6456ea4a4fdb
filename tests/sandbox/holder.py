"""A stand-in executor for the kill tests: runs one sandboxed command until it is killed.

`python holder.py HOME BACKEND COMMAND [off-layer ...]` starts a real Sandbox over HOME
and runs COMMAND in it; the test SIGKILLs this process and checks the tree.
`python holder.py --sweep HOME` is the next executor: it starts a Sandbox over HOME (its
start sweeps what dead executors left), prints how many processes it killed, and closes.

With HOLDER_CGROUPS set (cgroup directories, os.pathsep-separated) the process first
joins them, so its executor's cgroups live under that private cgroup: only executors
there see (and sweep) its leftovers, not those other tests start meanwhile.
"""

from __future__ import annotations

import asyncio
import os
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


def sweep(home: Path) -> None:
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), home / "workspaces")
    print(sandbox.start(), flush=True)
    sandbox.close()


def join_cgroups() -> None:
    for d in filter(None, os.environ.get("HOLDER_CGROUPS", "").split(os.pathsep)):
        Path(d, "cgroup.procs").write_text(str(os.getpid()))


if __name__ == "__main__":
    join_cgroups()  # before any Sandbox: it finds its cgroups from /proc/self/cgroup
    if sys.argv[1] == "--sweep":
        sweep(Path(sys.argv[2]))
    else:
        asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], frozenset(sys.argv[4:])))
