"""Start a run on a host and stream its events, as `oploop run` does.

    python examples/client.py ["a prompt"]

Uses the running host of $OPLOOP_HOME (`oploop up --detach`), or starts an embedded
one for this program and stops it at the end (offline without ANTHROPIC_API_KEY).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone

from actors.cli.hosting import host_client  # noqa: E402


async def main(prompt: str) -> int:
    async with host_client() as client:  # bus.client.Client.connect() for a running host
        run = await client.start(prompt)
        print(f"session {run.session}")
        async for event in client.events(run.session, run.from_seq, stop_at="first"):
            print(event["type"], event["data"])
        # await client.cancel(run.session, mode="ui")  # or "operation"
    return 0 if event["type"] == "DONE" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "run `uname -a`")))
