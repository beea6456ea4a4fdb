"""Reading `oploop.toml`: the error that names the key, and the checks every table uses.

`ConfigError` is what a bad file raises; `record` builds a dataclass from a TOML
table with every field type-checked; `parse_duration` and `parse_size` read the
`30d` and `1GiB` a table may say. Nothing of oploop is imported here: every part
of the configuration (`actors.configparts`) stands on this.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and key."""


def record(cls: type[Any], raw: Any, source: str, where: str) -> Any:
    """An instance of dataclass `cls` from a TOML table, every field type-checked."""
    table = as_table(raw, source, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    no_unknown(table, fields, source, where)
    values = {k: checked(hints[k], v, source, f"{where}.{k}") for k, v in table.items()}
    return cls(**values)


def checked(hint: Any, value: Any, source: str, where: str) -> Any:
    """`value` if it has the type `hint` (int accepted for float, lists for tuples)."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{source}: {where}: expected a list, got {type(value).__name__}")
        item = typing.get_args(hint)[0]
        return tuple(checked(item, v, source, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{source}: {where}: unsupported field type")  # none exist today
    ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ConfigError(
            f"{source}: {where}: expected {hint.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def as_table(raw: Any, source: str, where: str) -> Mapping[str, Any]:
    """`raw` if it is a table (`where` names it in the error)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: {where}: expected a table, got {type(raw).__name__}")
    return raw


def str_map(raw: Any, source: str, where: str) -> dict[str, str]:
    """A table of strings, as a dict."""
    table = as_table(raw, source, where)
    return {k: checked(str, v, source, f"{where}.{k}") for k, v in table.items()}


def no_unknown(table: Mapping[str, Any], known: frozenset[str] | set[str], source: str,
                where: str) -> None:
    """Raise ConfigError naming the first key of `table` not in `known`."""
    extra = sorted(set(table) - set(known))
    if extra:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"{source}: {prefix}{extra[0]}: unknown key (known: {', '.join(sorted(known))})"
        )


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0, "w": 604_800.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_BYTES = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class BadDuration(ValueError):
    """Not a duration: a number of seconds, or `90s`, `15m`, `12h`, `30d`, `2w`."""


class BadSize(ValueError):
    """Not a size: a number of bytes, or `500MB`, `1GiB`, `20k`, ..."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like `30d` (raises `BadDuration`)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadDuration(f"expected a duration (30d, 12h, 15m, 90s), got {value!r}")
    return float(match[1]) * _SECONDS[match[2] or "s"]


def parse_size(value: Any) -> int:
    """Bytes from a number or a string like `1GiB`, `500MB` (raises `BadSize`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadSize(f"expected a size (1GiB, 500MB, bytes), got {value!r}")
    unit = (match[2] or "").lower().removesuffix("b")
    return int(float(match[1]) * _BYTES[unit])
