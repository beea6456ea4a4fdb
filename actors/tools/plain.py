"""Input contracts written by hand: a JSON schema and a plain-Python validator for it.

The built-in tools use these instead of pydantic (`schema.InputModel`): an executor
runs only the built-ins, and pydantic costs every executor ~11 MB of resident memory
(4 MB to import, 7 MB at the first model built). The schemas are the ones pydantic
derived before, kept identical (tests/unit/test_tool_schemas.py), and so are the error
messages the model reads for the inputs a model sends (wrong type, missing key, out
of range, unknown key). Stricter than pydantic's lax mode in two corners: a bool is
not a number and bytes are not a string.

Only what the built-ins' schemas use is understood: an object of `string` and
`number` properties, `required`, `default`, `exclusiveMinimum`, `maximum`,
`additionalProperties: false`. Anything else is refused when the tool is defined.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PlainInput", "ToolInputError"]


class ToolInputError(Exception):
    """A tool's input failed validation; `field` names the offending key (None: the whole input)."""

    def __init__(self, tool: str, field: str | None, message: str) -> None:
        self.tool = tool
        self.field = field
        self.message = message
        where = f"'{field}': " if field is not None else ""
        super().__init__(f"{tool}: {where}{message}")


_TOP_KEYS = frozenset({"type", "properties", "required", "additionalProperties"})
_PROPERTY_KEYS = {
    "string": frozenset({"type", "description"}),
    "number": frozenset({"type", "description", "default", "exclusiveMinimum", "maximum"}),
}


class PlainInput:
    """The input contract of one tool from a hand-written JSON schema.

    Same interface as `schema.InputModel` (`tool`, `fields`, `json_schema`,
    `validate`). `fn`, when given, is checked against the schema: its parameters
    (minus `exclude`) are exactly the properties, and those without a default are
    exactly the required ones.
    """

    def __init__(self, tool: str, schema: dict[str, Any], fn: Callable[..., Any] | None = None,
                 exclude: frozenset[str] = frozenset()) -> None:
        self.tool = tool
        _check_schema(tool, schema)
        self.json_schema: dict[str, Any] = schema
        self._properties: dict[str, dict[str, Any]] = schema["properties"]
        self.fields: tuple[str, ...] = tuple(self._properties)
        self._required = frozenset(schema.get("required", ()))
        if fn is not None:
            _check_signature(tool, fn, exclude, self.fields, self._required)

    def validate(self, data: object) -> dict[str, Any]:
        """Return the validated keyword arguments for `data`, or raise ToolInputError.

        A missing optional key is left out: the function's own default applies.
        """
        if not isinstance(data, Mapping):
            raise ToolInputError(
                self.tool, None, f"input must be an object, got {type(data).__name__}"
            )
        unknown = [str(k) for k in data if k not in self._properties]
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            expected = ", ".join(self.fields) or "no keys"
            raise ToolInputError(
                self.tool, unknown[0], f"unknown input key(s) {names}; expected {expected}"
            )
        out: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        for name, prop in self._properties.items():
            if name not in data:
                if name in self._required:
                    problems.append((name, "field required"))
                continue
            value, problem = _check_value(prop, data[name])
            if problem is not None:
                problems.append((name, problem))
            else:
                out[name] = value
        if problems:
            # As schema.InputModel words it: the first bad field, then the others.
            field, message = problems[0]
            rest = "; ".join(f"'{f}': {m}" for f, m in problems[1:])
            raise ToolInputError(self.tool, field, f"{message}; {rest}" if rest else message)
        return out


def _check_value(prop: dict[str, Any], value: object) -> tuple[Any, str | None]:
    """(the value to pass, None) or (None, what is wrong with it)."""
    if prop["type"] == "string":
        if isinstance(value, str):
            return value, None
        return None, "input should be a valid string"
    number = _as_number(value)
    if number is None:
        if isinstance(value, str):
            return None, "input should be a valid number, unable to parse string as a number"
        return None, "input should be a valid number"
    low, high = prop.get("exclusiveMinimum"), prop.get("maximum")
    if low is not None and not number > low:
        return None, f"input should be greater than {_shown(low)}"
    if high is not None and not number <= high:
        return None, f"input should be less than or equal to {_shown(high)}"
    return number, None


def _as_number(value: object) -> float | None:
    """A number as a float (a numeric string too, as models sometimes send "30"); not a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _shown(bound: float) -> str:
    """A bound as pydantic shows it: 600.0 as "600"."""
    if isinstance(bound, float) and math.isfinite(bound) and bound.is_integer():
        return str(int(bound))
    return str(bound)


def _check_schema(tool: str, schema: dict[str, Any]) -> None:
    """Refuse, at definition, a schema this module would not enforce in full."""
    if schema.get("type") != "object" or not schema.keys() <= _TOP_KEYS:
        raise TypeError(f"tool {tool}: a plain schema is an object with {sorted(_TOP_KEYS)}")
    if schema.get("additionalProperties") is not False:
        raise TypeError(f"tool {tool}: a plain schema must forbid additional properties")
    props = schema.get("properties")
    if not isinstance(props, dict):
        raise TypeError(f"tool {tool}: a plain schema needs its properties")
    for name, prop in props.items():
        allowed = _PROPERTY_KEYS.get(prop.get("type") if isinstance(prop, dict) else None)
        if allowed is None or not allowed >= prop.keys():
            raise TypeError(f"tool {tool}: property {name!r}: only string and number "
                            f"properties with {sorted(_PROPERTY_KEYS['number'])} are understood")
    if not set(schema.get("required", ())) <= props.keys():
        raise TypeError(f"tool {tool}: a required key is not a property")


def _check_signature(tool: str, fn: Callable[..., Any], exclude: frozenset[str],
                     fields: tuple[str, ...], required: frozenset[str]) -> None:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in exclude]
    names = tuple(p.name for p in params)
    if names != fields:
        raise TypeError(f"tool {tool}: parameters {names} differ from the schema's {fields}")
    needed = frozenset(p.name for p in params if p.default is p.empty)
    if needed != required:
        raise TypeError(f"tool {tool}: parameters without a default {sorted(needed)} differ "
                        f"from the schema's required {sorted(required)}")
