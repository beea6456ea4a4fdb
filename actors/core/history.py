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
    as_list = isinstance(original.get("content"), list)
    as_text = isinstance(original.get("content"), str)
    if content == blocks(original) and as_list or as_text and len(content) == 1:
        kept.append(original)
    else:
        kept.append({"role": role, "content": content})


def is_valid(history: list[Message]) -> bool:
    """Whether the API would accept `history`'s tool pairing and role order."""
    return valid_from(history, 0)


def valid_from(history: list[Message], start: int) -> bool:
    """Whether messages `start..` of `history` keep the one validity rule (what
    `sanitize` keeps as is): user/assistant roles alternating from a user message,
    none empty, every tool_use answered by the next message, every tool_result
    answering the one before. (`start` > 0: the messages before are known valid.)"""
    n = len(history)
    for i in range(max(0, start), n):
        msg = history[i]
        role = msg.get("role")
        if role not in ("user", "assistant") or not blocks(msg):
            return False
        if i == 0 and role != "user":
            return False
        prev = history[i - 1] if i else None
        if prev is not None and prev.get("role") == role:
            return False
        uses = tool_use_ids(msg)
        if uses and (i + 1 >= n or not set(uses) <= set(tool_result_ids(history[i + 1]))):
            return False
        results = tool_result_ids(msg)
        if results and (prev is None or not set(results) <= set(tool_use_ids(prev))):
            return False
    return True


def append_blocks(history: list[Message], role: str, added: list[dict[str, Any]]) -> None:
    """The one way a history grows: `added` blocks of `role` join the last message when
    it has that role, else start a new message. The last message is replaced, never
    changed in place (`deltas` and the session log compare messages by identity), and
    the session log replays a history with this same rule."""
    message, joined = grown(history[-1] if history else None, role, added)
    if joined:
        history[-1] = message
    else:
        history.append(message)


def grown(last: Message | None, role: str,
          added: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> tuple[Message, bool]:
    """The append rule on the last message alone: the history's new last message when
    `added` blocks of `role` join it, and whether it replaces `last` (same role) or
    follows it (the machine, which keeps only the last message, grows it so)."""
    if last is not None and last.get("role") == role:
        return {"role": role, "content": blocks(last) + list(added)}, True
    return {"role": role, "content": list(added)}, False


def add_reply(history: list[Message], reply: Message) -> None:
    """Append an assistant reply; after a `pause_turn` it continues the same
    assistant message (the API resumes that turn, and roles must alternate)."""
    append_blocks(history, "assistant", blocks(reply))


def add_user_text(history: list[Message], text: str) -> None:
    """Append a user message (into the last one if it is a user message already)."""
    append_blocks(history, "user", [{"type": "text", "text": text}])
