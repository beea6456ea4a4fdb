"""The `memory` tool: memory across sessions, in the folder of the agent's `memory` name.

The commands are `actors/memoryfs.py`; where they run is the `MemoryRunner` given
to `make_memory`: the executor's runs them in the sandbox, confined to the folder
(`Sandbox.memory_runner`), `run_local` in a thread (embedding and tests). The
folder of a call is `ToolContext.memory` (None: the agent has no memory, refused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from actors import memoryfs, memorytool

from .plain import ToolInputError
from .registry import Tool, ToolContext, ToolOutcome
from .spec import ToolSpec

MemoryRunner = Callable[[Path, dict[str, Any]], Awaitable[tuple[bool, str]]]
"""Runs one command (the validated input) on a memory folder: (is_error, text).
Raises OSError or ToolRefused when it could not run."""

INPUT_MAX = 2 * memoryfs.FILE_MAX
"""Characters of all the input's strings together: more cannot fit a memory file."""

_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "array": (list,)}


class MemoryInput:
    """The input contract of `memory` (an `InputContract`): the schema's keys and types
    only, the command's own arguments checked by the command (as the API's tool does)."""

    tool = memorytool.NAME
    json_schema = memorytool.SCHEMA
    fields = tuple(memorytool.SCHEMA["properties"])

    def validate(self, data: object) -> dict[str, Any]:
        """The input as keyword arguments, or ToolInputError naming the key at fault."""
        if not isinstance(data, Mapping):
            raise ToolInputError(self.tool, None,
                                 f"input must be an object, got {type(data).__name__}")
        props = self.json_schema["properties"]
        out: dict[str, Any] = {}
        for key, value in data.items():
            prop = props.get(key)
            if prop is None:
                raise ToolInputError(self.tool, str(key), f"unknown input key {str(key)!r}; "
                                     f"expected {', '.join(self.fields)}")
            if not isinstance(value, _TYPES[prop["type"]]) or isinstance(value, bool):
                raise ToolInputError(self.tool, key, f"input should be a valid {prop['type']}")
            out[key] = value
        if "command" not in out:
            raise ToolInputError(self.tool, "command", "field required")
        if out["command"] not in memoryfs.COMMANDS:
            raise ToolInputError(self.tool, "command", f"expected one of "
                                 f"{', '.join(memoryfs.COMMANDS)}, got {out['command']!r}")
        if sum(len(v) for v in out.values() if isinstance(v, str)) > INPUT_MAX:
            raise ToolInputError(self.tool, None, f"the input is longer than {INPUT_MAX} "
                                 "characters, more than a memory file may hold: nothing done")
        return out


async def run_local(folder: Path, command: dict[str, Any]) -> tuple[bool, str]:
    """The unsandboxed `MemoryRunner`: the folder made (0700), the command in a thread."""

    def run() -> tuple[bool, str]:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return memoryfs.execute(str(folder), command)

    return await asyncio.to_thread(run)


def make_memory(runner: MemoryRunner = run_local) -> Tool:
    """Build the `memory` tool around `runner`, so the sandbox can supply its own."""

    async def memory(ctx: ToolContext[Any], **command: Any) -> ToolOutcome:
        if ctx.memory is None:
            return ToolOutcome.error('memory: this agent has no memory folder (set '
                                     'memory = "NAME" in its [agents.NAME] table)')
        from .process import ToolRefused

        try:
            is_error, text = await runner(ctx.memory, command)
        except ToolRefused as exc:
            return ToolOutcome.error(f"memory: {exc}")
        except OSError as exc:
            return ToolOutcome.error(f"memory: {exc.strerror or exc}")
        return ToolOutcome(text, is_error)

    spec = ToolSpec(name=memorytool.NAME, description=memorytool.DESCRIPTION,
                    input_schema=memorytool.SCHEMA, tags=("memory",), risky=True, core=False)
    return Tool(spec=spec, fn=memory, input_model=MemoryInput(), wants_ctx=True)
