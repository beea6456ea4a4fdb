"""Building one Messages-API request from an agent, a history and the turn's tools.

The system prompt is sent as blocks: the agent's static prefix (up to the
cache-boundary marker) with a cache breakpoint, the rest of the agent's
prompt, then this turn's reminders. Reminders are fresh every turn and are
never stored in history. Cache breakpoints go at the end of the static prefix
and on the latest user turns, never more than four in all. A request too large
for the bus has its oldest results left out (`actors.bounds.fit_messages`).
"""

from __future__ import annotations

import functools
import getpass
import os
import platform
import socket
import time
from collections.abc import Mapping
from typing import Any

from actors import memorytool
from actors.bounds import MAX_REQUEST_BYTES, MessageSizes, fit_messages, size_of
from actors.config import CACHE_BOUNDARY, MODEL_ALIASES, Agent
from actors.core.history import Message, blocks

MAX_CACHE_BREAKPOINTS = 4
#: History breakpoints: on the last user message and the one before it.
HISTORY_BREAKPOINTS = 2

_EPHEMERAL = {"type": "ephemeral"}

PLATFORM_HINTS = {
    "local": "Platform: a local machine; tools act on it directly.",
    "vps": "Platform: a remote server; prefer non-interactive commands.",
}


def reminders(agent: Agent, tools: list[dict[str, Any]], cwd: str) -> list[str]:
    """This turn's system reminders, in a fixed order."""
    out = [f"Identity: you are the oploop operator on {socket.gethostname()}."]
    if agent.target_machine:
        out.append(
            f"Target machine: the user is asking about {agent.target_machine}; "
            "your tools act there, not on this host."
        )
    else:
        out.append(
            f"Environment: {platform.system()} {platform.release()} ({platform.machine()}), "
            f"timezone {time.strftime('%Z')}, user {_user()}, "
            f"working directory {cwd or os.getcwd()}."
        )
    if tools:
        names = ", ".join(t["name"] for t in tools)
        out.append(
            f"Critical tools: {names}. Use them for real work; never guess what a command "
            "would print or what a file contains."
        )
    else:
        out.append(
            "No tools are available this turn: do not claim to have run commands or read "
            "files, and say so if the request needs them."
        )
    for server, text in _instructions(tools):
        out.append(f"Instructions of the MCP server {server} (for its tools mcp__{server}__*):"
                   f"\n{text}")
    hint = PLATFORM_HINTS.get(agent.platform)
    # "tools act on it directly" would contradict the target-machine reminder above
    if hint and not (agent.target_machine and agent.platform == "local"):
        out.append(hint)
    return out


def _instructions(tools: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The instructions MCP servers' tools carry (`include_instructions`), once a server."""
    seen: dict[str, str] = {}
    for tool in tools:
        text, server = tool.get("instructions"), tool.get("server")
        if text and isinstance(text, str) and isinstance(server, str) and server not in seen:
            seen[server] = text
    return list(seen.items())


@functools.cache  # (the process's user does not change; getuser() reads the env or passwd)
def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def system_blocks(agent: Agent, turn_reminders: list[str]) -> list[dict[str, Any]]:
    """The system prompt: static prefix (cached), dynamic rest, reminders."""
    static, _, dynamic = agent.system.partition(CACHE_BOUNDARY)
    out: list[dict[str, Any]] = [
        {"type": "text", "text": static.strip() or "You are an operator.",
         "cache_control": _EPHEMERAL}
    ]
    if dynamic.strip():
        out.append({"type": "text", "text": dynamic.strip()})
    if turn_reminders:
        out.append({"type": "text", "text": "\n".join(turn_reminders)})
    return out


def with_history_breakpoints(history: list[Message], budget: int) -> list[Message]:
    """A copy of `history` with cache breakpoints on the last blocks of the latest
    `budget` user messages; the stored history is not touched."""
    out = list(history)
    marked = 0
    for i in range(len(out) - 1, -1, -1):
        if marked >= budget:
            break
        msg = out[i]
        if msg.get("role") != "user":
            continue
        content = blocks(msg)
        if not content:
            continue
        last = dict(content[-1])
        last["cache_control"] = _EPHEMERAL
        out[i] = {"role": "user", "content": content[:-1] + [last]}
        marked += 1
    return out


def build_request(
    agent: Agent,
    history: list[Message],
    tools: list[dict[str, Any]],
    *,
    session: str,
    cwd: str,
    aliases: Mapping[str, str] = MODEL_ALIASES,
    max_bytes: int = MAX_REQUEST_BYTES,
    memo: RequestMemo | None = None,
) -> dict[str, Any]:
    """The request body for this turn (`history` already sanitised), at most about
    `max_bytes` on the bus if the history can be made to fit (`fit_messages`);
    `memo`: the session's, which keeps what does not change from turn to turn."""
    known = None
    if memo is None:
        head, size = request_head(agent, tools, session=session, cwd=cwd, aliases=aliases)
    else:
        head, size = memo.head(agent, tools, session, cwd, aliases)
        known = memo.sizes.measure(history)
    request = dict(head)  # (its parts shared: a request is read, never edited)
    budget = min(HISTORY_BREAKPOINTS, MAX_CACHE_BREAKPOINTS - 1)
    # The last resort: never a request the bus cannot carry (the history is untouched).
    history = fit_messages(history, max_bytes - size, known=known)
    request["messages"] = with_history_breakpoints(history, budget)
    return request


def request_head(agent: Agent, tools: list[dict[str, Any]], *, session: str, cwd: str,
                 aliases: Mapping[str, str] = MODEL_ALIASES) -> tuple[dict[str, Any], int]:
    """A request without its messages (`[]`), and its size on the bus (`size_of`)."""
    system = system_blocks(agent, reminders(agent, tools, cwd))
    request: dict[str, Any] = {
        "model": agent.model_id(aliases),
        "max_tokens": agent.max_tokens,
        "temperature": agent.temperature,
        "system": system,
        "messages": [],  # (the turn's, in a copy)
        "metadata": {"user_id": session},
    }
    if tools:
        model = request["model"]
        request["tools"] = [memorytool.api_tool(t, model) for t in tools]
        request["tool_choice"] = {"type": "auto"}
    return request, size_of(request)


class RequestMemo:
    """A session's last `request_head`, kept while what it is made of is equal: the
    agent, the turn's tools, the session, its directory, the model aliases, the host's
    name and time zone. Its system prompt, tool definitions and size are then not made
    again each turn (and are the same objects: the llm callers' history deltas compare
    them by identity first); and the sizes of the messages it sent (`MessageSizes`)."""

    __slots__ = ("_key", "_head", "sizes")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] = ()
        self._head: tuple[dict[str, Any], int] = ({}, 0)
        self.sizes = MessageSizes()

    def head(self, agent: Agent, tools: list[dict[str, Any]], session: str, cwd: str,
             aliases: Mapping[str, str]) -> tuple[dict[str, Any], int]:
        """`request_head(agent, tools, ...)`, made again only when an input changed."""
        # Everything `reminders` reads that can change while the process runs.
        key = (agent, aliases, session, cwd or os.getcwd(), socket.gethostname(),
               time.strftime("%Z"), *tools)
        if key != self._key:
            self._head = request_head(agent, tools, session=session, cwd=cwd, aliases=aliases)
            self._key = key
        return self._head


def count_breakpoints(request: dict[str, Any]) -> int:
    """How many `cache_control` markers a request carries (system, tools, messages)."""
    n = sum(1 for b in request.get("system", []) if "cache_control" in b)
    n += sum(1 for t in request.get("tools", []) if "cache_control" in t)
    for msg in request.get("messages", []):
        n += sum(1 for b in blocks(msg) if isinstance(b, dict) and "cache_control" in b)
    return n
