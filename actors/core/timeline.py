"""When a session ran, and what it was about: the fold of its events' times.

What the sessions list shows beside the tokens (`usage.Meter`): a title (the first
prompt, cut), when the current or last run started, when the last one ended, and
how long the finished runs took together. Applied to each event as it is stamped
live (`Session.stamp`) and as the log folds it back (`supervisor/fold.py`), with
the event's own `ts`, so the list reads the same after a restart without reading
any log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus.vocab import TERMINAL, EventType

__all__ = ["TITLE_CHARS", "Timeline", "title_of"]

#: Characters of the first prompt kept as the session's title.
TITLE_CHARS = 120

#: (Bound once: a member looked up on its enum costs ~0.5 µs in Python 3.11.)
_SESSION_START = EventType.SESSION_START


def title_of(prompt: Any) -> str:
    """A prompt as a one-line title: whitespace folded, cut to `TITLE_CHARS` with "…"."""
    if not isinstance(prompt, str):
        return ""
    line = " ".join(prompt.split())
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1] + "…"


@dataclass
class Timeline:
    """A session's times: the title, the current (or last) run's start, the last
    run's end (0: none ended yet), and the summed duration of its finished runs."""

    title: str = ""
    run_started: float = 0.0
    ended: float = 0.0
    busy_s: float = 0.0

    def apply(self, type_: str, data: Mapping[str, Any], ts: float) -> None:
        """Count one event of the session, sent at `ts`."""
        if type_ == _SESSION_START:
            if not self.title:
                self.title = title_of(data.get("prompt"))
            self.run_started = ts
        elif type_ in TERMINAL:
            if self.run_started and ts >= self.run_started:
                self.busy_s += ts - self.run_started
            self.ended = ts

    def to_state(self) -> list[Any]:
        """What a snapshot keeps."""
        return [self.title, self.run_started, self.ended, self.busy_s]

    @classmethod
    def from_state(cls, raw: Any) -> Timeline:
        """The timeline a `to_state` describes (anything else: an empty one)."""
        if not isinstance(raw, list | tuple) or len(raw) != 4:
            return cls()
        title, started, ended, busy = raw
        try:
            return cls(str(title), float(started), float(ended), float(busy))
        except (TypeError, ValueError):
            return cls()
