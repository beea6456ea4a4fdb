"""The tool catalogue and the built-in tools.

`ToolSpec` is what crosses the wire and reaches the model; a `Tool` is a spec
plus the async function behind it, built with `@tool`; `invoke` turns one call
into a `ToolOutcome`. `BUILTIN` holds read_file, list_dir, write_file and shell.
"""

from .builtin import BUILTIN, FileWriter, make_shell, make_write_file
from .process import Child, CommandResult, Spawner, ToolRefused, run_command, spawn_local
from .registry import Catalogue, Tool, ToolContext, ToolOutcome, invoke, tool
from .schema import ToolInputError
from .spec import ToolSpec

__all__ = [
    "BUILTIN",
    "Catalogue",
    "Child",
    "CommandResult",
    "FileWriter",
    "Spawner",
    "Tool",
    "ToolContext",
    "ToolInputError",
    "ToolOutcome",
    "ToolRefused",
    "ToolSpec",
    "invoke",
    "make_shell",
    "make_write_file",
    "run_command",
    "spawn_local",
    "tool",
]
