"""The memory tool as the rest of oploop sees it: its name, its schema, where an agent's
memory folder is, and how a request offers it to a model.

An agent with `memory = "NAME"` is offered `memory`; its calls run in the sandbox on
`$OPLOOP_HOME/memory/NAME` (`memoryfs.py`, the commands), a folder every agent with
that name shares. A model that knows the Messages API's memory tool gets it in its
native form (`{"type": "memory_20250818", "name": "memory"}`: the model was trained
on it and the API supplies its schema; the SDK's plain Messages types carry it,
`MemoryTool20250818Param`, so no beta header is sent), any other model an ordinary
tool with `SCHEMA`. Pure: the core imports it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

NAME = "memory"
"""The tool's name (fixed by the API's native memory tool)."""
NATIVE_TYPE = "memory_20250818"
"""The Messages API's type of the native memory tool."""

#: The names a memory folder may have: a file name, nothing that walks out.
_FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Models trained on the native memory tool: Claude 4 models and later (Opus 4,
#: Sonnet 4, Haiku 4.5, ...); `claude-3-7-sonnet` and older do not know it.
_NATIVE_MODEL = re.compile(r"^claude-(?:opus|sonnet|haiku)-(\d+)")

DESCRIPTION = (
    "Your memory across sessions: a directory /memories that persists after this "
    "conversation and that later sessions read. Before a task, view /memories for what "
    "earlier sessions learnt; record progress and lessons as you go. Commands: view (a "
    "directory, or a file with line numbers; view_range [first, last]), create (path, "
    "file_text; a new file), str_replace (path, old_str, new_str; old_str must occur "
    "exactly once), insert (path, insert_line, insert_text; after that line, 0 = the "
    "start), delete (path), rename (old_path, new_path). Every path starts with /memories."
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "delete", "rename"],
                    "description": "What to do."},
        "path": {"type": "string", "description": "A path under /memories (all but rename)."},
        "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                       "maxItems": 2, "description": "view: [first, last] line (last -1: "
                       "to the end)."},
        "file_text": {"type": "string", "description": "create: the file's contents."},
        "old_str": {"type": "string", "description": "str_replace: the text to replace "
                    "(exactly one occurrence)."},
        "new_str": {"type": "string", "description": "str_replace: its replacement."},
        "insert_line": {"type": "integer", "description": "insert: the line after which "
                        "to insert (0: before the first)."},
        "insert_text": {"type": "string", "description": "insert: the text to insert."},
        "old_path": {"type": "string", "description": "rename: the path to move."},
        "new_path": {"type": "string", "description": "rename: where to move it."},
    },
    "required": ["command"],
    "additionalProperties": False,
}
"""The input of `memory` as an ordinary tool: the native tool's commands, flattened."""


def folder_name_error(name: str) -> str | None:
    """Why `name` cannot name a memory folder, or None."""
    if not _FOLDER_NAME.match(name) or ".." in name:
        return (f"{name!r}: a memory name is 1-64 letters, digits, '_', '-' or '.', "
                "starting with a letter or digit")
    return None


def folder(home: Path, name: str) -> Path:
    """The memory folder `name` of the host in `home` (not made here)."""
    if folder_name_error(name):
        raise ValueError(f"bad memory name {name!r}")
    return home / "memory" / name


def native(model: str) -> bool:
    """Whether `model` (a concrete id) takes the native memory tool."""
    found = _NATIVE_MODEL.match(model)
    return found is not None and int(found[1]) >= 4


def api_tool(spec: dict[str, Any], model: str) -> dict[str, Any]:
    """The Messages-API definition of the tool `spec` for `model`: the native memory
    tool where the model takes it, else name, description and input schema."""
    if spec["name"] == NAME and native(model):
        return {"type": NATIVE_TYPE, "name": NAME}
    return {"name": spec["name"], "description": spec["description"],
            "input_schema": spec["input_schema"]}


def paths_of(arguments: Any) -> list[str] | None:
    """The /memories paths a call names (two for rename), for the permission rules;
    None when it names none."""
    if not isinstance(arguments, dict):
        return None
    keys = ("old_path", "new_path") if arguments.get("command") == "rename" else ("path",)
    found = [arguments[k] for k in keys if isinstance(arguments.get(k), str)]
    return found or None
