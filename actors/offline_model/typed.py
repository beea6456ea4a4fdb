"""The offline model's answer when it is asked for JSON of a given schema.

The typed `Runner` (`actors.runner`) tells the model, at the end of its system
prompt, to answer with "only a JSON value that matches this JSON schema". The
rule engine cannot think, but it can keep to the form: its final answer then is
a value of that schema, built from it (defaults, first choices, the report of
the tools it ran for the first string), so that a typed run works offline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: How the typed runner's instruction introduces the schema (`OutputParser.instructions`).
SCHEMA_MARK = "this JSON schema, with no text around it:\n"


def requested_schema(system: str) -> dict[str, Any] | None:
    """The JSON schema the system prompt asks the answer to follow, or None."""
    at = system.find(SCHEMA_MARK)
    if at < 0:
        return None
    try:
        schema, _ = json.JSONDecoder().raw_decode(system, at + len(SCHEMA_MARK))
    except ValueError:
        return None
    return schema if isinstance(schema, dict) else None


def example_value(schema: Mapping[str, Any], text: str = "") -> Any:
    """A value of `schema`: defaults and first choices; `text` for the first string."""
    filler = _Filler(schema, text)
    return filler.value(schema, depth=0)


class _Filler:
    def __init__(self, root: Mapping[str, Any], text: str) -> None:
        self.defs = {**root.get("definitions", {}), **root.get("$defs", {})}
        self.text = text

    def _string(self) -> str:
        text, self.text = self.text, ""
        return text or "offline"

    def value(self, schema: Mapping[str, Any], depth: int) -> Any:
        if depth > 20:
            return None
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.value(self.defs.get(ref.rsplit("/", 1)[-1], {}), depth + 1)
        if "default" in schema:
            return schema["default"]
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf", "allOf"):
            options = [o for o in schema.get(key, []) if o.get("type") != "null"]
            if options:
                return self.value(options[0], depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        if kind == "object" or "properties" in schema:
            props = schema.get("properties", {})
            return {name: self.value(sub, depth + 1) for name, sub in props.items()}
        if kind == "array":
            least = int(schema.get("minItems", 0))
            return [self.value(schema.get("items", {}), depth + 1) for _ in range(least)]
        if kind == "string":
            return self._string()
        if kind in ("number", "integer"):
            least = schema.get("minimum", schema.get("exclusiveMinimum", 0))
            return int(least) if kind == "integer" else float(least)
        if kind == "boolean":
            return False
        return None
