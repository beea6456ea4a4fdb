"""A request's JSON body with each history message encoded once, not at every call.

The SDK encodes the whole request at every call (its JSON encoder, after a deep
copy of the request): at turn 200 of a session whose tool results are 20 KB, ~4 MB
a call, ~27 ms of the llm caller's CPU on these machines (a 4 MB `json.dumps` alone
takes 17-21 ms here). A session's history only grows and its messages are never
edited in place (a delta's messages are decoded once and then held as the same
objects: `histories.HistoryCache`), so each message's JSON is kept, by identity,
and a call encodes only the messages new since the last one, then joins the rest.

What the server receives is the request as built (every field, as `split_known`
sends the SDK's unknown fields through `extra_body`), compact, with `stream`;
the SDK still sends it (its headers, auth, timeouts, response and stream parsing).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

#: Bytes of encoded messages kept (the least recently sent go first): the JSON of
#: about eight 200-turn sessions of 20 KB results. What it holds is freed only as
#: newer messages take its place.
MAX_BYTES = 32 << 20

# The SDK's own encoding (`json`, ASCII-escaped, NaN refused by the supervisor long
# before), without the spaces.
_encode = json.JSONEncoder(separators=(",", ":")).encode


class BodyCache:
    """Encoded messages by identity, and request bodies made of them."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        #: id(message) -> (message, its JSON): the message is held, so its id is not
        #: reused while its entry lives.
        self._parts: OrderedDict[int, tuple[Any, bytes]] = OrderedDict()
        self._bytes = 0
        #: Messages encoded so far (the rest of each body came from the cache).
        self.encoded = 0

    def body(self, request: dict[str, Any], **extra: Any) -> bytes:
        """`request` with `extra` as JSON bytes. Raises TypeError or ValueError on a
        value JSON cannot carry (as the SDK's encoder would)."""
        head = {k: v for k, v in request.items() if k != "messages"}
        head.update(extra)
        rest = _encode(head).encode()
        messages = request.get("messages")
        if not isinstance(messages, list):  # (absent or odd: encoded as it is)
            if messages is None:
                return rest
            return _encode({**head, "messages": messages}).encode()
        parts = b",".join([self._part(m) for m in messages])
        glue = b"," if len(rest) > 2 else b""
        return b"".join((rest[:-1], glue, b'"messages":[', parts, b"]}"))

    def _part(self, message: Any) -> bytes:
        key = id(message)
        held = self._parts.get(key)
        if held is not None:  # (the same object: the entry holds it, its id is not free)
            self._parts.move_to_end(key)
            return held[1]
        data = _encode(message).encode()
        self.encoded += 1
        self._parts[key] = (message, data)
        self._bytes += len(data)
        while self._bytes > self.max_bytes and len(self._parts) > 1:
            _, (_, old) = self._parts.popitem(last=False)
            self._bytes -= len(old)
        return data

    def drop(self, messages: list[Any]) -> None:
        """Forget the JSON of `messages` (their session's history was dropped: they will
        not be sent again), instead of holding them until newer ones push them out."""
        parts = self._parts
        for message in messages:
            held = parts.get(id(message))
            if held is not None and held[0] is message:
                del parts[id(message)]
                self._bytes -= len(held[1])

    def __len__(self) -> int:
        return len(self._parts)
