"""`ToolSpec`: what a tool is, as the model and other processes see it.

A spec carries no code. It crosses the wire (executor → supervisor, supervisor →
llm caller) as a plain dict and becomes an Anthropic Messages API tool definition
when a request is built.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

# The Messages API's own constraint on tool names; checking it here means a bad
# name fails when the tool is defined, not on the first model call.
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

_WIRE_KEYS = frozenset({"name", "description", "input_schema", "tags", "risky", "core"})
#: Sent only when set: the MCP server a tool comes from; that server's instructions
#: (on its first tool only, with `include_instructions`: they join the system prompt).
_OPTIONAL_KEYS = frozenset({"server", "instructions"})


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """The public description of one tool.

    `tags` are the categories an agent's allowlist filters on; `risky` tools run
    sandboxed, one child process per call; `core` tools survive every allowlist.
    `server`: the MCP server the tool comes from ("" for the others); `instructions`:
    that server's instructions for the system prompt, carried by its first tool only.
    """

    name: str
    description: str
    # Excluded from the hash: a dict is unhashable, and name identifies a tool anyway.
    input_schema: dict[str, Any] = field(hash=False)
    tags: tuple[str, ...]
    risky: bool
    core: bool
    server: str = ""
    instructions: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"tool name must match {_NAME_RE.pattern}, got {self.name!r}")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"tool {self.name}: description must be a non-empty string")
        schema = self.input_schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError(f"tool {self.name}: input_schema must be a dict with type 'object'")
        if not all(isinstance(k, str) for k in schema):
            raise ValueError(f"tool {self.name}: input_schema keys must be strings")
        if not isinstance(self.tags, tuple) or not all(isinstance(t, str) for t in self.tags):
            raise ValueError(f"tool {self.name}: tags must be a tuple of strings")
        for flag in ("risky", "core"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"tool {self.name}: {flag} must be a bool")
        if not isinstance(self.server, str):
            raise ValueError(f"tool {self.name}: server must be a string")
        if not isinstance(self.instructions, str):
            raise ValueError(f"tool {self.name}: instructions must be a string")

    def to_wire(self) -> dict[str, Any]:
        """A plain, msgpack-able dict; `from_wire` is its inverse."""
        wire = {
            "name": self.name,
            "description": self.description,
            # Copied so a caller mutating the message cannot change this spec.
            "input_schema": copy.deepcopy(self.input_schema),
            "tags": list(self.tags),
            "risky": self.risky,
            "core": self.core,
        }
        if self.server:
            wire["server"] = self.server
        if self.instructions:
            wire["instructions"] = self.instructions
        return wire

    @classmethod
    def from_wire(cls, d: object) -> ToolSpec:
        """Rebuild a spec from `to_wire` output; raise ValueError if `d` is malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"tool spec must be a dict, got {type(d).__name__}")
        missing = _WIRE_KEYS - d.keys()
        if missing:
            raise ValueError(f"tool spec missing key(s): {', '.join(sorted(missing))}")
        unknown = d.keys() - _WIRE_KEYS - _OPTIONAL_KEYS
        if unknown:
            names = ", ".join(sorted(map(str, unknown)))
            raise ValueError(f"tool spec has unknown key(s): {names}")
        tags = d["tags"]
        # msgpack decodes every array as a list; accept both, store a tuple.
        if not isinstance(tags, list | tuple):
            raise ValueError(f"tool spec tags must be a list, got {type(tags).__name__}")
        return cls(
            name=d["name"],
            description=d["description"],
            input_schema=copy.deepcopy(d["input_schema"]),
            tags=tuple(tags),
            risky=d["risky"],
            core=d["core"],
            server=d.get("server", ""),
            instructions=d.get("instructions", ""),
        )

    def to_api(self) -> dict[str, Any]:
        """The Anthropic Messages API tool definition: name, description, input_schema."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": copy.deepcopy(self.input_schema),
        }
