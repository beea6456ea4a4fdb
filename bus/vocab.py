"""The words of a run on the wire, defined once: event types, the terminal set, cancel
modes.

`StrEnum`s, so a member is its string on the wire (msgpack packs `EventType.DONE` as
"DONE", and `"DONE" == EventType.DONE`): every module of `actors/` and `bench/`
imports these instead of spelling the strings again.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CANCEL_MODES", "TERMINAL", "CancelMode", "EventType"]


class EventType(StrEnum):
    """The `Event.type` of a session event (DESIGN.md §4)."""

    SESSION_START = "SESSION_START"
    ROUTE = "ROUTE"
    TURN_START = "TURN_START"
    TOKEN = "TOKEN"
    THINKING = "THINKING"
    RETRY = "RETRY"
    TOOL_START = "TOOL_START"
    TOOL_OUTPUT = "TOOL_OUTPUT"
    TOOL_END = "TOOL_END"
    #: A tool call in flight reported progress: `{call_id, progress, total, message}`.
    TOOL_PROGRESS = "TOOL_PROGRESS"
    TURN_END = "TURN_END"
    USER_MESSAGE = "USER_MESSAGE"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_DECIDED = "APPROVAL_DECIDED"
    ELICITATION_REQUESTED = "ELICITATION_REQUESTED"
    ELICITATION_ANSWERED = "ELICITATION_ANSWERED"
    SAMPLING = "SAMPLING"
    MACHINE_EVENT = "MACHINE_EVENT"
    #: The requests' view of the history was compacted (`actors/core/context.py`).
    COMPACTED = "COMPACTED"
    RESUMED = "RESUMED"
    #: The shared store cannot be written: the session waits (`{error, since}`;
    #: `actors/supervisor/outage.py`). Logged, and published, once the store is back.
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    #: The store is back and the session goes on (`{since, down_s}`).
    STORE_AVAILABLE = "STORE_AVAILABLE"
    DONE = "DONE"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"


#: The events that end a run: exactly one per run, and nothing of the run after it.
TERMINAL: frozenset[str] = frozenset({EventType.DONE, EventType.ERROR, EventType.CANCELLED})


class CancelMode(StrEnum):
    """How a run is cancelled (`Cancel.mode`, `CANCELLED.data["mode"]`)."""

    #: End the run now (a user's cancel, or a run's task cancelled from outside).
    UI = "ui"
    #: End it at the next boundary (a turn's start, before a reply's tools run).
    OPERATION = "operation"
    #: The run's deadline passed: end it now (never asked for on the wire).
    DEADLINE = "deadline"


#: The modes a client may ask for (`Cancel.mode`, `oploop cancel --mode`).
#: (Plain strings: argparse and error messages show them by `repr`.)
CANCEL_MODES: tuple[str, ...] = (CancelMode.UI.value, CancelMode.OPERATION.value)
