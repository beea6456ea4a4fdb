"""Permission rules: which tool calls an agent may make (`allow`), must have approved
(`ask`) or may never make (`deny`).

An agent's rules come from `[agents.NAME.permissions]` in `oploop.toml`, in the
file's order; the first rule that matches decides, `default` (if given, last)
catches the rest, and a call no rule matches is allowed (an agent with no rules
keeps the behaviour it always had)::

    [agents.ops.permissions]      # first match wins; a key is TOOL or TOOL(GLOB)
    "shell(ls *)" = "allow"
    "write_file(/tmp/*)" = "allow"
    "mcp__git__*" = "ask"         # every tool of the MCP server git, now and later
    shell = "ask"
    write_file = "deny"
    default = "allow"

Rules judge what a call does, not how it is written:

- A `TOOL(GLOB)` key matches with `fnmatch` (case-sensitive, `*` crosses `/`). For
  `read_file`, `write_file` and `list_dir` the glob is matched on the path made
  absolute against the call's working directory and normalised (`paths.lexical`:
  `.`, `..`, `//`, `~`, `/proc/self/root`; the executor also follows symlinks,
  `paths.real`).
- For `shell`, the command line is parsed (`shell.parse`) into the simple commands
  it would run; each is matched on its unquoted text (`ls -l /tmp`; a glob `CMD *`
  also matches `CMD` alone), and each file it writes by a redirection is judged as
  a `write_file` of that path (by the plain `shell` rule when no `write_file` rule
  names it). The line's verdict is the strictest of its parts: one `deny` denies,
  one `ask` asks, and it is allowed only when every part is. What the parser cannot
  decide (see `actors.permissions.shell`) is `ask`. A `shell` with no pattern rule
  and no `write_file` rule is judged whole, as written (there is nothing to match).
- For `memory` the glob is matched on the `/memories` path the call names, normalised
  (`memory(/memories/notes/*)`); a `rename` is judged on both its paths, the
  strictest verdict deciding. Those paths never leave the memory folder (the
  command refuses `..` and links), so they are judged as written.
- A tool name may hold `*` (`mcp__git__*`): it matches every tool named so.

`decide` is a pure function of the rules, the call and its working directory: the
supervisor's machine asks it before running a call, and the executor asks it again
on the real paths just before it runs one (a `deny` holds even if the supervisor
is bypassed, or a symlink points somewhere else).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from actors.permissions import paths

#: The values a rule may have.
VALUES = ("allow", "ask", "deny")

#: The argument a `TOOL(GLOB)` pattern is matched against, per tool.
MAIN_ARGUMENT: dict[str, str] = {
    "shell": "command",
    "write_file": "path",
    "read_file": "path",
    "list_dir": "path",
    "memory": "path",
}

#: One rule: (key as written, tool or "default", glob or None, value).
Rule = tuple[str, str, str | None, str]

_KEY = re.compile(r"^([A-Za-z_*][A-Za-z0-9_.*-]*)(?:\((.*)\))?$", re.DOTALL)

#: How strict each value is: a command line gets the strictest of its parts.
_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
#: The tools whose main argument is a path.
PATH_TOOLS = frozenset({"write_file", "read_file", "list_dir"})


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
    tool with no main argument) as `KEY: why`, or None. A name with `*` must match a
    known tool, or be in `known` itself (`mcp__NAME__*` of a configured server)."""
    for key, tool, glob, _ in rules:
        if tool == "default":
            continue
        if tool not in known and not any(fnmatchcase(k, tool) for k in known):
            return f"{key}: no tool named {tool!r} (the tools: {', '.join(sorted(known))})"
        if glob is not None and tool not in MAIN_ARGUMENT:
            return f"{key}: {tool} takes no pattern (only {', '.join(sorted(MAIN_ARGUMENT))})"
    return None


def decide(rules: tuple[Rule, ...], name: str, arguments: Any,
           cwd: str = "") -> tuple[str, str]:
    """The rule for a call of tool `name` on `arguments` run in `cwd`: `(value, key)`;
    `("allow", "")` when no rule matches (no rules: today's behaviour). For a shell
    line judged by its parts, `key` names the part that decided (an undecidable part
    as `undecided: why`)."""
    if not rules:
        return "allow", ""
    if name == "memory":
        return _decide_memory(rules, arguments)
    arg = arguments.get(MAIN_ARGUMENT.get(name, "")) if isinstance(arguments, Mapping) \
        else None
    if not isinstance(arg, str):
        return _first(rules, name, None)
    if name in PATH_TOOLS:
        return _first(rules, name, paths.lexical(arg, cwd))
    if name == "shell":
        return _decide_shell(rules, arg, cwd)
    return _first(rules, name, arg)


def _names(tool: str, name: str) -> bool:
    return tool == name or ("*" in tool and fnmatchcase(name, tool))


def _first(rules: tuple[Rule, ...], name: str, arg: str | None, *,
           command: bool = False, default: bool = True) -> tuple[str, str]:
    """The first rule matching `name` on `arg` (None: only plain rules match); with
    `default` False, `("", "")` when only `default` or nothing would."""
    for key, tool, glob, value in rules:
        if tool == "default":
            return (value, key) if default else ("", "")
        if not _names(tool, name):
            continue
        if glob is None:
            return value, key
        if arg is not None and (fnmatchcase(arg, glob)
                                or (command and fnmatchcase(arg + " ", glob))):
            return value, key
    return ("allow", "") if default else ("", "")


def _decide_shell(rules: tuple[Rule, ...], line: str, cwd: str,
                  real: bool = False) -> tuple[str, str]:
    """The strictest verdict among the parts of a command line (module docstring); with
    `real`, each file it writes judged where its symlinks lead (`paths.real`)."""
    plain = _first(rules, "shell", None)
    if not any(_names(tool, "shell") and glob is not None or _names(tool, "write_file")
               for _, tool, glob, _ in rules):
        return plain  # nothing judges parts: the line is judged whole, as before
    from actors.permissions import shell

    parsed = shell.parse(line, cwd)
    verdicts = [_first(rules, "shell", c.text, command=True) for c in parsed.commands]
    for path in parsed.writes:
        if real:
            path = paths.real(path, cwd)
        ruled = _first(rules, "write_file", path, default=False)
        verdicts.append(ruled if ruled[0] else plain)
    verdicts += [("ask", f"undecided: {why}") for why in parsed.undecided]
    if not verdicts:
        return plain
    return max(verdicts, key=lambda v: _STRICTNESS[v[0]])


def _decide_memory(rules: tuple[Rule, ...], arguments: Any) -> tuple[str, str]:
    """The strictest verdict over the /memories paths a memory call names."""
    from actors.memorytool import paths_of

    named = paths_of(arguments)
    if not named:
        return _first(rules, "memory", None)
    verdicts = [_first(rules, "memory", paths.lexical(p)) for p in named]
    return max(verdicts, key=lambda v: _STRICTNESS[v[0]])


def stricter(a: str, b: str) -> bool:
    """Whether the value `a` is stricter than `b` (`deny` > `ask` > `allow`)."""
    return _STRICTNESS[a] > _STRICTNESS[b]


def resolved(name: str, arguments: Any, cwd: str) -> Any:
    """`arguments` with a path tool's path as the kernel resolves it from `cwd` (every
    symlink followed: this reads the file system, the executor calls it just before
    the tool runs)."""
    if name in PATH_TOOLS and isinstance(arguments, Mapping) and \
            isinstance(arguments.get("path"), str):
        return {**arguments, "path": paths.real(arguments["path"], cwd)}
    return arguments


def refusal_here(rules: tuple[Rule, ...], name: str, arguments: Any, cwd: str) -> str | None:
    """What the executor answers instead of running a call, or None to run it: a call a
    `deny` rule refuses, as written or as its path really resolves; and a call whose
    real path a stricter rule governs than the path as written (a symlink into a
    denied or asked directory: the supervisor judged the name, not the target), the
    files a shell line's redirections write included."""
    if not rules:
        return None
    verdict, key = decide(rules, name, arguments, cwd)
    if verdict == "deny":
        return denial(name, key)
    if name == "shell":
        return _refusal_of_shell_writes(rules, arguments, cwd, verdict)
    real = resolved(name, arguments, cwd)
    if real is arguments:
        return None
    real_verdict, real_key = decide(rules, name, real, cwd)
    return _stricter_where_it_lands(name, (real_verdict, real_key), verdict,
                                    f"the path resolves to {real['path']}",
                                    "call it with that path")


def _refusal_of_shell_writes(rules: tuple[Rule, ...], arguments: Any, cwd: str,
                             verdict: str) -> str | None:
    """`refusal_here` for a shell line whose redirections write through a symlink into
    a place a stricter rule governs (`ls > link/x`, the link to a denied directory)."""
    line = arguments.get("command") if isinstance(arguments, Mapping) else None
    if not isinstance(line, str) or not any(
            _names(tool, "write_file") for _, tool, _, _ in rules):
        return None  # (no rule judges a write by its path: a symlink changes nothing)
    from actors.permissions import shell

    moved = [r for p in shell.parse(line, cwd).writes if (r := paths.real(p, cwd)) != p]
    if not moved:
        return None
    return _stricter_where_it_lands("shell", _decide_shell(rules, line, cwd, real=True),
                                    verdict, f"the path resolves to {', '.join(moved)}",
                                    "write to that path")


def _stricter_where_it_lands(name: str, real: tuple[str, str], verdict: str, where: str,
                             advice: str) -> str | None:
    """The refusal of a call whose path, resolved (`where`), is judged `real` (verdict,
    rule) by a stricter rule than the path as written was (`verdict`); None if not."""
    real_verdict, real_key = real
    if real_verdict == "deny":
        return f"{denial(name, real_key)} ({where})"
    if stricter(real_verdict, verdict):
        return (f"{name}: not run: {where}, which the rule {real_key!r} makes "
                f"{real_verdict}: {advice}")
    return None


def named_rule(rules: tuple[Rule, ...], name: str) -> str:
    """The value of the first plain rule naming `name` (a glob like `mcp__x__*` names
    it too), or "" when only `default` or nothing would decide: for what is no tool
    call and has a default of its own (an MCP server's sampling: "ask")."""
    return _first(rules, name, None, default=False)[0]


def rule_of_tool(rules: tuple[Rule, ...], name: str) -> str:
    """How `oploop tools --agent` shows a tool's rules: its plain rule's value, with the
    narrower ones before it, e.g. `allow if ls *; ask`."""
    parts: list[str] = []
    for _key, tool, glob, value in rules:
        if tool == "default" or (_names(tool, name) and glob is None):
            parts.append(value)
            return "; ".join(parts)
        if _names(tool, name):
            parts.append(f"{value} if {glob}")
    parts.append("allow")
    return "; ".join(parts)


def denial(name: str, key: str) -> str:
    """The tool result of a call a `deny` rule refused."""
    return f"{name}: denied by the permission rule {key!r}"
