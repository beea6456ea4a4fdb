"""Bounds on what enters a session's history from outside the built-in tools.

The built-ins bound their own output (`read_file` 256 KiB, `shell` 64 KiB, `list_dir`
1,000 entries, each with a note saying how much was cut). What other sources bring
is bounded here, the same way, where it enters:

- an MCP tool's result (`actors/mcp/results.py`): its text to `max_result_chars`, its
  images by `actors/images.py` (checked on the executor too, so an oversize image
  never makes the reply frame oversize);
- an `ask_machine` answer (`actors/ask/asker.py`): to `max_result_chars`;
- any tool's result, as the host takes it from an executor (`cut_result`, in the
  supervisor, beside its check of the images): to `max_result_chars` and the room of
  the tools' own notes, whatever the executor's machine configured;
- a deny reason (the supervisor's `decide`): to `MAX_REASON_CHARS`;
- the MCP tool catalogue (`actors/mcp/hub.py`): at most `max_tools` tools, each
  description cut to `max_tool_description_chars`, a tool whose input schema is
  longer than `max_tool_schema_chars` (as JSON) left out (a cut schema is no schema);
- a prompt or a said message is refused over `limits.max_prompt_chars` (not cut);
- what an executor announces, on the host (`fit_catalogue`): `MAX_CATALOGUE_BYTES`.

Each figure is a `[limits]` key of oploop.toml (`actors.config.Limits`, whose defaults
are the constants below). What they bound together may still outgrow the bus: a
request is a single frame (`bus.codec.MAX_FRAME_BYTES`), and a history of many large
results (images: up to 10 MB each) passes it. `fit_messages` is the last resort
where a request is built: the oldest tool results, then the oldest long texts and
images, are replaced by a line saying so until the request fits; the history of
record keeps them. (Context compaction will do this properly.)

Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

from bus.limits import MAX_FRAME_BYTES

#: Characters of an MCP result's text or an `ask_machine` answer (read_file's 256 KiB).
MAX_RESULT_CHARS = 256 * 1024
#: MCP tools one executor offers (OpenAI's API takes 128; a model chooses badly from more).
MAX_TOOLS = 200
#: Characters of one MCP tool's description.
MAX_TOOL_DESCRIPTION_CHARS = 2048
#: Characters of one MCP tool's input schema, as compact JSON.
MAX_TOOL_SCHEMA_CHARS = 16 * 1024
#: Characters of a deny reason (it is copied into events and a tool result).
MAX_REASON_CHARS = 2000
#: Bytes a request may take on the bus (`size_of`): the frame limit with
#: room for the envelope and the job's other fields.
MAX_REQUEST_BYTES = MAX_FRAME_BYTES - 512 * 1024
#: Bytes of tool definitions the host takes from one executor, whatever it announces (a
#: quarter of a frame: 200 tools of the default bounds are 3.7 MB at most).
MAX_CATALOGUE_BYTES = MAX_FRAME_BYTES // 4
#: Characters a tool's own notes may add to a result past `max_result_chars` (`cut_result`).
NOTE_ROOM = 1024
#: Images a request may carry (the Messages API's limit, all turns included).
MAX_REQUEST_IMAGES = 100
#: A text block shorter than this is never replaced by `fit_messages` (it would not help).
_SMALL = 1024


def cut_text(text: str, limit: int, what: str = "chars") -> str:
    """`text` with at most `limit` characters kept, its head and tail, and a line in
    between saying how many were cut (as `shell` keeps its output)."""
    if len(text) <= limit:
        return text
    keep = max(0, limit)
    head, tail = text[:keep // 2], text[len(text) - (keep - keep // 2):]
    return f"{head}\n[truncated: {len(text) - len(head) - len(tail)} {what} omitted]\n{tail}"


def cut_result(text: str, limit: int) -> str:
    """A tool result's text as the host takes it from any executor (a worker machine's
    may have other limits, or none): cut beyond `limit` and the room the tools' own
    notes take (`read_file`'s 256 KiB and its `[truncated: ...]` line pass whole)."""
    return cut_text(text, limit + NOTE_ROOM)


def cut_line(text: str, limit: int) -> str:
    """`text` cut to its first `limit` characters and a note of how many more there were
    (a reason, a description: what comes first says the most)."""
    if len(text) <= limit:
        return text
    return f"{text[:max(0, limit)]}… [{len(text) - max(0, limit)} chars cut]"


def cut_reason(reason: str) -> str:
    """A deny (or other) reason as it enters events and a tool result."""
    return cut_line(reason, MAX_REASON_CHARS)


def schema_chars(schema: Any) -> int:
    """The length of `schema` as compact JSON (what bounds an input schema)."""
    try:
        return len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return 1 << 62  # not JSON at all: never within a bound


def fit_catalogue(specs: list[dict[str, Any]], max_bytes: int = MAX_CATALOGUE_BYTES
                  ) -> tuple[list[dict[str, Any]], int]:
    """The first tool specs of `specs` that fit in `max_bytes` together, and how many
    were left out: the host's own bound on an executor's catalogue (one of a worker
    machine may have other limits, or an older version none)."""
    total = 0
    for n, spec in enumerate(specs):
        total += size_of(spec)
        if total > max_bytes:
            return specs[:n], len(specs) - n
    return specs, 0


# -- the last resort: a request that fits the bus ---------------------------------------


_packer = msgpack.Packer(use_bin_type=True)


def pack(value: Any) -> bytes:
    """`msgpack.packb(value, use_bin_type=True)` with a packer made once (`packb` makes
    one, with its buffer, at every call: the supervisor packs several values a turn).
    Raises what `packb` raises."""
    try:
        packed: bytes = _packer.pack(value)
    except BaseException:
        _packer.reset()
        raise
    return packed


def size_of(value: Any) -> int:
    """`value`'s msgpack size in bytes (packed in C: ~0.4 ms for a history of 400
    messages here); an upper estimate for what msgpack cannot pack (`estimate`)."""
    try:
        return len(pack(value))
    except (TypeError, ValueError, OverflowError, RecursionError):
        return estimate(value)


def estimate(value: Any) -> int:
    """An upper estimate of `value`'s msgpack size in bytes (strings as UTF-8, a few
    bytes of header per item); iterative, so deep nesting costs no recursion."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += 5 + (len(item) if item.isascii()
                          else len(item.encode("utf-8", "surrogatepass")))
        elif isinstance(item, dict):
            total += 5
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 5
            stack.extend(item)
        elif isinstance(item, bytes | bytearray):
            total += 5 + len(item)
        else:
            total += 9
    return total


def fit_messages(messages: list[dict[str, Any]], budget: int,
                 max_images: int = MAX_REQUEST_IMAGES,
                 known: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """`messages` as sent: at most `max_images` images (the latest), and their size
    (`size_of`) within `budget` bytes if it can be: first the oldest tool results
    are replaced by a line saying how large they were, then the oldest long texts and
    images of any message. Every message and tool_use/tool_result pair stays; only
    contents change, in new dicts (the list given, and the history it came from, are
    not touched). Returned as is if it fits. `known`: `messages`' size and images
    (`MessageSizes`), when the caller has them."""
    if known is not None and known[1] <= max_images:
        size = known[0]
    else:
        messages = _fewer_images(messages, max_images)
        size = size_of(messages)
    if size <= budget:
        return messages
    out = list(messages)
    for replace in (_result_marker, _block_marker):
        for i, msg in enumerate(out):
            if size <= budget:
                return out
            content = msg.get("content")
            if not isinstance(content, list):
                continue
            new_content = list(content)
            for j, block in enumerate(content):
                if size <= budget:
                    break
                new = replace(block) if isinstance(block, dict) else None
                if new is not None:
                    size -= size_of(block) - size_of(new)
                    new_content[j] = new
            if new_content != content:
                out[i] = {**msg, "content": new_content}
    return out


class MessageSizes:
    """`size_of` and the images of a list of messages, measured once per message: a
    session's requests send the same message objects turn after turn (never edited in
    place), so each turn measures only what is new (by position and identity)."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        #: Per position: the message measured, and the packed size and images of the
        #: messages up to it (itself included).
        self._known: list[tuple[dict[str, Any], int, int]] = []

    def measure(self, messages: list[dict[str, Any]]) -> tuple[int, int] | None:
        """(`size_of(messages)`, their images), or None if one cannot be packed."""
        known = self._known
        same, most = 0, min(len(known), len(messages))
        while same < most and known[same][0] is messages[same]:
            same += 1
        del known[same:]
        size, images = known[-1][1:] if known else (0, 0)
        for message in messages[same:]:
            try:
                size += len(pack(message))
            except (TypeError, ValueError, OverflowError, RecursionError):
                return None  # (`size_of` estimates the whole list then)
            images += _count_images([message])
            known.append((message, size, images))
        # A msgpack array is its header and its items' packings one after the other.
        count = len(messages)
        return size + (1 if count < 16 else 3 if count < 1 << 16 else 5), images


def _fewer_images(messages: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """`messages` with their oldest images past the latest `keep` replaced by a line."""
    extra = _count_images(messages) - keep
    if extra <= 0:
        return messages
    out = list(messages)
    for i, msg in enumerate(out):
        content = msg.get("content")
        if extra <= 0:
            break
        if isinstance(content, list):
            new, extra = _without_images(content, extra)
            if new is not content:
                out[i] = {**msg, "content": new}
    return out


def _count_images(blocks: list[Any]) -> int:
    n = 0
    for item in blocks:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(item, dict) and item.get("type") == "image":
            n += 1
        elif isinstance(content, list):  # a message, or a tool_result with images
            n += _count_images(content)
    return n


def _without_images(content: list[Any], extra: int) -> tuple[list[Any], int]:
    """`content` with its first `extra` images (tool results' included) replaced (the
    same list if none was), and how many are still to replace."""
    new = list(content)
    changed = False
    for j, block in enumerate(content):
        if extra <= 0:
            break
        if not isinstance(block, dict):
            continue
        if block.get("type") == "image":
            new[j] = {"type": "text", "text": "[an image left out of this request: a request "
                                              f"carries at most {MAX_REQUEST_IMAGES} images; "
                                              "the session's log keeps it]"}
            extra -= 1
            changed = True
        elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            inner, extra = _without_images(block["content"], extra)
            if inner is not block["content"]:
                new[j] = {**block, "content": inner}
                changed = True
    return (new if changed else content), extra


def _left_out(size: int) -> str:
    return (f"[{size} bytes left out of this request to fit the bus's frame limit; "
            "the session's log keeps them]")


def _result_marker(block: dict[str, Any]) -> dict[str, Any] | None:
    """A tool_result with its content replaced by a line (None: leave the block)."""
    if block.get("type") != "tool_result":
        return None
    size = size_of(block.get("content"))
    if size < _SMALL:
        return None
    return {**block, "content": _left_out(size)}


def _block_marker(block: dict[str, Any]) -> dict[str, Any] | None:
    """A long text or an image replaced by a text line (None: leave the block)."""
    kind = block.get("type")
    if kind not in ("text", "image"):
        return None
    size = size_of(block)
    if size < _SMALL:
        return None
    marker: dict[str, Any] = {"type": "text", "text": _left_out(size)}
    if "cache_control" in block:
        marker["cache_control"] = block["cache_control"]
    return marker

