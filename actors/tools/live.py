"""Live tool output: what a running tool prints, batched and bounded per call.

The executor gives each call a `LiveOutput` (through `ToolContext.on_output`); what
it emits becomes `ToolOutput` messages, then `TOOL_OUTPUT` events. Text is batched
as the model's is (`actors/batching.py`: by time and size, a change of stream
flushing first, so the order holds). A call sends at most `MAX_CHARS` characters in
at most `MAX_BATCHES` batches: a viewer sees the start of a long output as it comes,
and a session's log grows by a bounded amount per call, whatever the command prints.
Past the bound, one batch marked `cut` says that the output goes on, and nothing
follows it: the call's result (`TOOL_END`) has its output as ever.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable

from actors.batching import FLUSH_INTERVAL_S, DeltaBatcher

#: Characters of live output one call sends at most ...
MAX_CHARS = 32 * 1024
#: ... in at most this many batches (a trickle of small writes is bounded too).
MAX_BATCHES = 1000
#: The streams a command's output comes on.
STREAMS = ("stdout", "stderr")

_UTF8 = codecs.getincrementaldecoder("utf-8")

#: (stream, text, cut): one batch for the viewers.
Emit = Callable[[str, str, bool], None]


def cut_note(max_chars: int, max_batches: int) -> str:
    """The text of the last batch of a call whose live output reached its bound."""
    return (f"\n[live output stops here (over {max_chars} characters or {max_batches} "
            "batches): the command goes on, and its result shows how it ended]\n")


class LiveOutput:
    """One call's live output: `feed` it the command's chunks, `close` it at the end."""

    def __init__(self, emit: Emit, interval_s: float = FLUSH_INTERVAL_S, *,
                 max_chars: int = MAX_CHARS, max_batches: int = MAX_BATCHES) -> None:
        self._emit = emit
        self.max_chars = max_chars
        self.max_batches = max_batches
        self._batcher = DeltaBatcher(self._send, interval_s)
        #: One decoder per stream: a character split between two reads stays whole
        #: (made at the stream's first chunk: most calls print nothing).
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self.chars = 0
        self.batches = 0
        #: The bound was reached: the marker went, nothing more goes.
        self.cut = False

    def feed(self, stream: str, chunk: bytes) -> None:
        """Take a chunk the command printed on `stream` ("stdout" or "stderr")."""
        if self.cut or stream not in STREAMS:
            return
        decoder = self._decoders.get(stream)
        if decoder is None:
            decoder = self._decoders[stream] = _UTF8("replace")
        text = decoder.decode(chunk)
        room = self.max_chars - self.chars
        if len(text) > room:
            self._batcher.add(stream, text[:room])
            self.chars = self.max_chars
            self._stop(stream)
            return
        self.chars += len(text)
        self._batcher.add(stream, text)

    def close(self) -> None:
        """The call is over: send what waits (a last partial character replaced)."""
        for name in STREAMS:
            decoder = self._decoders.get(name)
            if decoder is not None and not self.cut:
                self._batcher.add(name, decoder.decode(b"", final=True))
        self._batcher.flush()

    def _send(self, stream: str, text: str) -> None:
        if self.cut:
            return
        self._emit(stream, text, False)
        self.batches += 1
        if self.batches >= self.max_batches:
            self._stop(stream)

    def _stop(self, stream: str) -> None:
        """Send what waits, then the marker; nothing after it."""
        self._batcher.flush()
        if not self.cut:
            self.cut = True
            self._batcher.discard()
            self._emit(stream, cut_note(self.max_chars, self.max_batches), True)


class HostBound:
    """The host's own bound on one call's live output: an executor on a worker machine
    may be anyone's code, so the supervisor counts again what it turns into events.

    `admit` gives what to emit for a batch ((text, cut), or None: nothing more of
    this call); past the bound, one marker of the host's own ends the call's output.
    """

    def __init__(self, max_chars: int = MAX_CHARS, max_batches: int = MAX_BATCHES) -> None:
        self.max_chars = max_chars
        self.max_batches = max_batches
        self.chars = 0
        self.batches = 0
        self.over = False

    def admit(self, stream: str, text: str, cut: bool) -> tuple[str, bool] | None:
        """What of this batch goes out as an event, if anything."""
        if self.over or stream not in STREAMS:
            return None
        self.chars += len(text)
        self.batches += 1
        if cut or self.chars > self.max_chars or self.batches > self.max_batches:
            self.over = True
            note = cut_note(self.max_chars, self.max_batches)  # (once, at the bound)
            return (text if cut and len(text) <= len(note) else note), True
        return text, False
