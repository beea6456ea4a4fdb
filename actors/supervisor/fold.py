"""A session as a fold over its log: what each record adds, and how to replay it.

Writing: `history_delta(session)` gives the history changes since the last
event as `(role, blocks)` operations (work proportional to what changed, not
to the history). `record_delta` packs them with an event's extras.

Reading: `load_session` starts from the session's last compaction (or its
row) and applies every later record with `apply_record`. The run's state is
the fold of its events (`core.fold.fold_event`: `SESSION_START` opens a run,
`TURN_START` counts a turn, `TOOL_START`/`TOOL_END` record the current reply's
calls, a terminal event closes the run), and the history the deltas, replayed
with the same merge rule the loop uses (`history.append_blocks`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import msgpack

from actors.bounds import pack
from actors.config import Agent
from actors.core.context import ContextView
from actors.core.fold import fold_event
from actors.core.history import Message, append_blocks, blocks
from actors.core.session import Session
from actors.core.state import Phase, RunState
from actors.core.timeline import Timeline
from actors.core.turn import ToolOutcome
from actors.digests import blake2b
from actors.logstore import SessionStore
from actors.sessionlog import Compaction, Record, SessionRow
from actors.usage import Meter
from bus.codec import decode
from bus.errors import BadFrame
from bus.messages import Event
from bus.vocab import EventType

log = logging.getLogger("oploop.journal")

#: Operation meaning "the history is replaced by these messages" (a rewrite the
#: loop never does today; kept so that one would still be logged exactly).
RESET = "*"

#: Bytes of a message's digest in a compaction (BLAKE2b; one session's messages).
PART_DIGEST_BYTES = 16

#: Session fields a compaction carries (the rest is runtime state: tasks, hooks).
_FIELDS = ("id", "cwd", "history", "next_seq", "created", "deadline", "run_from_seq",
           "start_key")
#: What a compaction carries of the run's state, by the names it has always had there
#: (the `Session` views of `Session.run`; `outcomes` and the meter apart).
_RUN_FIELDS = ("state", "runs", "turns", "stop_request", "run_over", "last_end",
               "run_limit", "run_turn", "started_calls", "approvals", "decided", "always",
               "context")


class BadRecord(ValueError):
    """A log record that does not decode."""


# -- writing ----------------------------------------------------------------------------


def history_delta(session: Session) -> list[list[Any]]:
    """The history operations since the last call (and mark them logged).

    The loop only ever appends messages or replaces the last one by itself with
    blocks added (never edits in place), so comparing the last logged message
    by identity finds what changed in O(what changed).
    """
    history = session.history
    n, last = session.logged_len, session.logged_last
    ops: list[list[Any]] = []
    if n == len(history) and (n == 0 or history[-1] is last):
        return ops
    if n > len(history) or (n and not _extends(history[n - 1], last)):
        ops = [[RESET, [[m.get("role"), blocks(m)] for m in history]]]
    else:
        if n and history[n - 1] is not last:
            assert last is not None
            new = blocks(history[n - 1])[len(blocks(last)):]
            ops.append([history[n - 1].get("role"), new])
        ops.extend([m.get("role"), blocks(m)] for m in history[n:])
    mark_logged(session)
    return ops


def _extends(message: Message, old: Message | None) -> bool:
    """Whether `message` is `old` with blocks added at its end (same role)."""
    if old is None or message is old:
        return message is old
    if message.get("role") != old.get("role"):
        return False
    before = blocks(old)
    return blocks(message)[:len(before)] == before


def mark_logged(session: Session) -> None:
    """Take the session's history as logged as it is now."""
    session.logged_len = len(session.history)
    session.logged_last = session.history[-1] if session.history else None


def logged_history(session: Session) -> list[Message]:
    """The history as the log has it (what is not yet logged left out)."""
    n = session.logged_len
    if n == 0:
        return []
    assert session.logged_last is not None
    return [*session.history[:n - 1], session.logged_last]


def record_delta(ops: list[list[Any]], extras: dict[str, Any] | None = None) -> bytes | None:
    """The `delta` column of a record: history ops and event extras, or None if empty."""
    if not ops and not extras:
        return None
    packed: bytes = pack({"h": ops, "x": extras or {}})
    return packed


def run_extras(session: Session) -> dict[str, Any]:
    """What a `SESSION_START` record carries beyond its event: the run's absolute
    deadline and the key of the `StartRun` that began it."""
    return {"deadline": session.deadline, "key": session.start_key}


#: `asdict` of the agents rows were lately written for, by identity: an `Agent` is
#: frozen, and `asdict` (a deep copy) was ~7% of the supervisor's time at 1,000 sessions.
_AGENT_DICTS: dict[int, tuple[Agent, dict[str, Any]]] = {}
#: Agents remembered at most (a host has a few; a config reload makes new ones).
MAX_AGENT_DICTS = 64


def _agent_dict(agent: Agent) -> dict[str, Any]:
    held = _AGENT_DICTS.get(id(agent))
    if held is None or held[0] is not agent:  # (holding the agent keeps its id unique)
        if len(_AGENT_DICTS) >= MAX_AGENT_DICTS:
            _AGENT_DICTS.clear()
        held = _AGENT_DICTS[id(agent)] = (agent, dataclasses.asdict(agent))
    return held[1]


def session_row(session: Session) -> SessionRow:
    """The session's small row as it is now."""
    meta: bytes = pack({"agent": _agent_dict(session.agent), "cwd": session.cwd})
    # Written with the run's end, before the task that ran it has unwound: the row
    # says what the session is once it has (listed from the log from then on).
    summary: bytes = pack({**session.summary(),
                           "state": "running" if not session.run_over else "idle"})
    stop: bytes | None = None
    if (session.stop_request or session.said) and not session.run_over:
        # What the open run was asked and has not yet taken: an operation cancel, and
        # messages said into it (`[run, stop_request, [[text, by], ...]]`).
        stop = pack([session.runs, session.stop_request, [list(m) for m in session.said]])
    return SessionRow(session.id, session.created, meta, summary, time.time(),
                      not session.run_over, stop)


def compaction(session: Session) -> Compaction:
    """The session's state as logged (its last logged event's seq), its history as
    the digests of its messages, with the messages the store does not hold yet."""
    digests, new = _parts(session, logged_history(session))
    return Compaction(session.id, session.next_seq - 1, snapshot(session, digests), new)


def _parts(session: Session, history: list[Message]) -> tuple[list[bytes],
                                                                tuple[tuple[bytes, bytes], ...]]:
    """The digest of each message of `history`, and (digest, message) of those not
    stored yet. A message digested before (the same object at the same place: the
    loop never edits one in place, `history_delta`) is not packed again."""
    known, stored = session.log_digests, session.log_parts
    digests: list[bytes] = []
    new: list[tuple[bytes, bytes]] = []
    for i, message in enumerate(history):
        if i < len(known) and known[i][0] is message:
            digests.append(known[i][1])
            continue
        data: bytes = pack(message)
        digest = blake2b(data, digest_size=PART_DIGEST_BYTES).digest()
        if i < len(known):
            known[i] = (message, digest)
        else:
            known.append((message, digest))
        if digest not in stored:
            stored.add(digest)
            new.append((digest, data))
        digests.append(digest)
    del known[len(history):]
    return digests, tuple(new)


def snapshot(session: Session, history_parts: list[bytes]) -> bytes:
    """A session as bytes: its fields, its history as part digests, its agent in full,
    its finished tool outcomes."""
    data: dict[str, Any] = {name: getattr(session, name) for name in _FIELDS + _RUN_FIELDS}
    del data["history"]
    data["history_parts"] = history_parts
    data["agent"] = _agent_dict(session.agent)
    data["outcomes"] = {k: [o.output, o.is_error, o.duration_ms, list(o.images)]
                        for k, o in session.outcomes.items()}
    data["meter"] = session.meter.to_state()
    data["timeline"] = session.timeline.to_state()
    packed: bytes = pack(data)
    return packed


# -- reading ----------------------------------------------------------------------------


def _agent(raw: dict[str, Any], agents: dict[str, Agent]) -> Agent:
    raw = dict(raw)
    raw["category_allowlist"] = tuple(raw.get("category_allowlist", ()))
    raw["permissions"] = tuple(tuple(r) for r in raw.get("permissions", ()))
    if isinstance(raw.get("network"), list):
        raw["network"] = tuple(raw["network"])
    configured = agents.get(raw.get("name", ""))
    if configured is None:
        return Agent(**raw)
    # A session aimed at a machine (`oploop run --machine`) stays aimed there.
    target = str(raw.get("target_machine", "") or "")
    if target and target != configured.target_machine:
        return dataclasses.replace(configured, target_machine=target)
    return configured


class MissingPart(KeyError):
    """A compaction refers to a message its store does not have."""


def restore(blob: bytes, agents: dict[str, Agent],
            parts: dict[bytes, bytes] | None = None) -> Session:
    """The session a `snapshot` describes, its messages taken from `parts` (an agent no
    longer configured keeps the settings it had). Raises `MissingPart`."""
    data = msgpack.unpackb(blob, raw=False)
    digests = data.pop("history_parts", None)
    if digests is not None:  # (before December, compactions held the history itself)
        parts = parts or {}
        missing = [d.hex() for d in digests if d not in parts]
        if missing:
            raise MissingPart(f"{len(missing)} of {len(digests)} messages, "
                              f"the first {missing[0]}")
        data["history"] = [msgpack.unpackb(parts[d], raw=False) for d in digests]
    agent = _agent(data.pop("agent"), agents)
    outcomes = {k: ToolOutcome(v[0], v[1], v[2], tuple(v[3]) if len(v) > 3 else ())
                for k, v in data.pop("outcomes").items()}
    meter = Meter.from_state(data.pop("meter", None))  # (none in older snapshots)
    # A field added since the snapshot was written keeps its default.
    session = Session(agent=agent, **{k: data[k] for k in _FIELDS if k in data})
    session.meter = meter
    session.timeline = Timeline.from_state(data.pop("timeline", None))
    history = session.history
    session.run = RunState(
        phase=Phase.IDLE if data.get("run_over", True) else Phase.MODEL,
        runs=int(data.get("runs", 0)), turns=int(data.get("turns", 0)),
        turn=int(data.get("run_turn", 0)), limit=int(data.get("run_limit", 0)),
        last=history[-1] if history else None, last_end=str(data.get("last_end", "")),
        stop_request=str(data.get("stop_request", "")),
        started=tuple(data.get("started_calls", ())), outcomes=tuple(outcomes.items()),
        usage=meter.run, asks=tuple((k, float(v)) for k, v in data.get("approvals", {}).items()),
        decided=tuple((d[0], d[1], d[2]) for d in data.get("decided", ())),
        always=tuple(data.get("always", ())),
        context=ContextView(*data.get("context", ())))
    if digests is not None:
        session.log_digests = list(zip(history, digests, strict=True))
        session.log_parts = set(parts or ())
    return session


def from_row(row: SessionRow, agents: dict[str, Agent]) -> Session:
    """A session with no record applied yet: its agent, cwd and creation time."""
    meta = msgpack.unpackb(row.meta, raw=False)
    return Session(row.sid, _agent(meta["agent"], agents), meta["cwd"], created=row.created)


def decode_record(record: Record) -> tuple[Event, dict[str, Any]]:
    """The event of a record and its delta (`{"h": ops, "x": extras}`); `BadRecord`."""
    try:
        env = decode(record.frame)
        delta = msgpack.unpackb(record.delta, raw=False) if record.delta else {}
    except (BadFrame, ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadRecord(f"record {record.sid}#{record.seq} does not decode: {exc}") from exc
    if not isinstance(env.body, Event) or not isinstance(delta, dict):
        raise BadRecord(f"record {record.sid}#{record.seq} is not an event")
    return env.body, delta


def apply_record(session: Session, seq: int, event: Event, delta: dict[str, Any]) -> None:
    """Fold one record into `session` (the same changes the live loop made)."""
    session.next_seq = seq + 1
    data, kind = event.data, event.type
    if kind == EventType.SESSION_START:
        extras = delta.get("x") or {}
        session.run_from_seq = seq
        session.deadline = float(extras.get("deadline", 0.0))
        session.start_key = str(extras.get("key", ""))
    session.run = fold_event(session.run, kind, event.turn, data)
    session.meter.apply(kind, data)  # tokens: the same fold `Session.stamp` does live
    session.timeline.apply(kind, data, event.ts)
    history = session.history
    for op in delta.get("h") or ():
        role, added = op
        if role == RESET:
            history = session.history = [{"role": r, "content": list(b)} for r, b in added]
        else:
            append_blocks(history, role, list(added))
    last = history[-1] if history else None
    if last is not session.run.last:  # the machine's view of the history: its last message
        session.run = session.run._replace(last=last)


def load_session(journal: SessionStore, sid: str, agents: dict[str, Agent]) -> Session | None:
    """The session `sid` folded from the log, or None if the log has no such session.

    A record that does not decode is skipped with an error naming the session
    (its seq is still counted: a seq is never reused).
    """
    row = journal.row(sid)
    if row is None:
        return None
    comp = journal.compaction(sid)
    if comp is not None:
        try:
            session = restore(comp.state, agents, dict(comp.parts))
        except MissingPart as exc:
            # Its records are all there: the session is their fold from the start.
            log.error("session %s: its compaction at #%d cannot be read (%s): folding "
                      "every record instead", sid, comp.seq, exc)
            comp = None
    if comp is None:
        session = from_row(row, agents)
    session.log_compacted = len(comp.state) if comp is not None else 0
    for record in journal.records(sid, after=comp.seq if comp is not None else 0):
        session.log_since += len(record.frame) + len(record.delta or b"")
        try:
            event, delta = decode_record(record)
            apply_record(session, record.seq, event, delta)
        except (BadRecord, KeyError, TypeError, ValueError) as exc:
            log.error("session %s: record #%d skipped: %s", sid, record.seq, exc)
            session.next_seq = max(session.next_seq, record.seq + 1)
    if row.stop is not None and not session.run_over:
        try:
            run, mode, *more = msgpack.unpackb(row.stop, raw=False)
            said = [(str(t), str(b)) for t, b in (more[0] if more else ())]
        except (ValueError, TypeError, msgpack.UnpackException):
            run, mode, said = 0, "", []
        if run == session.runs:  # (the row is part of the log: this is its fold too)
            session.run = session.run._replace(stop_request=str(mode), said=tuple(said))
    mark_logged(session)
    return session
