"""The intent router: one cheap call that decides whether a run needs its tools.

DIRECT means the request is answered from the model's own knowledge, so no
tool definitions are sent (a smaller, cheaper, faster request); AGENT means
the normal loop. The router only ever saves work: anything unexpected is AGENT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from actors.core.history import Message, blocks

if TYPE_CHECKING:
    from actors.config import RouterConfig

ROUTES = ("DIRECT", "AGENT")

#: The classifier's instructions; the offline model recognises its first line.
ROUTER_SYSTEM = (
    "Classify the user's latest request for an operator agent.\n"
    "Answer with exactly one word: DIRECT if it can be answered from general knowledge "
    "alone, AGENT if it needs tools (files, commands, the machine's state)."
)

#: How much of the user's text the classifier sees.
MAX_ROUTED_CHARS = 4000


def latest_user_text(history: list[Message]) -> str:
    """The text blocks of the last user message (tool results ignored)."""
    for msg in reversed(history):
        if msg.get("role") == "user":
            return "\n".join(b.get("text", "") for b in blocks(msg) if b.get("type") == "text")
    return ""


def router_request(history: list[Message], router: RouterConfig, session: str,
                   aliases: Mapping[str, str]) -> dict[str, Any]:
    """The classification request for the latest user message."""
    text = latest_user_text(history)[-MAX_ROUTED_CHARS:] or "(empty)"
    return {
        "model": aliases.get(router.model, router.model),
        "max_tokens": router.max_tokens,
        "temperature": 0.0,
        "system": ROUTER_SYSTEM,
        "messages": [{"role": "user", "content": text}],
        # Its own user id: the router's call is not one of the session's turns.
        "metadata": {"user_id": f"{session}:router"},
    }


def parse_route(reply: Message) -> str:
    """DIRECT or AGENT from the classifier's reply; anything else is AGENT."""
    return route_of(reply)[0]


def route_of(reply: Message) -> tuple[str, str]:
    """The route the classifier's reply decides, and why it is AGENT when the reply
    said neither ("" when it answered plainly)."""
    text = "".join(b.get("text", "") for b in blocks(reply) if b.get("type") == "text")
    words = text.strip().upper().split()
    word = words[0].strip(".:,") if words else ""
    if word in ROUTES:
        return word, ""
    return "AGENT", f"the intent router answered neither DIRECT nor AGENT: {text.strip()[:80]!r}"
