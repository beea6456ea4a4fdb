"""Scripted scenarios: turns played in order, per session, then the rules take over.

The file format is documented in the package docstring (`actors.offline_model`).
Loading checks everything up front and raises `ScenarioError` naming the turn
and field at fault, so a typo fails at start rather than mid-test.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.digests import sha256
from actors.offline_model.wire import STOP_REASONS, error_type_for

#: The key used when a request carries no `metadata.user_id`.
DEFAULT_SESSION = ""

STREAM_FAULTS = ("drop", "stall", "truncate", "error_event", "malformed")
#: What a `malformed` fault sends (the bad input a client must survive).
MALFORMED = ("bad_json", "unknown_event", "orphan_delta", "tool_input_not_object")
FAULTS = ("status", *STREAM_FAULTS)

_REPLY_KEYS = {"reply", "stop_reason", "delay_s"}
_FAULT_KEYS = {
    "status": {"fault", "status", "headers", "error"},
    "drop": {"fault", "after_events"} | _REPLY_KEYS,
    "stall": {"fault", "after_events", "seconds", "ping_every_s", "then", "before_headers"}
    | _REPLY_KEYS,
    "malformed": {"fault", "after_events", "what"} | _REPLY_KEYS,
    "truncate": {"fault", "after_events"} | _REPLY_KEYS,
    "error_event": {"fault", "after_events", "error"} | _REPLY_KEYS,
}
# The fields each scripted content block needs, and their types.
_BLOCK_FIELDS: dict[str, dict[str, type]] = {
    "text": {"text": str},
    "thinking": {"thinking": str},
    "tool_use": {"name": str, "input": dict},
}
# Where a mid-stream fault strikes by default: after message_start, ping and
# the first content_block_start, i.e. once the stream has visibly begun.
DEFAULT_AFTER_EVENTS = 3


class ScenarioError(ValueError):
    """A scenario that cannot be played; the message names the file, turn and field."""

    def __init__(self, source: str, where: str, problem: str) -> None:
        super().__init__(f"{source}: {where}: {problem}" if where else f"{source}: {problem}")
        self.source, self.where, self.problem = source, where, problem


@dataclass(frozen=True)
class StatusFault:
    """Answer with an HTTP error status, headers and the API's error JSON."""

    status: int
    headers: tuple[tuple[str, str], ...]
    error: dict[str, Any]


@dataclass(frozen=True)
class StreamFault:
    """Go wrong after `after_events` SSE events: drop, stall, truncate or error_event.

    `after_events` None (truncate only) means "just before `message_delta`".
    """

    kind: str
    after_events: int | None
    seconds: float = 0.0
    ping_every_s: float | None = None
    then: str = "continue"
    error: dict[str, Any] | None = None
    #: stall: before the response's headers (no pings possible), not after an event.
    before_headers: bool = False
    #: malformed: which bad input (one of `MALFORMED`).
    what: str = ""


@dataclass(frozen=True)
class Turn:
    """One scripted turn: what to say (`content` None = ask the rules), and any fault."""

    content: tuple[dict[str, Any], ...] | None = None
    stop_reason: str | None = None
    delay_s: float | None = None
    fault: StatusFault | StreamFault | None = None


class Scenario:
    """The turns of a scenario and, per session, how far each has played.

    Named `scripts` let one server play different turns to different sessions:
    a session whose first request's prompt contains `#name` plays `scripts[name]`
    instead of `turns`.
    """

    def __init__(self, turns: list[Turn], source: str = "<scenario>",
                 scripts: Mapping[str, list[Turn]] | None = None) -> None:
        self.turns = tuple(turns)
        self.source = source
        self.scripts = {name: tuple(t) for name, t in (scripts or {}).items()}
        self._cursors: dict[str, int] = {}
        self._chosen: dict[str, tuple[Turn, ...]] = {}

    def next_turn(self, session: str = DEFAULT_SESSION, prompt: str = "") -> Turn | None:
        """The session's next turn (advancing its cursor), or None once it has run out.

        `prompt` (the request's first user text) picks a named script on the
        session's first request.
        """
        turns = self._chosen.get(session)
        if turns is None:
            turns = self._chosen[session] = self._script_for(prompt)
        at = self._cursors.get(session, 0)
        if at >= len(turns):
            return None
        self._cursors[session] = at + 1
        return turns[at]

    def _script_for(self, prompt: str) -> tuple[Turn, ...]:
        for name, turns in self.scripts.items():
            # A whole tag: "#s1" must not pick script "s1" for a prompt saying "#s13".
            if re.search(rf"#{re.escape(name)}(?![\w-])", prompt):
                return turns
        return self.turns

    def played(self, session: str = DEFAULT_SESSION) -> int:
        """How many turns a session has consumed."""
        return self._cursors.get(session, 0)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and check a scenario file; `ScenarioError` says what is wrong."""
    source = os.fspath(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(source, "", f"cannot read: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(source, "", f"not valid JSON: {exc}") from exc
    return parse_scenario(data, source)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Check scenario data (a list of turns, or `{"turns": [...]}`) and build a Scenario."""
    scripts: dict[str, list[Turn]] = {}
    if isinstance(data, Mapping):
        extra = set(data) - {"turns", "description", "scripts"}
        if extra:
            raise ScenarioError(source, "", f"unknown top-level keys {sorted(extra)}")
        raw_scripts = data.get("scripts", {})
        if not isinstance(raw_scripts, Mapping):
            raise ScenarioError(source, "scripts", "must map script names to lists of turns")
        for name, turns in raw_scripts.items():
            if not isinstance(turns, list) or not re.fullmatch(r"[\w-]+", str(name)):
                raise ScenarioError(source, f"scripts.{name}", "needs a word name and a list")
            scripts[name] = [_parse_turn(t, source, f"scripts.{name}[{i}]")
                             for i, t in enumerate(turns)]
        data = data.get("turns", [])
    if not isinstance(data, list):
        raise ScenarioError(source, "", 'expected a list of turns or {"turns": [...]}')
    turns = [_parse_turn(t, source, f"turns[{i}]") for i, t in enumerate(data)]
    return Scenario(turns, source, scripts)


def _number(raw: Mapping[str, Any], key: str, default: float, src: str, where: str) -> float:
    """A non-negative finite number field."""
    value = raw.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ScenarioError(src, f"{where}.{key}", f"must be a number >= 0, got {value!r}")
    return float(value)


def _parse_turn(raw: Any, src: str, where: str) -> Turn:
    if raw == "rules":
        return Turn()
    if not isinstance(raw, Mapping):
        raise ScenarioError(src, where, f'a turn is "rules" or an object, got {raw!r}')
    kind = raw.get("fault")
    if kind is None:
        if "reply" not in raw:
            raise ScenarioError(src, where, 'needs "reply" or "fault" (or be the string "rules")')
        _no_extra(raw, _REPLY_KEYS, src, where)
        return _parse_reply(raw, src, where, fault=None)
    if kind not in FAULTS:
        raise ScenarioError(
            src, f"{where}.fault", f"unknown fault {kind!r}, expected one of {FAULTS}"
        )
    _no_extra(raw, _FAULT_KEYS[kind], src, where)
    if kind == "status":
        return Turn(fault=_parse_status(raw, src, where))
    return _parse_reply(raw, src, where, fault=_parse_stream_fault(kind, raw, src, where))


def _no_extra(raw: Mapping[str, Any], allowed: set[str], src: str, where: str) -> None:
    extra = set(raw) - allowed
    if extra:
        raise ScenarioError(
            src, where, f"unknown keys {sorted(extra)} (allowed: {sorted(allowed)})"
        )


def _parse_reply(raw: Mapping[str, Any], src: str, where: str, fault: StreamFault | None) -> Turn:
    # None leaves the pace to the server's default (`delta_delay_s`)
    delay = _number(raw, "delay_s", 0.0, src, where) if "delay_s" in raw else None
    reply = raw.get("reply", "rules")
    stop = raw.get("stop_reason")
    if stop is not None and stop not in STOP_REASONS:
        raise ScenarioError(src, f"{where}.stop_reason", f"must be one of {sorted(STOP_REASONS)}")
    if reply == "rules":
        if stop is not None:
            raise ScenarioError(src, f"{where}.stop_reason", 'makes no sense with "reply": "rules"')
        return Turn(delay_s=delay, fault=fault)
    if isinstance(reply, str):
        reply = [{"type": "text", "text": reply}]
    if not isinstance(reply, list):
        raise ScenarioError(src, f"{where}.reply", 'must be a string, a list of blocks or "rules"')
    blocks = tuple(_parse_block(b, src, f"{where}.reply[{i}]") for i, b in enumerate(reply))
    if stop is None:
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return Turn(blocks, stop, delay, fault)


def _parse_block(raw: Any, src: str, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ScenarioError(src, where, f"a content block is an object, got {raw!r}")
    kind = raw.get("type")
    fields = _BLOCK_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise ScenarioError(
            src, f"{where}.type", f"must be text, thinking or tool_use, got {kind!r}"
        )
    for key, typ in fields.items():
        if not isinstance(raw.get(key), typ):
            raise ScenarioError(src, f"{where}.{key}", f"required, a {typ.__name__}")
    block = dict(raw)
    if kind == "thinking":
        block.setdefault("signature", "sig_" + sha256(raw["thinking"].encode()).hexdigest())
    if kind == "tool_use" and not isinstance(block.get("id"), str):
        # deterministic, so a replayed scenario produces the same history
        block["id"] = "toolu_" + sha256(where.encode()).hexdigest()[:24]
    return block


def _parse_status(raw: Mapping[str, Any], src: str, where: str) -> StatusFault:
    status = raw.get("status")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise ScenarioError(
            src, f"{where}.status", f"must be an HTTP error status 400-599, got {status!r}"
        )
    headers = raw.get("headers", {})
    if not isinstance(headers, Mapping):
        raise ScenarioError(src, f"{where}.headers", "must be an object of header: value")
    pairs = []
    for name, value in headers.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ScenarioError(
                src, f"{where}.headers.{name}", "a header value is a string or number"
            )
        pairs.append((str(name).lower(), str(value)))
    error = _parse_error(raw, src, where, default_type=error_type_for(status))
    return StatusFault(status, tuple(pairs), error)


def _parse_error(raw: Mapping[str, Any], src: str, where: str, default_type: str) -> dict[str, Any]:
    """The `error` object of the API's error JSON, defaults filled in."""
    error = raw.get("error", {})
    if not isinstance(error, Mapping):
        raise ScenarioError(src, f"{where}.error", 'must be an object like {"type", "message"}')
    error_type = error.get("type", default_type)
    message = error.get("message", f"offline model: scripted {error_type}")
    if not isinstance(error_type, str) or not isinstance(message, str):
        raise ScenarioError(src, f"{where}.error", '"type" and "message" must be strings')
    return {**error, "type": error_type, "message": message}


def _parse_stream_fault(kind: str, raw: Mapping[str, Any], src: str, where: str) -> StreamFault:
    after: int | None = raw.get(
        "after_events", None if kind == "truncate" else DEFAULT_AFTER_EVENTS
    )
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise ScenarioError(src, f"{where}.after_events", f"must be an integer >= 0, got {after!r}")
    if kind == "stall":
        if "seconds" not in raw:
            raise ScenarioError(src, f"{where}.seconds", "required for a stall")
        seconds = _number(raw, "seconds", 0.0, src, where)
        ping = raw.get("ping_every_s")
        if ping is not None and _number(raw, "ping_every_s", 0.0, src, where) <= 0:
            raise ScenarioError(
                src, f"{where}.ping_every_s", "must be > 0 (or omitted for no pings)"
            )
        then = raw.get("then", "continue")
        if then not in ("continue", "drop"):
            raise ScenarioError(src, f"{where}.then", f'must be "continue" or "drop", got {then!r}')
        before = raw.get("before_headers", False)
        if not isinstance(before, bool) or (before and ping is not None):
            raise ScenarioError(src, f"{where}.before_headers",
                                "must be true or false, and true takes no ping_every_s")
        return StreamFault(kind, after, seconds, None if ping is None else float(ping), then,
                           before_headers=before)
    if kind == "malformed":
        what = raw.get("what")
        if what not in MALFORMED:
            raise ScenarioError(src, f"{where}.what", f"must be one of {MALFORMED}, got {what!r}")
        return StreamFault(kind, after, what=what)
    if kind == "error_event":
        error = _parse_error(raw, src, where, default_type="overloaded_error")
        return StreamFault(kind, after, error=error)
    return StreamFault(kind, after)


def first_prompt(request: Mapping[str, Any]) -> str:
    """The text of a request's first user message (what picks a named script)."""
    for msg in request.get("messages") or ():
        if isinstance(msg, Mapping) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(b.get("text", "") for b in content
                                if isinstance(b, Mapping) and isinstance(b.get("text"), str))
            return ""
    return ""


def session_of(request: Mapping[str, Any]) -> str:
    """The scenario cursor's key: `metadata.user_id` (the session id), or the default."""
    metadata = request.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    return user_id if isinstance(user_id, str) else DEFAULT_SESSION


ScenarioSource = Scenario | str | os.PathLike[str] | list[Any] | dict[str, Any] | None


def as_scenario(source: ScenarioSource) -> Scenario | None:
    """A Scenario from a Scenario, a file path, or already-parsed JSON data."""
    if source is None or isinstance(source, Scenario):
        return source
    if isinstance(source, list | dict):
        return parse_scenario(source)
    return load_scenario(source)
