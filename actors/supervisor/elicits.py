"""MCP servers' questions to the user (elicitation), in the supervisor: events and answers.

An executor's `Elicit` for a tool job in flight becomes `ELICITATION_REQUESTED {id,
server, call_id, message, schema | url, timeout_s}` in the session; a client with control
rights answers it (`AnswerElicitation` on the control socket: `oploop answer`,
`Client.answer`, the gateway's `POST /api/sessions/{id}/answer`), which goes to the
executor holding the job as an `ElicitAnswer` and is said as `ELICITATION_ANSWERED {id,
action, by, fields}` (the names of the fields answered, not their values: the server
has them, and a form's answers need not reach every viewer of the session). No answer
within `timeout_s` (what the call can still wait) is a decline `by` "timeout"; a call that
ends first (cancelled, timed out) closes its questions with "cancel" `by` "ended".

After a supervisor restart the questions its run left open wait with their calls
(`restarted`): an executor that still runs the call asks each again as it reports the
call (`ELICITATION_REQUESTED` once more, same id, with the time left), and the answer
goes to it as before. A call no executor reports in time ends "interrupted", and its
questions are closed "cancel" `by` "restart" (`abandoned`); so are those of a run
resumed without adoption (its calls in flight interrupted at once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.bounds import cut_line
from actors.mcp.forms import ACTIONS, FormError, checked
from actors.sessionlog import Record
from actors.supervisor.dispatch import Dispatcher
from actors.supervisor.fold import BadRecord, decode_record
from bus.errors import BusError
from bus.mcpwire import AnswerElicitation, Elicit, ElicitAnswer, ElicitationAck
from bus.messages import Envelope
from bus.vocab import EventType

if TYPE_CHECKING:
    from actors.core.loopio import EventSink
    from actors.core.session import Session
    from bus.sockets import Port

#: Why a restart closed a question (`ELICITATION_ANSWERED.reason`).
RESTARTED = ("the supervisor restarted while the call that asked was in flight, and no "
             "executor still running that call reported it: the call ends as interrupted")

#: Longest message and schema (JSON characters) an event carries.
MAX_MESSAGE = 4000
MAX_SCHEMA_KEYS = 100


@dataclass(slots=True)
class Pending:
    """A question waiting for its answer."""

    session: Session
    job: str
    call_id: str
    server: str
    schema: dict[str, Any]
    url: str
    timer: asyncio.TimerHandle | None = None
    #: Told the action instead of the executor (a question of the supervisor's own).
    on_answer: Callable[[str], None] | None = None


class Elicits:
    """The questions of running sessions' MCP calls, by id."""

    def __init__(self, dispatcher: Dispatcher, emit: EventSink) -> None:
        self.dispatcher = dispatcher
        self.emit = emit
        self.pending: dict[str, Pending] = {}
        #: Questions a restart left open whose call may be adopted: id -> (session,
        #: call id); asked again by the executor, or closed by `abandoned`.
        self.reopened: dict[str, tuple[Session, str]] = {}

    def requested(self, session: Session, call_id: str, env: Envelope) -> None:
        """An executor's `Elicit` for the job of `call_id`: say it in the session."""
        body = env.body
        assert isinstance(body, Elicit)
        known = self.pending.get(body.id)
        if known is not None and known.job == env.job and known.session is session:
            return  # asked again by an executor that lost us a while: open here already
        if known is not None or session.run_over:
            self._send(env.job, body.id, "decline")  # (a run over: nobody to ask)
            return
        again = self.reopened.pop(body.id, None) is not None
        schema = body.schema if isinstance(body.schema, dict) else {}
        properties = schema.get("properties")
        if isinstance(properties, dict) and len(properties) > MAX_SCHEMA_KEYS:
            self._send(env.job, body.id, "decline")
            return
        wait_s = max(0.0, min(body.wait_s, 3600.0))
        pending = Pending(session, env.job, call_id, body.server, schema, body.url)
        self.pending[body.id] = pending
        data: dict[str, Any] = {"id": body.id, "server": body.server, "call_id": call_id,
                                "message": cut_line(body.message, MAX_MESSAGE),
                                "timeout_s": round(wait_s, 1)}
        if body.url:
            data["url"] = cut_line(body.url, 2000)
        else:
            data["schema"] = schema
        if again:
            data["again"] = True  # asked again after a restart (its call adopted)
        self.emit(session, EventType.ELICITATION_REQUESTED, session.run_turn, data)
        pending.timer = asyncio.get_running_loop().call_later(
            wait_s, self._close, body.id, "decline", "timeout", {})

    def confirm(self, session: Session, call_id: str, env: Envelope, ask_id: str,
                message: str, wait_s: float, on_answer: Callable[[str], None],
                about: dict[str, Any]) -> None:
        """Ask the session's operators a yes/no question of the supervisor's own (an
        empty form: accept or decline), `about` said with it; `on_answer(action)` is
        told the answer ("decline" at the timeout, "cancel" if the call ends first)."""
        pending = Pending(session, env.job, call_id, "", {}, "", on_answer=on_answer)
        self.pending[ask_id] = pending
        data: dict[str, Any] = {"id": ask_id, "server": about.get("server", ""),
                                "call_id": call_id, "message": cut_line(message, MAX_MESSAGE),
                                "schema": {"type": "object", "properties": {}},
                                "timeout_s": round(wait_s, 1), **about}
        self.emit(session, EventType.ELICITATION_REQUESTED, session.run_turn, data)
        pending.timer = asyncio.get_running_loop().call_later(
            wait_s, self._close, ask_id, "decline", "timeout", {})

    def answer(self, port: Port, by: str, peer: bytes | None, env: Envelope,
               req: AnswerElicitation) -> None:
        """A client's answer: checked, sent to the server, said; or refused (nothing sent)."""
        pending = self.pending.get(req.id)
        reopened = self.reopened.get(req.id)
        if pending is None and reopened is not None and reopened[0].id == req.session:
            port.reply_error(peer, env.id, "not_pending",
                             f"session {req.session}: question {req.id!r} waits for its call's "
                             "executor to report back after the supervisor restarted: it is "
                             "asked again then (ELICITATION_REQUESTED), or closed")
            return
        if pending is None or pending.session.id != req.session:
            port.reply_error(peer, env.id, "not_pending",
                             f"session {req.session}: no question {req.id!r} waits for an "
                             f"answer (answered already, timed out, its call ended, or the "
                             f"supervisor restarted)")
            return
        if req.action not in ACTIONS:
            port.reply_error(peer, env.id, "bad_request",
                             f"action must be one of {', '.join(ACTIONS)}, not {req.action!r}")
            return
        content: dict[str, Any] = {}
        if req.action == "accept" and not pending.url:
            try:
                content = checked(pending.schema, req.content)
            except FormError as exc:
                port.reply_error(peer, env.id, "bad_answer", str(exc))
                return
        self._close(req.id, req.action, by, content)
        port.reply(Envelope(ElicitationAck(req.session, req.id, by), id=env.id), peer)

    def restarted(self, session: Session, records: Iterable[Record],
                  adopting: Iterable[str] = ()) -> list[str]:
        """A run resumed after a restart: the questions its `records` (the run's, from
        the log) left open wait with their call if it is one the run may adopt (in
        `adopting`), else are closed, "cancel" `by` "restart", saying why; the ids
        closed."""
        kept = set(adopting)
        closed = []
        for ask_id, call_id in open_questions(records).items():
            if call_id in kept:
                self.reopened[ask_id] = (session, call_id)
            else:
                self._restart_closes(session, ask_id)
                closed.append(ask_id)
        return closed

    def abandoned(self, session: Session, call_id: str) -> None:
        """A call in flight at the restart that no executor reported: its questions left
        open are closed, "cancel" `by` "restart"."""
        for ask_id, (asker, call) in list(self.reopened.items()):
            if asker is session and call == call_id:
                del self.reopened[ask_id]
                self._restart_closes(session, ask_id)

    def _restart_closes(self, session: Session, ask_id: str) -> None:
        if not session.run_over:  # nothing of a run after its terminal event
            self.emit(session, EventType.ELICITATION_ANSWERED, session.run_turn,
                      {"id": ask_id, "action": "cancel", "by": "restart", "fields": [],
                       "reason": RESTARTED})

    def call_over(self, session: Session, call_id: str) -> None:
        """The call's job ended: its questions are closed (the server has gone on)."""
        for ask_id, pending in list(self.pending.items()):
            if pending.session is session and pending.call_id == call_id:
                self._close(ask_id, "cancel", "ended", {}, send=False)
        for ask_id, (asker, call) in list(self.reopened.items()):
            if asker is session and call == call_id:  # (its executor no longer asked it)
                del self.reopened[ask_id]
                if not session.run_over:
                    self.emit(session, EventType.ELICITATION_ANSWERED, session.run_turn,
                              {"id": ask_id, "action": "cancel", "by": "ended", "fields": []})

    def _close(self, ask_id: str, action: str, by: str, content: dict[str, Any],
               send: bool = True) -> None:
        pending = self.pending.pop(ask_id, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        if pending.on_answer is not None:
            pending.on_answer(action)
        elif send:
            self._send(pending.job, ask_id, action, content)
        session = pending.session
        if not session.run_over:  # nothing of a run after its terminal event
            self.emit(session, EventType.ELICITATION_ANSWERED, session.run_turn,
                      {"id": ask_id, "action": action, "by": by, "fields": sorted(content)})

    def _send(self, job_id: str, ask_id: str, action: str,
              content: dict[str, Any] | None = None) -> None:
        """The answer to the executor holding `job_id` (gone: its call is over anyway)."""
        job = self.dispatcher.jobs.get(job_id)
        if job is None or job.worker is None:
            return
        answer = Envelope(ElicitAnswer(ask_id, action, dict(content or {})), job=job_id,
                          sid=job.env.sid)
        with contextlib.suppress(BusError):  # the worker is gone: the call fails as lost
            self.dispatcher.work.send(answer, job.worker)


def open_questions(records: Iterable[Record]) -> dict[str, str]:
    """The questions `records` ask (`ELICITATION_REQUESTED`) and do not close
    (`ELICITATION_ANSWERED`), id -> the call that asked, in the order asked; a record
    that does not decode is skipped (its fold has said so)."""
    asked: dict[str, str] = {}
    for record in records:
        if b"ELICITATION_" not in record.frame:  # (no need to decode the others)
            continue
        try:
            event, _ = decode_record(record)
        except BadRecord:
            continue
        ask_id = event.data.get("id")
        if not isinstance(ask_id, str) or event.type not in (
                EventType.ELICITATION_REQUESTED, EventType.ELICITATION_ANSWERED):
            continue
        if event.type == EventType.ELICITATION_REQUESTED:
            asked.setdefault(ask_id, str(event.data.get("call_id", "")))
        else:
            asked.pop(ask_id, None)
    return asked
