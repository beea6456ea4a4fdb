"""A session's context budget and its compaction, as plain functions over a history.

The history of record only grows (every message the session saw stays in it and in
the session log); what a model call sends is a *view* of it, `ContextView`:

- tool results in messages before `cleared` are replaced by a marker naming the
  tool, its input and how to see it again (`cleared_block`);
- messages before `summarised` are replaced by one user message holding `summary`,
  the model's own summary of them (`summary_message`).

The view only changes by a `COMPACTED` event (which carries it: the session log
folds it like any event), when a request reaches the agent's budget
(`context_window` x `compact_at`): first results are cleared (the most recent ones
kept whole), then, if that is not enough, older turns are summarised by a model
call (`summary_request`). Sizes are in tokens, estimated at four characters of a
block's JSON a token (`request_tokens`), or counted from the last reply's usage plus
the estimate of what was added since (`ContextMemo.measure`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii
from typing import Any, NamedTuple

from actors.core.history import Message, blocks

__all__ = ["CHARS_PER_TOKEN", "IMAGE_TOKENS", "KEEP_RESULT_MESSAGES", "NEAR", "SUMMARY_MARK",
           "TARGET", "ContextMemo", "ContextView", "block_tokens", "budget_of", "clear_point",
           "cleared_block", "count_results", "count_turns", "is_summary_request",
           "message_tokens", "request_tokens", "result_cap", "summary_message", "summary_of",
           "summary_point", "summary_request", "too_long", "transcript", "view_messages"]

#: The estimate: a token for every four characters of a block's JSON (the API counts
#: English and code at about 3.5 to 4.5 characters a token; JSON's quoting adds more).
CHARS_PER_TOKEN = 4
#: An image, whatever its bytes: the API counts about width x height / 750 tokens, after
#: scaling it to at most ~1.15 megapixels, so about 1,600 at most (its base64 is not text).
IMAGE_TOKENS = 1_600
#: The user messages holding tool results kept whole by a compaction (the latest ones).
KEEP_RESULT_MESSAGES = 2
#: A result shorter than this (characters) is never cleared: its marker is no shorter.
MIN_CLEARED_CHARS = 400
#: A compaction aims at this fraction of the budget: clearing results that leaves more
#: than that is followed by a summary (so the next compaction is not one turn away).
TARGET = 0.5
#: From this fraction of the budget on, an estimate is checked by counting the
#: request's tokens exactly (the Messages API's `count_tokens`), where that is offered.
NEAR = 0.9
#: How a summary request's system prompt begins (the offline model recognises it).
SUMMARY_MARK = "You are compacting a conversation between a user and an operator agent."
SUMMARY_SYSTEM = (
    f"{SUMMARY_MARK} Summarise the transcript you are given so that the agent can go on "
    "from your summary alone: what the user asked for, what was done and found (commands, "
    "files, results that matter, errors), what is still open. Be factual and brief; "
    "plain text, no preamble."
)
#: A summary request's output bound, and the longest summary kept (characters).
SUMMARY_MAX_TOKENS = 2048
MAX_SUMMARY_CHARS = 12_000
#: How much of each tool result and text a transcript quotes (characters).
TRANSCRIPT_RESULT_CHARS = 600
TRANSCRIPT_TEXT_CHARS = 2_000
#: How a summary message begins (what the model reads first after a compaction).
SUMMARY_HEADER = ("[This conversation was compacted: what came before is summarised "
                  "below; older tool results are no longer shown.]")


class ContextView(NamedTuple):
    """What a request shows of the history: messages before `summarised` replaced by
    `summary`, tool results before `cleared` replaced by markers (indices into the
    history of record, which only grows)."""

    summary: str = ""
    summarised: int = 0
    cleared: int = 0

    def to_data(self) -> dict[str, Any]:
        """The view as a `COMPACTED` event carries it."""
        return {"summary": self.summary, "summarised": self.summarised,
                "cleared": self.cleared}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ContextView:
        """The view a `COMPACTED` event (or a snapshot) describes."""
        return cls(str(data.get("summary") or ""), int(data.get("summarised") or 0),
                   int(data.get("cleared") or 0))


EMPTY = ContextView()


# -- sizes ----------------------------------------------------------------------------


def block_tokens(block: Any) -> int:
    """A content block's (or a tool definition's) estimated tokens: its JSON's characters,
    but an image (alone or in a tool's result) as the API counts it, `IMAGE_TOKENS`."""
    images = _images_in(block)
    if images:
        block = _without_images(block)
    return (_json_len(block) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN \
        + images * IMAGE_TOKENS


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# `json.dumps(block)`'s own encoder, made once: `dumps` makes it again at every call,
# which cost more than encoding a typical block (a few are measured every turn).
_ENCODE = None if c_make_encoder is None else c_make_encoder(
    None, _not_json, encode_basestring_ascii, None, ": ", ", ", False, False, True)


def _json_len(block: Any) -> int:
    """`len(json.dumps(block))`."""
    if _ENCODE is None:
        return len(json.dumps(block))
    return sum(map(len, _ENCODE(block, 0)))


def _images_in(block: Any) -> int:
    if isinstance(block, dict):
        if block.get("type") == "image":
            return 1
        content = block.get("content")
        return sum(_images_in(b) for b in content) if isinstance(content, list) else 0
    return 0


def _without_images(block: Any) -> Any:
    if not isinstance(block, dict) or block.get("type") == "image":
        return {"type": "image"} if isinstance(block, dict) else block
    content = block.get("content")
    if isinstance(content, list):
        return {**block, "content": [_without_images(b) for b in content]}
    return block


def message_tokens(message: Message) -> int:
    """A message's estimated tokens (its blocks, plus a few for its role)."""
    content = message.get("content")
    if isinstance(content, str):
        return 4 + block_tokens(content)
    return 4 + sum(block_tokens(b) for b in content or ())


def request_tokens(request: Mapping[str, Any]) -> int:
    """A whole request's estimated input tokens: tools, system prompt, messages."""
    n = sum(block_tokens(t) for t in request.get("tools") or ())
    system = request.get("system")
    if isinstance(system, list):
        n += sum(block_tokens(b) for b in system)
    elif system:
        n += block_tokens(system)
    return n + sum(message_tokens(m) for m in request.get("messages") or ())


def budget_of(window: int, compact_at: float) -> int:
    """The size at which a request is compacted."""
    return max(1, int(window * compact_at))


def result_cap(limit: int) -> int:
    """The most characters one tool result keeps as it enters the history under a budget
    of `limit` tokens: a third of it, so that the latest results kept whole by a
    compaction (`KEEP_RESULT_MESSAGES`) and the rest still fit."""
    return max(1_000, limit * CHARS_PER_TOKEN // 3)


# -- the view -------------------------------------------------------------------------


def summary_message(summary: str) -> Message:
    """The user message a compacted request starts from."""
    return {"role": "user", "content": [{"type": "text", "text": f"{SUMMARY_HEADER}\n\n{summary}"}]}


def cleared_block(result: Mapping[str, Any], call: Mapping[str, Any] | None) -> dict[str, Any]:
    """A `tool_result` block cleared: a marker naming the tool and its input, and how to
    see the output again (its id kept, so the call stays answered)."""
    name = str(call.get("name", "")) if call else ""
    given = json.dumps(call.get("input", {}), ensure_ascii=False) if call else "{}"
    if len(given) > 300:
        given = given[:300] + "…"
    size = _result_chars(result)
    what = "an error" if result.get("is_error") else "a result"
    text = (f"[tool result cleared to save context: {name or 'a tool'} {given} returned "
            f"{what} of {size} characters; call {name or 'the tool'} again with the same "
            "input to see it]")
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.get("tool_use_id"),
                           "content": text}
    if result.get("is_error"):
        out["is_error"] = True
    return out


def _result_parts(result: Mapping[str, Any]) -> list[Any]:
    content = result.get("content")
    if isinstance(content, str):
        return [{"text": content}]
    return list(content or ())


def _clearable(block: Mapping[str, Any]) -> bool:
    """A `tool_result` block long enough to be worth a marker."""
    return block.get("type") == "tool_result" and _result_chars(block) >= MIN_CLEARED_CHARS


def _result_chars(result: Mapping[str, Any]) -> int:
    return sum(len(str(b.get("text", ""))) if isinstance(b, Mapping) else len(str(b))
               for b in _result_parts(result))


def _cleared(message: Message, before: Message | None) -> Message:
    """`message` with its (long enough) tool results cleared (the same object if none)."""
    content = blocks(message)
    if message.get("role") != "user" or not any(_clearable(b) for b in content):
        return message
    calls = {b.get("id"): b for b in blocks(before) if b.get("type") == "tool_use"} \
        if before is not None else {}
    return {"role": "user", "content": [
        cleared_block(b, calls.get(b.get("tool_use_id"))) if _clearable(b)
        else b for b in content]}


def _prefix(history: Sequence[Message], view: ContextView) -> list[Message]:
    """The view's messages standing for `history[:max(cleared, summarised)]`."""
    start = min(view.summarised, len(history))
    end = min(max(view.cleared, start), len(history))
    out: list[Message] = [summary_message(view.summary)] if view.summary else []
    for i in range(start, end):
        out.append(_cleared(history[i], history[i - 1] if i else None))
    return out


def view_messages(history: Sequence[Message], view: ContextView) -> list[Message]:
    """The messages a request shows of `history` under `view` (valid if `history` is:
    the summary replaces whole turns up to an assistant message, a cleared result keeps
    its `tool_use_id`)."""
    if view == EMPTY:
        return list(history)
    return _prefix(history, view) + list(history[max(view.cleared, view.summarised):])


# -- compaction -----------------------------------------------------------------------


def clear_point(history: Sequence[Message], view: ContextView,
                keep: int = KEEP_RESULT_MESSAGES) -> int:
    """Where clearing should reach: before the latest `keep` user messages holding tool
    results (every result before it cleared); at least where it already is."""
    seen = 0
    for i in range(len(history) - 1, max(view.cleared, view.summarised) - 1, -1):
        msg = history[i]
        if msg.get("role") == "user" and any(b.get("type") == "tool_result"
                                             for b in blocks(msg)):
            seen += 1
            if seen > keep:
                return i + 1
    return view.cleared if seen <= keep else max(view.cleared, view.summarised)


def summary_point(history: Sequence[Message], view: ContextView) -> int:
    """Where a summary should reach: the latest assistant message that follows what is
    summarised already (the request then goes on from that turn), or 0 if none does."""
    for i in range(len(history) - 1, view.summarised, -1):
        if history[i].get("role") == "assistant":
            return i
    return 0


def count_results(history: Sequence[Message], start: int, end: int) -> int:
    """Tool results a view clearing `history[start:end]` replaces by markers."""
    return sum(1 for m in history[start:end] if m.get("role") == "user"
               for b in blocks(m) if _clearable(b))


def count_turns(history: Sequence[Message], start: int, end: int) -> int:
    """Model turns (assistant messages) in `history[start:end]`."""
    return sum(1 for m in history[start:end] if m.get("role") == "assistant")


def transcript(messages: Sequence[Message], max_chars: int) -> str:
    """`messages` as text for a summary request, at most about `max_chars` (the newest
    kept when it must be cut; a summary it starts from always kept)."""
    lines: list[str] = []
    for msg in messages:
        role = msg.get("role")
        for b in blocks(msg):
            kind = b.get("type")
            if kind == "text":
                lines.append(f"[{role}] {_cut(str(b.get('text', '')), TRANSCRIPT_TEXT_CHARS)}")
            elif kind == "tool_use":
                given = json.dumps(b.get("input", {}), ensure_ascii=False)
                lines.append(f"[assistant called {b.get('name')}] {_cut(given, 300)}")
            elif kind == "tool_result":
                text = " ".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p)
                                for p in _result_parts(b))
                error = " (error)" if b.get("is_error") else ""
                lines.append(f"[tool result{error}] {_cut(text, TRANSCRIPT_RESULT_CHARS)}")
    head = lines[:1] if lines and lines[0].startswith("[user] " + SUMMARY_HEADER) else []
    body = lines[len(head):]
    size = sum(len(x) + 1 for x in head)
    kept: list[str] = []
    for line in reversed(body):
        if size + len(line) + 1 > max_chars:
            kept.append("[... earlier messages left out ...]")
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(head + kept[::-1])


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more]"


def summary_request(model: str, messages: Sequence[Message], max_chars: int,
                    session: str = "") -> dict[str, Any]:
    """The Messages-API request asking `model` to summarise `messages`."""
    text = (f"<transcript>\n{transcript(messages, max_chars)}\n</transcript>\n\n"
            "Write the summary now.")
    request: dict[str, Any] = {
        "model": model, "max_tokens": SUMMARY_MAX_TOKENS, "temperature": 0.0,
        "system": [{"type": "text", "text": SUMMARY_SYSTEM}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
    }
    if session:
        request["metadata"] = {"user_id": session}
    return request


def is_summary_request(request: Mapping[str, Any]) -> bool:
    """Whether `request` is a compaction's summary request."""
    system = request.get("system")
    first = system[0].get("text", "") if isinstance(system, list) and system \
        and isinstance(system[0], Mapping) else system
    return isinstance(first, str) and first.startswith(SUMMARY_MARK)


def summary_of(reply: Mapping[str, Any]) -> str:
    """The summary a reply to `summary_request` gives ("" if none)."""
    text = "\n".join(str(b.get("text", "")) for b in blocks(dict(reply))
                     if b.get("type") == "text").strip()
    return _cut(text, MAX_SUMMARY_CHARS)


def too_long(error: str, message: str, status: int = 0) -> bool:
    """Whether a failed model call failed because its request was too large: the API's
    400 "prompt is too long", a 413, or a request over the bus's frame limit."""
    text = message.lower()
    # "oversize" is also a *reply* over the frame ("the llm_result reply cannot be
    # sent", `worker.unsendable`): the model's own answer, which a smaller request does
    # not shrink. Only the dispatcher's refusal of the job itself is the request's size.
    request_oversize = error == "oversize" and "cannot be sent to a worker" in text
    return (request_oversize or status == 413 or "request_too_large" in text
            or "prompt is too long" in text)


# -- the memo of one session ------------------------------------------------------------


class ContextMemo:
    """What a session's turn path remembers of its requests' sizes and view (runtime only,
    rebuilt after a restart from a full estimate).

    `messages` keeps the view's prefix as the same objects from one request to the next,
    so that the llm callers' history deltas (`deltas.TurnCache.llm_job`) stay small;
    `measure` counts from the last reply's usage plus what was added since.
    """

    __slots__ = ("_view", "_edge", "_prefix", "tokens", "at_len", "at_last", "at_view")

    def __init__(self) -> None:
        self._view: ContextView | None = None
        self._edge: Message | None = None
        self._prefix: list[Message] = []
        #: The size of the last request sent (its reply's usage once known), the
        #: history's length and last message then, and its view.
        self.tokens = 0
        self.at_len = 0
        self.at_last: Message | None = None
        self.at_view: ContextView | None = None

    def messages(self, history: list[Message], view: ContextView) -> list[Message]:
        """`view_messages(history, view)`, its prefix built once per view."""
        if view == EMPTY:
            return history
        end = max(view.cleared, view.summarised)
        if end > len(history):
            return view_messages(history, view)
        edge = history[end - 1] if end else None
        if self._view != view or self._edge is not edge:
            self._view, self._edge, self._prefix = view, edge, _prefix(history, view)
        return self._prefix + history[end:]

    def sent(self, history: Sequence[Message], view: ContextView, tokens: int) -> None:
        """A request of `tokens` (estimated or counted) goes out for `history` under `view`."""
        self.tokens, self.at_len, self.at_view = tokens, len(history), view
        self.at_last = history[-1] if history else None

    def replied(self, usage: Mapping[str, Any] | None) -> None:
        """The reply's usage gives the request's real size (input, cache writes, reads)."""
        if not isinstance(usage, Mapping):
            return
        get = usage.get  # (every turn: no generator)
        real = (int(get("input_tokens") or 0) + int(get("cache_creation_input_tokens") or 0)
                + int(get("cache_read_input_tokens") or 0))
        if real > 0:
            self.tokens = real

    def measure(self, history: Sequence[Message], view: ContextView,
                request: Mapping[str, Any]) -> int:
        """The size of `request` (built from `history` under `view`): the last request's
        plus the estimate of the messages added since, else a full estimate."""
        n = self.at_len
        if self.at_view != view or not self.tokens or not 0 < n <= len(history):
            return request_tokens(request)
        added = sum(message_tokens(m) for m in history[n:])
        if history[n - 1] is not self.at_last:  # the last message grew (said, results)
            added += message_tokens(history[n - 1])
        return self.tokens + added
