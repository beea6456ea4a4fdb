"""What a run needs from the world (`LoopIO`), and how a model call fails for good.

Apart from the driver so that the steps it calls (compaction's, for one) can name
the world they work in without importing the driver that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from actors.config import Config
from actors.core.history import Message
from actors.core.inputs import Delta, Retry
from actors.core.session import Session
from actors.core.turn import ToolCall, ToolOutcome

#: What a model call reports while it runs: `Delta` (a streamed batch) or `Retry`.
Progress = Callable[[Delta | Retry], None]


#: Publishes one event of a session: (session, type, turn, data), as `LoopIO.emit`.
EventSink = Callable[[Session, str, int, dict[str, Any]], None]


class ModelError(Exception):
    """The model call failed for good (retries spent, or a final API error)."""

    def __init__(self, error: str, message: str, status: int = 0) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message
        self.status = status


class LoopIO(Protocol):
    """What a run needs from the world."""

    #: Model aliases, hidden tool sets and the router's settings.
    config: Config

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Publish one event of `session` (the implementation stamps `seq`)."""
        ...

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Progress, route: bool = False,
                         compact: bool = False) -> Message:
        """The model's reply to `request`, reporting streamed text and retries to
        `progress` as they happen; raises `ModelError`. `route`: the intent router's
        call, tried at most `[router] attempts` times within `timeout_s`. `compact`: a
        compaction's summary call (not the session's history: sent whole, no events)."""
        ...

    async def count_tokens(self, session: Session, request: dict[str, Any]) -> int | None:
        """The request's input tokens as the model's server counts them (the Messages
        API's `count_tokens`), or None where that cannot be had."""
        ...

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        """Run one tool call; failures are outcomes with `is_error`."""
        ...

    async def adopt_tool(self, session: Session, call: ToolCall, *,
                         timeout_s: float) -> ToolOutcome:
        """The outcome of a call started before a restart (`Resume.adopt`), if the
        executor still running it reports it in time; else "interrupted" (never run
        again). `timeout_s`: the call's own bound."""
        ...

    def tool_catalogue(self, machine: str) -> list[dict[str, Any]]:
        """The tool specs (wire dicts) offered now to a session whose calls run on
        `machine` (`tool_machine`)."""
        ...

    def tool_machine(self, session: Session, tool: str = "") -> str:
        """The machine `session`'s call of `tool` runs on, as `TOOL_START` names it ("":
        not said)."""
        ...
