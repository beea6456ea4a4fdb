"""What to send for one request, decided without I/O: a list of actions.

The server only executes plans (`Head`, `Event`, `Body`, `Sleep`, `Stall`,
`Drop`, `End`); every choice — rules or script, JSON or SSE, where a fault
strikes — is made here, so it is testable without sockets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.offline_model import rules
from actors.offline_model.scenario import StatusFault, StreamFault, Turn
from actors.offline_model.wire import (
    Reply,
    count_tokens,
    error_body,
    error_type_for,
    input_tokens,
    message_json,
    stream_events,
)
from actors.usage import OFFLINE_MODEL

Headers = tuple[tuple[str, str], ...]

_SSE_HEADERS: Headers = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
    # h11 frames the body in chunks when it is told so and given no length
    ("transfer-encoding", "chunked"),
)

# A non-streaming request meets an `error_event` fault as the status the
# API would have used for that error.
_STATUS_FOR_ERROR = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}


@dataclass(frozen=True)
class Head:
    """Send the status line and headers."""

    status: int
    headers: Headers


@dataclass(frozen=True)
class Body:
    """Send bytes of the body."""

    data: bytes


@dataclass(frozen=True)
class Event:
    """Send one SSE event."""

    name: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Sleep:
    """Wait before the next action (pacing deltas, delaying a reply)."""

    seconds: float


@dataclass(frozen=True)
class Stall:
    """Send nothing but (optionally) `ping` events for `seconds`."""

    seconds: float
    ping_every_s: float | None


@dataclass(frozen=True)
class Drop:
    """Close the connection now, the response unfinished (no final chunk)."""


@dataclass(frozen=True)
class End:
    """Finish the response cleanly (the terminating chunk, when chunked)."""


Action = Head | Body | Event | Sleep | Stall | Drop | End


def plan_error(
    status: int, error: Mapping[str, Any], request_id: str, headers: Headers = ()
) -> list[Action]:
    """An HTTP error response carrying the API's error JSON around `error`."""
    body = {**error_body("", "", request_id), "error": dict(error)}
    data = json.dumps(body).encode()
    head = (
        ("content-type", "application/json"),
        ("request-id", request_id),
        ("content-length", str(len(data))),
        *headers,
    )
    return [Head(status, head), Body(data), End()]


def plan_document(payload: Mapping[str, Any]) -> list[Action]:
    """A 200 JSON response that is not a Messages-API answer (the stats page)."""
    data = json.dumps(payload).encode()
    head = (("content-type", "application/json"), ("content-length", str(len(data))))
    return [Head(200, head), Body(data), End()]


def api_error(status: int, message: str) -> dict[str, str]:
    """The `error` object for a status: `{"type": <the API's type>, "message"}`."""
    return {"type": error_type_for(status), "message": message}


def scripted_reply(turn: Turn, request: Mapping[str, Any]) -> Reply:
    """The reply a turn says, or the rules' reply when it leaves that open."""
    if turn.content is None:
        return rules.respond(request)
    words = sum(
        count_tokens(b.get("text", "") or b.get("thinking", "") or json.dumps(b.get("input", {})))
        for b in turn.content
    )
    return Reply(turn.content, turn.stop_reason, max(1, words))


def plan_response(
    request: Mapping[str, Any],
    turn: Turn | None,
    *,
    message_id: str,
    request_id: str,
    delta_delay_s: float = 0.0,
    prompt: tuple[int, int, int] | None = None,
) -> list[Action]:
    """Everything to send for a valid request, given its scripted turn (None = rules);
    `prompt`: its (input, cache write, cache read) tokens (`cache.PromptCache`), else
    all input, none cached."""
    turn = turn or Turn()
    if isinstance(turn.fault, StatusFault):
        fault = turn.fault
        return plan_error(fault.status, fault.error, request_id, fault.headers)
    reply = scripted_reply(turn, request)
    fresh, written, read = prompt or (input_tokens(request), 0, 0)
    # The rules answer as themselves, whatever model was asked for: the run's costs say
    # `offline` ($0.00), never the name of a model that did not answer. A scenario's
    # scripted turn plays the model asked for (tests of pricing, of a model's replies).
    model = OFFLINE_MODEL if turn.content is None else str(request["model"])
    message = message_json(reply, model=model, message_id=message_id,
                           in_tokens=fresh, cache_write=written, cache_read=read)
    if isinstance(turn.fault, StreamFault) and turn.fault.what == "tool_input_not_object":
        message = {**message, "content": [
            {**b, "input": [1, 2]} if b.get("type") == "tool_use" else b
            for b in message["content"]]}
    if request.get("stream"):
        delay = delta_delay_s if turn.delay_s is None else turn.delay_s
        return plan_stream(message, turn.fault, request_id, delay)
    return plan_json(message, turn.fault, request_id)


def plan_json(message: dict[str, Any], fault: StreamFault | None, request_id: str) -> list[Action]:
    """A non-streaming reply; a stream fault becomes its nearest non-streaming kin."""
    before: list[Action] = []
    if fault is not None:
        if fault.kind == "drop":
            return [Drop()]
        if fault.kind == "stall":
            before = [Sleep(fault.seconds)]
            if fault.then == "drop":
                return [*before, Drop()]
        elif fault.kind == "malformed" and fault.what in ("bad_json", "orphan_delta"):
            # not streaming: a body that is not the JSON it claims to be
            data = b'{"id": "msg_bad", "type": "message", "content": [{'
            head = (("content-type", "application/json"), ("request-id", request_id),
                    ("content-length", str(len(data))))
            return [Head(200, head), Body(data), End()]
        elif fault.kind == "truncate":
            message = {**message, "stop_reason": None}
        elif fault.kind == "error_event":
            error = fault.error or {"type": "overloaded_error", "message": "Overloaded"}
            status = _STATUS_FOR_ERROR.get(str(error.get("type")), 500)
            return plan_error(status, error, request_id)
    data = json.dumps(message).encode()
    head = (
        ("content-type", "application/json"),
        ("request-id", request_id),
        ("content-length", str(len(data))),
    )
    return [*before, Head(200, head), Body(data), End()]


def _fault_index(fault: StreamFault, events: list[tuple[str, dict[str, Any]]]) -> int:
    """The number of events sent before the fault strikes."""
    if fault.after_events is None:  # truncate's default: just before message_delta
        return next(i for i, (name, _) in enumerate(events) if name == "message_delta")
    if fault.kind in ("truncate", "error_event"):
        # both end the body cleanly, and always before message_stop
        return min(fault.after_events, len(events) - 1)
    return min(fault.after_events, len(events))


# What a `malformed` fault splices into a stream (the stream goes on after it):
# a client must fail the attempt on each, except the unknown event, which it ignores.
_MALFORMED_ACTIONS: dict[str, list[Action]] = {
    "bad_json": [Body(b'event: content_block_delta\ndata: {"type": "content_block_delta", '
                      b'"index": 0, "delta": {\n\n')],
    "unknown_event": [Event("mystery_event", {"type": "mystery_event", "detail": "new"})],
    "orphan_delta": [Event("content_block_delta", {
        "type": "content_block_delta", "index": 99,
        "delta": {"type": "text_delta", "text": "for a block never started"}})],
    # the message itself carries the fault (`plan_response`): nothing to splice
    "tool_input_not_object": [],
}


def _fault_actions(fault: StreamFault) -> tuple[list[Action], bool]:
    """What a fault sends, and whether the stream goes on after it."""
    if fault.kind == "drop":
        return [Drop()], False
    if fault.kind == "stall":
        stall: list[Action] = [Stall(fault.seconds, fault.ping_every_s)]
        return (stall + [Drop()], False) if fault.then == "drop" else (stall, True)
    if fault.kind == "truncate":
        return [End()], False
    if fault.kind == "malformed":
        return _MALFORMED_ACTIONS.get(fault.what, []), True
    error = fault.error or {"type": "overloaded_error", "message": "Overloaded"}
    return [Event("error", {"type": "error", "error": error}), End()], False


def plan_stream(
    message: dict[str, Any], fault: StreamFault | None, request_id: str, delay_s: float = 0.0
) -> list[Action]:
    """An SSE reply: the API's event sequence, paced by `delay_s`, with the fault spliced in."""
    events = stream_events(message)
    strike = _fault_index(fault, events) if fault else -1
    actions: list[Action] = [Head(200, (*_SSE_HEADERS, ("request-id", request_id)))]
    if fault is not None and fault.before_headers:  # nothing at all, not even headers
        strike = -1
        actions.insert(0, Stall(fault.seconds, None))
        if fault.then == "drop":
            return [actions[0], Drop()]
    for i, (name, data) in enumerate(events):
        if i == strike and fault is not None:
            extra, goes_on = _fault_actions(fault)
            actions += extra
            if not goes_on:
                return actions
        if delay_s > 0 and name == "content_block_delta":
            actions.append(Sleep(delay_s))
        actions.append(Event(name, data))
    if strike == len(events) and fault is not None:  # a fault after the last event
        extra, goes_on = _fault_actions(fault)
        actions += extra
        if not goes_on:
            return actions
    actions.append(End())
    return actions
