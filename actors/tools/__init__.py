"""The tool catalogue and the built-in tools.

`ToolSpec` is what crosses the wire and reaches the model; a `Tool` is a spec
plus the async function behind it, built with `@tool`; `invoke` turns one call
into a `ToolOutcome`. `BUILTIN` holds read_file, list_dir, write_file and shell.

The names are loaded on first use: a process that only checks specs (the
supervisor) does not pay for the built-ins. pydantic is loaded only by `@tool`
on a function without a hand-written schema (the built-ins have theirs: an
executor never imports it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (the "X as X" form: re-exported, as __getattr__ does at run time)
    from .builtin import BUILTIN as BUILTIN
    from .builtin import FileWriter as FileWriter
    from .builtin import make_list_dir as make_list_dir
    from .builtin import make_read_file as make_read_file
    from .builtin import make_shell as make_shell
    from .builtin import make_write_file as make_write_file
    from .builtin import shown_name as shown_name
    from .memory import make_memory as make_memory
    from .plain import ToolInputError as ToolInputError
    from .process import Child as Child
    from .process import CommandResult as CommandResult
    from .process import Spawner as Spawner
    from .process import ToolRefused as ToolRefused
    from .process import run_command as run_command
    from .process import spawn_local as spawn_local
    from .registry import Catalogue as Catalogue
    from .registry import Tool as Tool
    from .registry import ToolContext as ToolContext
    from .registry import ToolOutcome as ToolOutcome
    from .registry import invoke as invoke
    from .registry import tool as tool
    from .spec import ToolSpec as ToolSpec

_HOMES = {
    "BUILTIN": "builtin", "FileWriter": "builtin", "make_shell": "builtin",
    "make_write_file": "builtin", "make_read_file": "builtin", "make_list_dir": "builtin",
    "shown_name": "builtin", "make_memory": "memory",
    "Child": "process", "CommandResult": "process", "Spawner": "process",
    "ToolRefused": "process", "run_command": "process", "spawn_local": "process",
    "Catalogue": "registry", "Tool": "registry", "ToolContext": "registry",
    "ToolOutcome": "registry", "invoke": "registry", "tool": "registry",
    "ToolInputError": "plain",
    "ToolSpec": "spec",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # once loaded, a plain module attribute
    return value
