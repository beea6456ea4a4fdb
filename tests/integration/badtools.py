"""An executor whose tools answer what cannot go on the wire (run as a process).

`python badtools.py HOME`: serves the work protocol of the host in HOME with
four tools: `surrogate` (a result with a lone surrogate: unencodable), `huge`
(a result over the frame limit), `echo` (a normal one) and `hang` (never ends).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from actors.config import Agent, Config
from actors.executor.actor import Executor
from actors.tools import Catalogue, ToolContext, tool
from bus.codec import MAX_FRAME_BYTES
from bus.endpoints import Endpoints


@tool(tags=("test",), risky=False)
async def surrogate(ctx: ToolContext[Any]) -> str:
    """A result msgpack cannot encode (as a non-UTF-8 file name once gave)."""
    return "name: caf\udce9"


@tool(tags=("test",), risky=False)
async def huge(ctx: ToolContext[Any]) -> str:
    """A result over the frame limit."""
    return "x" * (MAX_FRAME_BYTES + 1024)


@tool(tags=("test",), risky=False)
async def echo(ctx: ToolContext[Any], text: str) -> str:
    """`text`, back."""
    return text


@tool(tags=("test",), risky=False)
async def hang(ctx: ToolContext[Any]) -> str:
    """Never answers (until aborted)."""
    await asyncio.Event().wait()
    return ""


def main() -> None:
    """Serve until killed."""
    # The jobs name "/" as their directory: the tools here touch no file, and these
    # tests are about slots, so the default agent works in scratch mode (where "/" is
    # only a start directory, never a writable one).
    config = Config(agents={"default": Agent(sandbox="scratch")})
    executor = Executor(Endpoints.for_home(Path(sys.argv[1])), config=config,
                        catalogue=Catalogue([surrogate, huge, echo, hang]))
    asyncio.run(executor.serve())


if __name__ == "__main__":
    main()
