"""An elicitation's answer checked against its form (the request's `requestedSchema`).

MCP's forms are flat: an object of primitive properties (string, with `enum` or a
`format`; number; integer; boolean; an array of enum strings for a multiple
choice). What a person types (`oploop answer S ID key=value`) is a string: it is
read as the number or boolean the schema wants; what the web view or a program
sends may already be typed. A missing required field, an unknown one, a value of
the wrong type or outside its enum is refused with a message naming it: nothing is
sent to the server then. A field left out that has a `default` (SEP-1034) is sent with
it, as a form shown pre-filled and accepted as it is. No SDK here (the supervisor
checks the answers)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

ACTIONS = ("accept", "decline", "cancel")


class FormError(ValueError):
    """An answer the form refuses (the message names the field)."""


def checked(schema: Mapping[str, Any], content: Mapping[str, Any]) -> dict[str, Any]:
    """`content` with each value of the type its property wants, and the defaults of the
    fields it leaves out; raises FormError."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required") if isinstance(schema, Mapping) else None
    out: dict[str, Any] = {}
    for key, value in content.items():
        spec = properties.get(key)
        if not isinstance(spec, Mapping):
            known = ", ".join(map(str, properties)) or "none"
            raise FormError(f"{key}: not a field of this form (fields: {known})")
        out[key] = _value(key, spec, value)
    for key, spec in properties.items():
        if key not in out and isinstance(spec, Mapping) and "default" in spec:
            with contextlib.suppress(FormError):  # (a default its field refuses: not sent)
                out[str(key)] = _value(str(key), spec, spec["default"])
    for key in required if isinstance(required, list) else ():
        if key not in out:
            raise FormError(f"{key}: required")
    return out


def _value(key: str, spec: Mapping[str, Any], value: Any) -> Any:
    kind = spec.get("type")
    if kind == "boolean":
        value = _boolean(key, value)
    elif kind in ("number", "integer"):
        value = _number(key, value, integer=kind == "integer")
        for bound, ok in (("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b)):
            limit = spec.get(bound)
            if isinstance(limit, int | float) and not ok(limit):
                raise FormError(f"{key}: {value} is outside its {bound} {limit}")
    elif kind == "array":
        items = value if isinstance(value, list) else [
            v.strip() for v in str(value).split(",") if v.strip()]
        choices = _choices(spec.get("items") if isinstance(spec.get("items"), Mapping) else {})
        for item in items:
            if not isinstance(item, str) or (choices and item not in choices):
                raise FormError(f"{key}: {item!r} is not one of {', '.join(choices)}")
        value = items
    else:  # a string (the default type)
        if not isinstance(value, str):
            raise FormError(f"{key}: expected a string, got {value!r}")
        choices = _choices(spec)
        if choices and value not in choices:
            raise FormError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return value


def _choices(spec: Mapping[str, Any]) -> list[str]:
    """The allowed strings: `enum`, or `oneOf`/`anyOf` of `{const, title}`."""
    if isinstance(spec.get("enum"), list):
        return [str(v) for v in spec["enum"]]
    options = spec.get("oneOf") or spec.get("anyOf")
    if isinstance(options, list):
        return [str(o["const"]) for o in options if isinstance(o, Mapping) and "const" in o]
    return []


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "y", "1", "on"):
        return True
    if word in ("false", "no", "n", "0", "off"):
        return False
    raise FormError(f"{key}: expected true or false, got {value!r}")


def _number(key: str, value: Any, *, integer: bool) -> int | float:
    if isinstance(value, bool):
        raise FormError(f"{key}: expected a number, got {value!r}")
    try:
        number = float(value) if not isinstance(value, int | float) else value
    except ValueError:
        raise FormError(f"{key}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise FormError(f"{key}: expected a finite number, got {value!r}")
    if integer:
        if number != int(number):
            raise FormError(f"{key}: expected an integer, got {value!r}")
        return int(number)
    return number
