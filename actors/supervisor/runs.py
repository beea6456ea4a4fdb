"""The supervisor's runs: starting one (or answering a resent start), resuming those a
restart left open, cancelling, and ending them; the control socket's verbs. Who may ask
for what, and whether a start is admitted, is `admission.py`'s."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from actors.bounds import cut_reason
from actors.core.driver import RunDriver, decision_error
from actors.core.inputs import Say as Said
from actors.core.inputs import StopLater
from actors.core.session import Session, feed_undriven
from actors.machines import LOCAL
from actors.supervisor.admission import (
    CONTROL,
    CONTROLLERS,
    FORWARDED,
    HOST,
    PEER,
    asker_of,
    by_of,
    role_of,
    start_refusal,
)
from actors.supervisor.compacting import serve_compact
from actors.supervisor.leases import PEER_DEFAULT_LEASE_S
from actors.supervisor.runhost import RunHost
from bus.mcpwire import AnswerElicitation
from bus.messages import (
    Body,
    Cancel,
    CancelAck,
    Compact,
    ControlHello,
    DecideAck,
    DecideCalls,
    Envelope,
    Renew,
    RenewAck,
    RunStarted,
    Say,
    SayAck,
    StartRun,
)
from bus.sockets import Port
from bus.vocab import CANCEL_MODES, CancelMode

log = logging.getLogger("oploop.supervisor")

#: Messages said into one run that may wait for its next boundary (each rewrites the
#: session's row with all of them: a bound on that too).
MAX_SAID = 100

#: How long a run waits for an executor to announce its tools before going without.
CATALOGUE_WAIT_S = 5.0

#: After a supervisor restart, how long a resumed run waits for an executor to report a
#: call that was in flight (still running, or over with its result kept) before that
#: call is answered "interrupted". Executors beat every second and re-announce at the
#: new supervisor's first answer (a `Disconnect`), so ~1 s is usual; the rest covers a
#: busy machine.
ADOPT_GRACE_S = 5.0


class Runs:
    """The supervisor's runs: `sup` has the sessions, the session log and the ports."""

    def __init__(self, sup: RunHost) -> None:
        self.sup = sup
        #: An embedded host's (`oploop run` with no host up): at a stop, runs are ended
        #: `CANCELLED` rather than left to be resumed by some later, unrelated command.
        self.end_at_stop = False
        #: Sessions started by peer keys, running now -> the key's name (who may cancel
        #: and renew them).
        self.peer_runs: dict[str, str] = {}
        #: The host restarted this supervisor alone (its executors may still run the
        #: calls in flight): resumed runs wait `ADOPT_GRACE_S` for them to report those
        #: calls instead of answering them "interrupted" at once.
        self.adopt = False

    def start(self, peer: bytes | None, env: Envelope, req: StartRun) -> None:
        """Serve a `StartRun`: answer a resent one with its run, refuse, or begin a run."""
        user = self.sup.api.user_id
        if role_of(user) == PEER:
            if req.session:
                self.sup.api.reply_error(peer, env.id, "forbidden",
                                         "a peer key starts new sessions only")
                return
            bound = self.sup.gate.keyring.peer_agent(by_of(user)) if self.sup.gate else "default"
            if (req.agent or "default") != bound:
                # Which agent (tools, rules) answers is this host's to say, per key.
                self.sup.api.reply_error(peer, env.id, "forbidden",
                                         f"this peer key may start runs on agent {bound!r} "
                                         f"only, not {req.agent or 'default'!r}")
                return
            if req.host:
                self.sup.api.reply_error(peer, env.id, "forbidden",
                                         "a peer key cannot choose the host its run goes to")
                return
            if req.machine:
                # Which machine's files, network and processes the tools act on is this
                # host's agent's to say (its `target_machine`), as the directory is.
                self.sup.api.reply_error(peer, env.id, "forbidden",
                                         "a peer key cannot choose the machine its run's "
                                         "tools act on (the asked host's agent says)")
                return
            # Another host's path means nothing here, and must never choose what this
            # host's tools may read: its runs get no directory (the agent's own
            # read_paths and the session's workspace only). And a peer's run always has
            # a lease, whatever its client sent.
            req = dataclasses.replace(req, cwd="",
                                      lease_s=req.lease_s or PEER_DEFAULT_LEASE_S)
        elif role_of(user) == CONTROL and req.cwd:
            # A path sent over TCP names a directory of the client's machine, and the
            # tools would act there as its owner: a remote key never chooses it (the
            # agent's `cwd`, else the session's scratch workspace). Only the host's own
            # user (ipc, or the host's key) starts runs in a directory of their choosing.
            req = dataclasses.replace(req, cwd="")
        known = self.sup.started_by(req.key)
        if known is not None:  # a resend: the first one started the run
            self.sup.reply_committed(Envelope(known, id=env.id, sid=known.session), peer)
            return
        if self._placed_elsewhere(peer, env, req):
            return
        refusal = start_refusal(self.sup, req)
        sid = req.session or os.urandom(6).hex()
        if refusal is None:
            refusal = self.sup.own(sid)  # (a shared store: this host takes its lease)
        if refusal is not None:
            self.sup.api.reply_error(peer, env.id, *refusal)
            return
        started = self._begin(req, sid, env.traceparent)
        if role_of(user) == PEER:
            self.peer_runs[started.session] = by_of(user)
        if req.lease_s > 0:
            self.sup.leases.grant(started.session, req.lease_s)
        # Replied last (once journaled), and a client gone by now changes nothing: the
        # run is accepted and goes on (`oploop sessions` finds it), never left half-begun.
        self.sup.remember_start(req.key, started)
        self.sup.reply_committed(Envelope(started, id=env.id, sid=started.session), peer)

    def _placed_elsewhere(self, peer: bytes | None, env: Envelope, req: StartRun) -> bool:
        """Whether `req` is answered without starting here: a new session placed on
        another host of the store (sent there), or a host name that cannot be used."""
        forwarder = self.sup.forwarder
        if forwarder is None:
            if req.host:
                self.sup.api.reply_error(peer, env.id, "unknown_host",
                                         f"no host {req.host!r}: this host's store is its "
                                         "own ([store] url shared by no other host)")
                return True
            return False
        if role_of(self.sup.api.user_id) == PEER:
            return False  # (a peer's run stays here: it renews its lease with this host)
        placed = forwarder.place(req)
        if isinstance(placed, str):
            forwarder.refuse(self.sup.api, peer, env, placed)
            return True
        if placed is None:
            return False
        forwarder.start_elsewhere(self.sup.api, peer, env, req, placed)
        return True

    def _forwarded(self, port: Port, peer: bytes | None, env: Envelope, body: Any) -> bool:
        """Whether another host of the store holds `body.session`: `body` (its caller's
        rights checked here) was sent on to that host, which answers."""
        forwarder = self.sup.forwarder
        return forwarder is not None and \
            forwarder.forwards(port, peer, env, body, asker_of(port.user_id, body))

    def _begin(self, req: StartRun, sid: str, traceparent: str = "") -> RunStarted:
        """Begin the run `req` asks for (refusals already checked) in session `sid` (new
        unless `req.session`); `traceparent`: the caller's trace context, the run's
        span's parent when tracing."""
        session = self.sup.session(req.session) if req.session else None
        if session is None:
            agent = self.sup.config.agent(req.agent)
            assert agent is not None
            # An agent with a `cwd` of its own works there, wherever the run was started.
            cwd = os.path.expanduser(agent.cwd) if agent.cwd else req.cwd
            session = Session(sid, agent, cwd)
            self.sup.sessions[session.id] = session
        if req.machine and req.machine != session.agent.target_machine:
            # The session's tools go there from this run on (its agent, as journaled in
            # the session's row, says so: a resume keeps it).
            session.agent = dataclasses.replace(session.agent, target_machine=req.machine)
        # A cancelled run's task may still be unwinding: the new one waits for it.
        previous = session.task if session.task and not session.task.done() else None
        from_seq = session.next_seq
        session.run_from_seq, session.start_key = from_seq, req.key
        driver = RunDriver(session, self.sup.io)
        if traceparent:
            self.sup.trace_parent(session.id, traceparent)
        driver.start(req.prompt, req.max_turns, req.deadline_s)
        task = self.sup.spawn(self._run(session, driver, previous),
                              f"session-{session.id}-{session.runs}")
        session.task = driver.task = task  # (an abort before `run` begins cancels it too)
        task.add_done_callback(lambda t: self._run_ended(session, t))
        return RunStarted(session.id, session.runs, from_seq)

    def _run_ended(self, session: Session, task: asyncio.Task[None]) -> None:
        if session.task is not task or session.suspended:
            return  # a newer run owns the session now, or the next supervisor will
        session.task = None
        self.peer_runs.pop(session.id, None)
        self.sup.leases.drop(session.id)
        if not session.run_over and session.driver is not None:
            session.driver.cancel(CancelMode.UI)  # cancelled before it ever ran: still one end
        self.sup.forget_when_committed(session)  # leaves memory once its end is committed

    def resume_journaled(self) -> int:
        """Load the sessions whose run was open; those runs go on. Returns how many.
        (Finished sessions stay in the log until something asks for them.)"""
        resumed = self._resume(self.sup.open_in_log(), "supervisor restarted", self.adopt)
        if resumed:
            log.warning("resumed %d session(s) from the journal", resumed)
        return resumed

    def resume_claimed(self, claimed: Mapping[str, object]) -> int:
        """Resume the sessions this host just claimed on a shared store (their owner
        stopped renewing its leases, or handed them over), exactly as after a restart."""
        for sid in claimed:  # a copy in memory (loaded to be inspected) is stale now
            stale = self.sup.sessions.get(sid)
            if stale is not None and (stale.task is None or stale.task.done()):
                del self.sup.sessions[sid]
        resumed = self._resume(list(claimed), "taken over: the host running it stopped")
        log.warning("claimed %d session(s) on the store, resumed %d", len(claimed), resumed)
        return resumed

    def _resume(self, sids: list[str], reason: str, adopt: bool = False) -> int:
        resumed = 0
        for sid in sids:
            session = self.sup.session(sid)
            if session is None or session.run_over:
                self.sup.not_resumed(sid)
                continue
            elicits = getattr(self.sup.io, "elicits", None)
            if elicits is not None:  # the questions of calls that cannot be adopted close
                run = session.run
                done = dict(run.outcomes)
                elicits.restarted(session, self.sup.run_records(session),
                                  [c for c in run.started if c not in done] if adopt else ())
            driver = RunDriver(session, self.sup.io)
            driver.resume(reason, adopt=adopt)
            expect = getattr(self.sup.io, "expect", None)  # (WorkerIO's)
            for call in driver.adopted_calls() if expect is not None else ():
                expect(session, call, ADOPT_GRACE_S)  # before any executor is heard
            task = self.sup.spawn(self._run(session, driver, None),
                                  f"session-{session.id}-{session.runs}")
            session.task = driver.task = task
            task.add_done_callback(functools.partial(self._run_ended, session))
            resumed += 1
        return resumed

    async def _run(self, session: Session, driver: RunDriver,
                   previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        # The host's own executors may not have announced their tools yet (a session aimed
        # at a worker machine does not wait: a call there without one fails at once).
        if not session.agent.target_machine and not self.sup.dispatcher.tool_specs(LOCAL):
            try:
                async with asyncio.timeout(CATALOGUE_WAIT_S):
                    while not self.sup.dispatcher.tool_specs(LOCAL):
                        self.sup.dispatcher.catalogue_changed.clear()
                        await self.sup.dispatcher.catalogue_changed.wait()
            except TimeoutError:
                log.warning("no executor announced tools; session %s runs without", session.id)
        await driver.run()

    # -- control -----------------------------------------------------------------------

    def handle_control(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Priority verbs: workers' control hellos, and cancels; served by the handler
        `_CONTROL` names for the body's type."""
        handler = _CONTROL.get(type(env.body))
        if handler is None:
            self.sup.control.reply_error(peer, env.id, "bad_request",
                                         f"control does not serve {env.kind}")
            return
        if role_of(self.sup.control.user_id) == HOST and \
                not (isinstance(env.body, FORWARDED) and env.body.by):
            self.sup.control.reply_error(
                peer, env.id, "forbidden", "another host of the store may only send on "
                "a cancel, a message, a decision or a compaction, naming who asked (by)")
            return
        handler(self, peer, env, env.body)

    def _control_hello(self, peer: bytes | None, env: Envelope, body: ControlHello) -> None:
        if peer is not None:
            self.sup.dispatcher.handle_control_hello(peer, body)

    def _control_cancel(self, peer: bytes | None, env: Envelope, body: Cancel) -> None:
        if not self.may_end(self.sup.control.user_id, body.session):  # e.g. a worker
            self.sup.control.reply_error(peer, env.id, "forbidden",
                                         "only a control key can cancel sessions (a peer "
                                         "key: only the runs it started)")
            return
        self.cancel(peer, env, body)

    def _control_say(self, peer: bytes | None, env: Envelope, body: Say) -> None:
        if role_of(self.sup.control.user_id) not in CONTROLLERS:
            self.sup.control.reply_error(peer, env.id, "forbidden",
                                         "only a control key can send messages to sessions")
            return
        if self._forwarded(self.sup.control, peer, env, body):
            return
        self.say(peer, env, body, asker_of(self.sup.control.user_id, body))

    def _control_compact(self, peer: bytes | None, env: Envelope, body: Compact) -> None:
        if role_of(self.sup.control.user_id) not in CONTROLLERS:
            self.sup.control.reply_error(peer, env.id, "forbidden",
                                         "only a control key can compact sessions")
            return
        if self._forwarded(self.sup.control, peer, env, body):
            return
        serve_compact(self.sup, self._run_ended, peer, env, body,
                      asker_of(self.sup.control.user_id, body))

    def may_end(self, user_id: str | None, session: str) -> bool:
        """Whether the key `user_id` may cancel (or renew) `session`: a control key any,
        a peer key only a run it started."""
        role = role_of(user_id)
        if role in CONTROLLERS:
            return True
        return role == PEER and self.peer_runs.get(session) == by_of(user_id)

    def renew(self, peer: bytes | None, env: Envelope, req: Renew) -> None:
        """Extend a run's lease; the reply says whether the run still goes on."""
        port = self.sup.control
        session = self.sup.session(req.session) if self.sup.known(req.session) else None
        if session is None:
            port.reply_error(peer, env.id, "unknown_session", self.sup.no_session(req.session))
            return
        if not self.may_end(port.user_id, req.session):
            port.reply_error(peer, env.id, "forbidden",
                             "a peer key may renew only the runs it started")
            return
        if not (req.lease_s > 0):  # (NaN too)
            port.reply_error(peer, env.id, "bad_request", "lease_s must be > 0")
            return
        if not session.run_over:  # (a run started without a lease keeps having none)
            self.sup.leases.renew(session.id, req.lease_s)
        port.reply(Envelope(RenewAck(session.id, not session.run_over), id=env.id), peer)

    def decide(self, peer: bytes | None, env: Envelope, req: DecideCalls) -> None:
        """Approve or deny calls waiting for approval: all of them, or none (one clear
        error: who may not decide, an unknown session or call, a call decided already)."""
        port = self.sup.control
        user = port.user_id
        if role_of(user) not in CONTROLLERS:
            port.reply_error(peer, env.id, "forbidden",
                             f"a {role_of(user)} key may not approve or deny calls "
                             "(the local user and control keys may)")
            return
        if req.decision not in ("approve", "deny"):
            port.reply_error(peer, env.id, "bad_request",
                             f"decision must be 'approve' or 'deny', not {req.decision!r}")
            return
        if self._forwarded(port, peer, env, req):
            return
        session = self.sup.session(req.session)
        if session is None:
            port.reply_error(peer, env.id, "unknown_session", self.sup.no_session(req.session))
            return
        driver = session.driver
        asks = driver.state.asks if driver is not None and not session.run_over else ()
        ids = [a[0] for a in asks] if req.all else list(req.call_ids)
        if not ids:
            why = "no call waits for approval" if req.all else "name a call id or --all"
            port.reply_error(peer, env.id, "not_pending", f"session {req.session}: {why}")
            return
        for call_id in ids:  # every one checked first: all decided, or none
            error = decision_error(session, asks, session.decided, call_id)
            if error is not None:
                port.reply_error(peer, env.id, "not_pending", error)
                return
        by = asker_of(user, req)
        for call_id in ids:
            if call_id in dict(driver.state.asks):  # (an "always" may have decided it)
                driver.decide(call_id, req.decision, by, cut_reason(req.reason), req.always)
        ack = Envelope(DecideAck(session.id, ids, by), id=env.id)
        self.sup.reply_committed(ack, peer, port)  # answered once the decision is logged

    def answer_elicitation(self, peer: bytes | None, env: Envelope,
                           req: AnswerElicitation) -> None:
        """Answer an MCP server's question (`actors.supervisor.elicits`); who may, as for
        approvals: the local user and control keys."""
        port = self.sup.control
        user = port.user_id
        if role_of(user) not in CONTROLLERS:
            port.reply_error(peer, env.id, "forbidden",
                             f"a {role_of(user)} key may not answer a server's question "
                             "(the local user and control keys may)")
            return
        if self._forwarded(port, peer, env, req):
            return
        elicits = getattr(self.sup.io, "elicits", None)
        if elicits is None:
            port.reply_error(peer, env.id, "not_pending", "no question waits here")
            return
        elicits.answer(port, asker_of(user, req), peer, env, req)

    def cancel(self, peer: bytes | None, env: Envelope, req: Cancel,
                port: Port | None = None) -> None:
        """`ui`: end the run now, then stop its workers; `operation`: at the next boundary."""
        port = port or self.sup.control
        if self._forwarded(port, peer, env, req):
            return
        session = self.sup.session(req.session)
        if session is None:
            port.reply_error(peer, env.id, "unknown_session", self.sup.no_session(req.session))
            return
        if req.mode not in CANCEL_MODES:
            modes = " or ".join(f"'{m}'" for m in CANCEL_MODES)
            port.reply_error(peer, env.id, "bad_request",
                             f"cancel mode must be {modes}, not {req.mode!r}")
            return
        if session.run_over:
            port.reply_error(peer, env.id, "not_running",
                             f"session {req.session} is not running (its last run ended "
                             f"{session.last_end or 'never'}): nothing to cancel")
            return
        other = self.sup.elsewhere(session)
        if other:
            port.reply_error(peer, env.id, "elsewhere", other)
            return
        if req.mode == CancelMode.OPERATION:
            if session.driver is not None:
                session.driver.cancel(CancelMode.OPERATION)
            else:  # (an open run not resumed here: the next one honours it)
                feed_undriven(session, StopLater())
            self.sup.journal_later(session)  # a restart keeps the request: ack after commit
            self.sup.reply_committed(Envelope(CancelAck(session.id, "stopping"), id=env.id), peer,
                                  port)
            return
        # The workers are told first (their control sockets are served before data),
        # the run ends now; their acknowledgements arrive later, in the dispatcher.
        self.sup.dispatcher.abort_session(session.id)
        if session.driver is not None:  # the run ends now; its task is aborted
            session.driver.cancel(CancelMode.UI, req.reason)
        elif session.task is not None:
            session.task.cancel()
        ack = Envelope(CancelAck(session.id, "cancelled"), id=env.id)
        self.sup.reply_committed(ack, peer, port)

    def say(self, peer: bytes | None, env: Envelope, req: Say, by: str) -> None:
        """A user message: the running run takes it at its next boundary (acknowledged
        once journaled); an idle session starts a run on it. Refused, with nothing
        changed: an unknown session, an empty text, one over `max_prompt_chars`."""
        port = self.sup.control
        limits = self.sup.config.limits
        session = self.sup.session(req.session)
        if session is None:
            port.reply_error(peer, env.id, "unknown_session", self.sup.no_session(req.session))
            return
        if not req.text.strip():
            port.reply_error(peer, env.id, "bad_request", "the message is empty: nothing to say")
            return
        if len(req.text) > limits.max_prompt_chars:
            port.reply_error(peer, env.id, "too_large",
                             f"message of {len(req.text)} chars exceeds the limit of "
                             f"{limits.max_prompt_chars} (limits.max_prompt_chars)")
            return
        if session.run_over:  # idle (or its run just ended): the message starts the next
            start = StartRun(req.text, session.id, cwd=session.cwd)
            refusal = start_refusal(self.sup, start) or self.sup.own(session.id)
            if refusal is not None:
                port.reply_error(peer, env.id, *refusal)
                return
            started = self._begin(start, session.id)
            self.sup.reply_committed(Envelope(SayAck(session.id, "started", started.run,
                                                      started.from_seq), id=env.id), peer, port)
            return
        unwritable = self.sup.unwritable()
        if unwritable:
            port.reply_error(peer, env.id, "disk_full", unwritable)
            return
        other = self.sup.elsewhere(session)
        if other:
            port.reply_error(peer, env.id, "elsewhere", other)
            return
        waiting = session.said
        if len(waiting) >= MAX_SAID or \
                sum(len(t) for t, _ in waiting) + len(req.text) > limits.max_prompt_chars:
            port.reply_error(peer, env.id, "busy",
                             f"{len(waiting)} message(s) already wait for session "
                             f"{req.session}'s next boundary (at most {MAX_SAID}, and "
                             f"{limits.max_prompt_chars} chars in all: "
                             f"limits.max_prompt_chars): try again when they are taken")
            return
        driver = session.driver
        if driver is not None and driver.state.running:
            driver.say(req.text, by)
        else:  # (an open run not resumed here: the next one takes it)
            feed_undriven(session, Said(req.text, by))
        self.sup.journal_later(session)  # a restart keeps the message: ack after commit
        self.sup.reply_committed(Envelope(SayAck(session.id, "queued", session.runs),
                                           id=env.id), peer, port)

    def suspend(self) -> None:
        """We are stopping (SIGTERM: `oploop down`, or the host died): leave every run
        open as journaled, to be resumed by the next supervisor, rather than end it.
        Its jobs are still aborted as its tasks unwind, so no tool outlives it."""
        if self.end_at_stop:
            for session in self.sup.sessions.values():
                if session.task is not None and not session.task.done():
                    self.sup.dispatcher.abort_session(session.id)
                    if session.driver is not None:  # the run ends now, CANCELLED
                        session.driver.cancel(CancelMode.UI, "the embedded host stopped")
            return
        suspended = 0
        for session in self.sup.sessions.values():
            if session.task is not None and not session.task.done():
                session.suspended = True
                suspended += not session.run_over
        if suspended:
            log.warning("stopping: %d running session(s) left to resume at the next start",
                        suspended)


#: The control socket's verbs: body type -> the `Runs` method serving it.
_CONTROL: dict[type[Body], Callable[[Runs, bytes | None, Envelope, Any], None]] = {
    ControlHello: Runs._control_hello,
    Cancel: Runs._control_cancel,
    Renew: Runs.renew,
    Say: Runs._control_say,
    Compact: Runs._control_compact,
    DecideCalls: Runs.decide,
    AnswerElicitation: Runs.answer_elicitation,
}
