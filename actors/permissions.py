"""Permission rules: which tool calls an agent may make (`allow`), must have approved
(`ask`) or may never make (`deny`).

An agent's rules come from `[agents.NAME.permissions]` in `oploop.toml`, in the
file's order; the first rule that matches a call decides, `default` (if given,
last) catches the rest, and a call no rule matches is allowed (an agent with no
rules keeps the behaviour it always had)::

    [agents.ops.permissions]      # first match wins; a key is TOOL or TOOL(GLOB)
    "shell(ls *)" = "allow"
    "write_file(/tmp/*)" = "allow"
    shell = "ask"
    write_file = "deny"
    default = "allow"

A `TOOL(GLOB)` key matches a call of TOOL whose main argument matches the glob
(`fnmatch`, case-sensitive, `*` crosses `/`): the command of `shell`, the path of
`write_file`, `read_file` and `list_dir`. Everything here is a plain function:
the supervisor's machine asks `decide` before running a call, and the executor
asks it again before it runs one (a `deny` holds even if the supervisor is
bypassed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

#: The values a rule may have.
VALUES = ("allow", "ask", "deny")

#: The argument a `TOOL(GLOB)` pattern is matched against, per tool.
MAIN_ARGUMENT: dict[str, str] = {
    "shell": "command",
    "write_file": "path",
    "read_file": "path",
    "list_dir": "path",
}

#: One rule: (key as written, tool or "default", glob or None, value).
Rule = tuple[str, str, str | None, str]

_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)(?:\((.*)\))?$", re.DOTALL)


class BadRule(ValueError):
    """A permission key or value that cannot be used (the message says why)."""


def parse_rule(key: str, value: Any) -> Rule:
    """One `KEY = VALUE` of a permissions table as a `Rule` (raises `BadRule`)."""
    if not isinstance(value, str) or value not in VALUES:
        raise BadRule(f"expected one of {', '.join(VALUES)}, got {value!r}")
    match = _KEY.match(key)
    if match is None:
        raise BadRule("expected TOOL or TOOL(GLOB), e.g. shell or \"shell(ls *)\"")
    tool, glob = match[1], match[2]
    if glob is not None:
        if tool == "default":
            raise BadRule("default takes no pattern")
        if not glob.strip():
            raise BadRule("an empty pattern (write TOOL alone to match every call)")
        if glob.count("[") != glob.count("]"):
            raise BadRule(f"bad pattern {glob!r}: unbalanced [ ]")
    return (key, tool, glob, value)


def parse_rules(table: Mapping[str, Any]) -> tuple[Rule, ...]:
    """A whole permissions table, in order; `BadRule` names the key, as `KEY: why`."""
    rules: list[Rule] = []
    keys = list(table)
    for i, key in enumerate(keys):
        try:
            rule = parse_rule(key, table[key])
        except BadRule as exc:
            raise BadRule(f"{key}: {exc}") from None
        if rule[1] == "default" and i != len(keys) - 1:
            raise BadRule(f"{keys[i + 1]}: never reached: default must be the last key")
        rules.append(rule)
    return tuple(rules)


def check_tools(rules: tuple[Rule, ...], known: set[str] | frozenset[str]) -> str | None:
    """The first problem with the tools `rules` name (unknown tool, a pattern on a
    tool with no main argument) as `KEY: why`, or None."""
    for key, tool, glob, _ in rules:
        if tool == "default":
            continue
        if tool not in known:
            return f"{key}: no tool named {tool!r} (the tools: {', '.join(sorted(known))})"
        if glob is not None and tool not in MAIN_ARGUMENT:
            return f"{key}: {tool} takes no pattern (only {', '.join(sorted(MAIN_ARGUMENT))})"
    return None


def decide(rules: tuple[Rule, ...], name: str, arguments: Any) -> tuple[str, str]:
    """The rule for a call of tool `name` on `arguments`: `(value, key)`; `("allow", "")`
    when no rule matches (no rules: today's behaviour)."""
    for key, tool, glob, value in rules:
        if tool == "default":
            return value, key
        if tool != name:
            continue
        if glob is None:
            return value, key
        arg = arguments.get(MAIN_ARGUMENT.get(name, "")) if isinstance(arguments, Mapping) \
            else None
        if isinstance(arg, str) and fnmatchcase(arg, glob):
            return value, key
    return "allow", ""


def rule_of_tool(rules: tuple[Rule, ...], name: str) -> str:
    """How `oploop tools --agent` shows a tool's rules: its plain rule's value, with the
    narrower ones before it, e.g. `allow if ls *; ask`."""
    parts: list[str] = []
    for _key, tool, glob, value in rules:
        if tool == "default" or (tool == name and glob is None):
            parts.append(value)
            return "; ".join(parts)
        if tool == name:
            parts.append(f"{value} if {glob}")
    parts.append("allow")
    return "; ".join(parts)


def denial(name: str, key: str) -> str:
    """The tool result of a call a `deny` rule refused."""
    return f"{name}: denied by the permission rule {key!r}"
