"""Keeping a Messages-API history valid.

The API rejects a request where an assistant `tool_use` is not answered by a
`tool_result` in the very next user message ("tool_use ids were found without
tool_result blocks immediately after"), and a `tool_result` that answers no
`tool_use` of the message before. `sanitize` removes both kinds of orphan.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def blocks(message: Message) -> list[dict[str, Any]]:
    """A message's content as a list of blocks (a plain string is one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or [])


def tool_use_ids(message: Message) -> list[str]:
    """Ids of the `tool_use` blocks of an assistant message."""
    if message.get("role") != "assistant":
        return []
    return [b["id"] for b in blocks(message) if b.get("type") == "tool_use"]


def tool_result_ids(message: Message) -> list[str]:
    """Ids answered by the `tool_result` blocks of a user message."""
    if message.get("role") != "user":
        return []
    return [b["tool_use_id"] for b in blocks(message) if b.get("type") == "tool_result"]


def sanitize(history: list[Message]) -> list[Message]:
    """A copy of `history` without orphan tool calls or results, roles alternating.

    A valid history comes back equal to itself. Messages left empty are dropped
    and same-role neighbours merged; a leading assistant message is dropped.
    """
    # One pass can orphan what it keeps (dropping a leading assistant orphans the
    # results after it): repeat until nothing changes; each pass only removes.
    out = _sanitize_pass(history)
    while out != history:
        history, out = out, _sanitize_pass(out)
    return out


def _sanitize_pass(history: list[Message]) -> list[Message]:
    kept: list[Message] = []
    for i, msg in enumerate(history):
        role = msg.get("role")
        content = blocks(msg)
        if role == "assistant":
            nxt = history[i + 1] if i + 1 < len(history) else None
            answered = set(tool_result_ids(nxt)) if nxt else set()
            content = [b for b in content if b.get("type") != "tool_use" or b.get("id") in answered]
        elif role == "user":
            prev = history[i - 1] if i > 0 else None
            asked = set(tool_use_ids(prev)) if prev else set()
            content = [
                b for b in content
                if b.get("type") != "tool_result" or b.get("tool_use_id") in asked
            ]
        else:
            continue
        if not content:
            continue
        _append(kept, msg, role, content)
    while kept and kept[0]["role"] != "user":
        kept.pop(0)
    return kept


def _append(kept: list[Message], original: Message, role: str, content: list[Any]) -> None:
    """Append, merging into a same-role predecessor, keeping the original object if unchanged."""
    if kept and kept[-1]["role"] == role:
        kept[-1] = {"role": role, "content": blocks(kept[-1]) + content}
        return
    if content == blocks(original) and isinstance(original.get("content"), list) or isinstance(original.get("content"), str) and len(content) == 1:
        kept.append(original)
    else:
        kept.append({"role": role, "content": content})


def is_valid(history: list[Message]) -> bool:
    """Whether the API would accept `history`'s tool pairing and role order."""
    if history and history[0].get("role") != "user":
        return False
    for i, msg in enumerate(history):
        if i and history[i - 1].get("role") == msg.get("role"):
            return False
        if not blocks(msg):
            return False
        uses = tool_use_ids(msg)
        if uses:
            nxt = history[i + 1] if i + 1 < len(history) else None
            if nxt is None or not set(uses) <= set(tool_result_ids(nxt)):
                return False
        results = tool_result_ids(msg)
        if results:
            prev = history[i - 1] if i else None
            if prev is None or not set(results) <= set(tool_use_ids(prev)):
                return False
    return True


def append_blocks(history: list[Message], role: str, added: list[dict[str, Any]]) -> None:
    """The one way a history grows: `added` blocks of `role` join the last message when
    it has that role, else start a new message. The last message is replaced, never
    changed in place (`deltas` and the session log compare messages by identity), and
    the session log replays a history with this same rule."""
    if history and history[-1].get("role") == role:
        history[-1] = {"role": role, "content": blocks(history[-1]) + added}
    else:
        history.append({"role": role, "content": list(added)})


def add_reply(history: list[Message], reply: Message) -> None:
    """Append an assistant reply; after a `pause_turn` it continues the same
    assistant message (the API resumes that turn, and roles must alternate)."""
    append_blocks(history, "assistant", blocks(reply))


def add_user_text(history: list[Message], text: str) -> None:
    """Append a user message (into the last one if it is a user message already)."""
    append_blocks(history, "user", [{"type": "text", "text": text}])
