"""Numbers JSON cannot carry: NaN and ±Infinity in a model's tool input.

The SDK's JSON parser takes `NaN` and `Infinity` in a streamed tool input, but no
request holding them can be encoded (`allow_nan=False`) or would be taken by the
API: a call whose input held one, kept in the history as sent, made every later
request of the session fail. At the boundary where a reply joins the history
(`finite_reply`, called by the supervisor's machine) each such number becomes the
string that names it (`"NaN"`, `"Infinity"`, `"-Infinity"`), and the call is
answered with an error result that says where (`refusal`), never run.
"""

from __future__ import annotations

import math
from typing import Any

#: A message as a dict (Messages-API shape).
Message = dict[str, Any]


def _name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def finite(value: Any, path: str = "", found: list[str] | None = None) -> Any:
    """`value` with every non-finite float replaced by its name; the JSON paths of
    those replaced are appended to `found` (e.g. `timeout_s`, `items[2].x`)."""
    if isinstance(value, float) and not math.isfinite(value):
        if found is not None:
            found.append(f"{path or '(the input)'} = {_name(value)}")
        return _name(value)
    if isinstance(value, dict):
        return {k: finite(v, f"{path}.{k}" if path else str(k), found)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def finite_reply(reply: Message) -> tuple[Message, dict[str, list[str]]]:
    """`reply` with its tool inputs finite, and per tool_use id that had any, where.
    The reply itself is returned when nothing needed replacing."""
    bad: dict[str, list[str]] = {}
    content = reply.get("content")
    if not isinstance(content, list):
        return reply, bad
    blocks = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            found: list[str] = []
            clean = finite(block.get("input"), "", found)
            if found:
                bad[str(block.get("id"))] = found
                block = {**block, "input": clean}
        blocks.append(block)
    return (reply if not bad else {**reply, "content": blocks}), bad


def refusal(name: str, where: list[str]) -> str:
    """The tool result of a call whose input held numbers JSON cannot carry."""
    return (f"{name}: not run: its input holds a number JSON cannot carry "
            f"({', '.join(where[:5])}{', ...' if len(where) > 5 else ''}); "
            "call it again with finite numbers")
