"""Which tools a turn offers: the active catalogue, the turn-1 allowlist, the hide map."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors import memorytool
from actors.config import Agent
from actors.permissions import rule_of_tool

ToolSpecDict = dict[str, Any]

#: Tools hidden per (platform, mode); applied last, every turn, and again at execution.
DEFAULT_HIDDEN: dict[tuple[str, str], frozenset[str]] = {}


def resolve_tools(
    catalogue: list[ToolSpecDict],
    agent: Agent,
    turn: int,
    hidden: Mapping[tuple[str, str], frozenset[str]] = DEFAULT_HIDDEN,
) -> list[ToolSpecDict]:
    """The tools offered on `turn`, in catalogue order (`memory` only to an agent with
    a `memory` folder)."""
    tools = catalogue
    if not agent.memory:
        tools = [t for t in tools if t["name"] != memorytool.NAME]
    if turn == 1 and agent.category_allowlist:
        allow = set(agent.category_allowlist)
        tools = [t for t in tools if t.get("core") or allow.intersection(t.get("tags", ()))]
    gone = hidden.get((agent.platform, agent.mode), frozenset())
    return [t for t in tools if t["name"] not in gone]


def listing(catalogue: list[ToolSpecDict], agent: Agent,
            hidden: Mapping[tuple[str, str], frozenset[str]],
            server_states: Mapping[Any, Any]) -> list[ToolSpecDict]:
    """The catalogue as `oploop tools` lists it for `agent`: each spec with whether turn 1
    and later turns offer it, its permission rule, and its MCP server's state (`memory`
    only for an agent with a memory: no other can ever be offered it)."""
    if not agent.memory:
        catalogue = [t for t in catalogue if t["name"] != memorytool.NAME]
    first = {t["name"] for t in resolve_tools(catalogue, agent, 1, hidden)}
    later = {t["name"] for t in resolve_tools(catalogue, agent, 2, hidden)}
    return [dict(t, turn1=t["name"] in first, later=t["name"] in later,
                 rule=rule_of_tool(agent.permissions, t["name"]),
                 **({"state": server_states.get(t["server"], "unknown")}
                    if t.get("server") else {}))
            for t in catalogue]


def unavailable_message(name: str) -> str:
    """The error result for a call to a tool not offered (it names no hidden tool)."""
    return f"tool {name} is not available"
