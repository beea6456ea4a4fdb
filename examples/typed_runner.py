"""The agent loop embedded in a program, typed: your Python tools get your objects
(`deps`), and the final answer is parsed into your type.

    python examples/typed_runner.py

Offline (no ANTHROPIC_API_KEY) the offline model answers: it keeps to the answer's
form, not its sense. With a key, a real model answers.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone

from actors.runner import RunFailed, Runner  # noqa: E402
from actors.tools import ToolContext, tool  # noqa: E402


@dataclass
class Answer:
    host: str
    disk_free_gb: float


@tool(risky=False, tags=("inventory",))
async def lookup(ctx: ToolContext[dict[str, str]], name: str) -> str:
    """Look a host up in the inventory."""
    return ctx.deps.get(name, "unknown host")


async def main() -> int:
    inventory = {"db-1": "db-1: 512 GB disk, 120.5 GB free"}
    async with Runner(output_type=Answer, tools=[lookup]) as runner:
        try:
            result = await runner.run("how much disk is free on db-1?", deps=inventory)
        except RunFailed as exc:
            print(f"the run failed: {exc}", file=sys.stderr)
            return 1
    print(result.output)
    print(f"disk free: {result.output.disk_free_gb} GB ({result.turns} turn(s))")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
