"""What a model reply means for the loop: a closed set of next steps.

    next_step(reply) -> FinalOutput | RunTools | Continue

and the plain data the loop passes around (tool calls, their outcomes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.core.history import Message, blocks


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One `tool_use` block of a reply."""

    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What running a tool call gave: output text, error flag, how long it took, the
    image blocks to send beside the text (an MCP tool's), and the machine it ran on
    ("": not said, as for the calls of an in-process run)."""

    output: str
    is_error: bool
    duration_ms: float = 0.0
    images: tuple[dict[str, Any], ...] = ()
    machine: str = ""
    #: What the tool meant for the user only: in `TOOL_END` (`for_user`), never in the
    #: history the model is sent.
    shown: str = ""


@dataclass(frozen=True, slots=True)
class FinalOutput:
    """The reply ends the run: its text and the stop reason to report."""

    text: str
    stop: str


@dataclass(frozen=True, slots=True)
class RunTools:
    """The reply asks for tools: run `calls`, append their results, go on."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Continue:
    """The model paused its turn (`pause_turn`): send the conversation back as it is."""

    reason: str


NextStep = FinalOutput | RunTools | Continue


def reply_text(message: Message) -> str:
    """The concatenated text blocks of a reply."""
    return "".join(b.get("text", "") for b in blocks(message) if b.get("type") == "text")


def tool_calls(message: Message) -> tuple[ToolCall, ...]:
    """The `tool_use` blocks of a reply, in order."""
    return tuple(
        ToolCall(b["id"], b["name"], b.get("input") or {})
        for b in blocks(message)
        if b.get("type") == "tool_use"
    )


def next_step(reply: Message) -> NextStep:
    """Decide what the loop does with `reply` (an assistant message with `stop_reason`)."""
    stop = reply.get("stop_reason") or "end_turn"
    if stop == "pause_turn":
        return Continue(stop)
    calls = tool_calls(reply)
    # A reply cut by max_tokens may hold a half-written tool_use: it is not run
    # (history sanitising drops it) and the run ends showing the stop reason.
    if calls and stop == "tool_use":
        return RunTools(calls)
    return FinalOutput(reply_text(reply), stop)


def stored_reply(reply: Message) -> Message:
    """The part of a reply that goes into history: role and content only."""
    return {"role": "assistant", "content": list(reply.get("content") or [])}


def results_message(calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome]) -> Message:
    """The user message answering `calls`, in their order, each with its tool_use id."""
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": _content(outcome),
                "is_error": outcome.is_error,
            }
            for call, outcome in zip(calls, outcomes, strict=True)
        ],
    }


def _content(outcome: ToolOutcome) -> str | list[dict[str, Any]]:
    """A tool_result's content: the text, or text and image blocks when it has images."""
    if not outcome.images:
        return outcome.output
    return [{"type": "text", "text": outcome.output}, *outcome.images]
