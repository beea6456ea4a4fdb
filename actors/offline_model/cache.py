"""Prompt caching as the API reports it: which input tokens were written to the
cache, read from it, or neither.

The real API caches the prefix of a request (tools, then system, then
messages) up to each `cache_control` breakpoint; a later request that starts
with a cached prefix reads it (`cache_read_input_tokens`, cheap), the part up
to its last breakpoint that was not cached is written (`cache_creation_input_
tokens`, dearer) and the rest is plain input (`input_tokens`). The offline model
plays this with a bounded memory of prefixes it has seen, so that usage — and
the cost oploop derives from it — behaves as it would against the API. Not
played: the API's minimum cacheable length and the 5-minute expiry (an entry
here lives until newer ones push it out).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from actors.digests import blake2b
from actors.offline_model.wire import prompt_too_long, value_tokens

#: Prefixes remembered (digests, ~100 bytes each).
MAX_ENTRIES = 4096


def prompt_blocks(request: Mapping[str, Any]) -> Iterator[Any]:
    """The request's cacheable parts in the API's prefix order: tools, system, messages'
    blocks (a string system prompt or message content is one block)."""
    yield from request.get("tools") or ()
    system = request.get("system")
    if isinstance(system, list):
        yield from system
    elif system:
        yield system
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            yield from content
        elif content:
            yield content


class PromptTooLong(Exception):
    """A request over the model's context window (the API answers 400)."""

    def __init__(self, tokens: int, window: int) -> None:
        super().__init__(prompt_too_long(tokens, window))
        self.tokens, self.window = tokens, window


def prompt_size(request: Mapping[str, Any]) -> int:
    """A request's input tokens as `PromptCache.usage` counts them (nothing cached)."""
    return sum(value_tokens(
        {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, Mapping) else b,
        sort_keys=True) for b in prompt_blocks(request))


class PromptCache:
    """The prefixes this server has cached, newest last (bounded)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def usage(self, request: Mapping[str, Any],
              window: int = 0) -> tuple[int, int, int]:
        """(input, cache write, cache read) tokens of `request`; its breakpoints'
        prefixes are cached from now on. `PromptTooLong` (and nothing cached) if it is
        over `window` tokens (0: no limit)."""
        digest = blake2b(digest_size=16)
        total = 0
        prefixes: list[tuple[int, bytes]] = []  # (tokens so far, digest) after each block
        marks: list[int] = []  # indexes of the blocks with a breakpoint
        for block in prompt_blocks(request):
            if isinstance(block, Mapping) and block.get("cache_control"):
                marks.append(len(prefixes))
                # The marker is no part of the content: it moves from turn to turn.
                block = {k: v for k, v in block.items() if k != "cache_control"}
            text = json.dumps(block, sort_keys=True)
            digest.update(text.encode())
            total += value_tokens(block, sort_keys=True)  # (an image: what the API counts)
            prefixes.append((total, digest.copy().digest()))
        if window and total > window:
            raise PromptTooLong(total, window)
        if not marks:
            return max(1, total), 0, 0
        # A hit may be at any block boundary up to the last breakpoint (the API looks
        # back from each breakpoint for the longest cached prefix).
        cacheable = prefixes[:marks[-1] + 1]
        read = max((n for n, key in cacheable if key in self._seen), default=0)
        written = cacheable[-1][0] - read
        for i in marks:
            self._remember(prefixes[i][1])
        return total - read - written, written, read

    def _remember(self, key: bytes) -> None:
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
