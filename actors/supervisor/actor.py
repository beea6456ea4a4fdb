"""The supervisor process: api, control and work sockets; sessions; events out."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import zmq

from actors import nossl
from actors.ask.asker import Asker
from actors.config import Config
from actors.core.session import Session
from actors.logstore import is_pg_url, open_store
from actors.pgleases import LeaseLost
from actors.runtime import host_gone, notify_ready, run_actor, stop_now
from actors.sessionlog import JournalError, JournalFull
from actors.settings import Settings
from actors.storage import SESSIONS_FILE
from actors.supervisor.api import serve_api
from actors.supervisor.dispatch import Dispatcher
from actors.supervisor.eventpush import EventPush
from actors.supervisor.journal import Journal
from actors.supervisor.leases import Leases
from actors.supervisor.outage import Outage
from actors.supervisor.pruned import Tombstones
from actors.supervisor.pruning import Pruner, remove_workspaces_apart
from actors.supervisor.replay import replay_batch
from actors.supervisor.runs import Runs
from actors.supervisor.sessionbook import SessionBook
from actors.supervisor.workerio import WorkerIO
from bus.codec import encode_event
from bus.endpoints import Endpoints
from bus.messages import (
    Envelope,
    ErrorReply,
    ReplayBatch,
    ReplayRequest,
)
from bus.sockets import Port, Reactor
from bus.vocab import CancelMode, EventType

if TYPE_CHECKING:
    from actors.supervisor.forwarding import Forwarder

if TYPE_CHECKING:  # (imported at run time only when tracing is on: it loads the SDK)
    from actors.tracing import RunTracer

log = logging.getLogger("oploop.supervisor")


#: Longest a model call may take, retries included, when nothing tighter applies.
LLM_JOB_TIMEOUT_S = 900.0
#: How long a failed journal commit waits before it is tried again.
JOURNAL_RETRY_S = 1.0
#: How often the session log's reserve file is checked (and remade once space returns).
RESERVE_CHECK_S = 5.0
#: A commit holding nothing but streamed text (`GROUPED` events) waits this long for
#: more (group commit): a streamed answer's TOKENs (one per llm-caller batch, ~20-50 ms
#: apart) then share their pages, where one commit each wrote 2-3 SQLite pages per
#: TOKEN. Any other event, a reply waiting for the commit, or a replay commits at once,
#: these TOKENs with it. Nothing is published before its commit, so what a viewer has
#: seen is still in the log after a kill -9: only the stream's text shows up to this
#: much later.
TOKEN_COMMIT_S = 0.2
#: The events whose commit may wait `TOKEN_COMMIT_S` (see there): streamed text, a
#: model's or a running command's.
GROUPED = frozenset({EventType.TOKEN, EventType.THINKING, EventType.TOOL_OUTPUT})


class Supervisor(SessionBook):
    """Holds every session (as its base, `SessionBook`, finds them), runs their turn
    loops, and is the single writer of events."""

    def __init__(self, endpoints: Endpoints, config: Config | None = None,
                 journal: Journal | None = None) -> None:
        super().__init__(config or Config(), journal)
        self._unjournaled: list[tuple[str, int, bytes]] = []
        #: The pending commit's call (None: none pending), and whether it is due at once
        #: (else a TOKEN-only batch waiting `TOKEN_COMMIT_S` for more).
        self._flush_handle: asyncio.Handle | None = None
        self._flush_urgent = False
        #: A commit failed (disk full): the next try waits for a timer, not call_soon.
        self._journal_failing = False
        self._reserve_releases = 0
        #: Replies that must wait for the commit this iteration schedules.
        self._after_commit: list[tuple[Port, Envelope, bytes | None]] = []
        #: Starting, resuming, cancelling and ending runs (and the control verbs).
        self.runs = Runs(self)
        #: Whether runs the log has open go on at start (not at an embedded host's first
        #: start: those are resumed by the next `oploop up`, never by some `oploop run`).
        self.resume_at_start = True
        self.reactor = Reactor()
        self.gate = endpoints.gate(self.reactor.ctx)  # admits CURVE clients; before any bind
        self.control = self.reactor.add(
            zmq.ROUTER, "control", self.runs.handle_control, bind=endpoints.binds("control"),
            secure=endpoints.server_side("control"), priority=True, reply_errors=True,
        )
        # Workers' keys reach it too (for aborts): cancels check who sent them.
        self.control.identify = endpoints.curve
        self.api = self.reactor.add(
            zmq.ROUTER, "api", self.handle_api, bind=endpoints.binds("api"),
            secure=endpoints.server_side("api"), reply_errors=True,
        )
        # Peer hosts' keys reach it too: what they may ask is narrowed by their role.
        self.api.identify = endpoints.curve
        #: Leases of the runs other hosts asked for (`ask_machine`): silent, cancelled.
        self.leases = Leases(self._lease_expired)
        #: This host's own `ask_machine` calls to its peers (`[peers]`).
        self.asker = Asker(self.config.peers, self.config.limits.max_result_chars)
        work = self.reactor.add(zmq.ROUTER, "work", None, bind=endpoints.binds("work"),
                                secure=endpoints.server_side("work"))
        # Over TCP, who a worker machine's workers are (their key) and where they are.
        work.identify = endpoints.network is not None
        self.dispatcher = Dispatcher(work, self.control)
        self.dispatcher.local_worker_keys = self.config.local_worker_keys
        if journal is not None:  # (without one an event is published as it is emitted)
            self.dispatcher.uncommitted = lambda: bool(self._unjournaled)
            self.dispatcher.commit_soon = self._schedule_flush
        work.handler = self.dispatcher.handle_work
        #: The shared store out of reach: its sessions wait (`supervisor/outage.py`).
        self.outage = Outage(self.emit, self._waiting_sessions, self.sessions.get,
                             self.dispatcher.hold)
        #: Events out to the broadcaster (what it refuses waits in an outbox).
        self.push = EventPush(self.reactor.add(
            zmq.PUSH, "events", connect=endpoints.address("ingest"), hwm=1_000_000,
        ))
        #: With `ownership`: requests for sessions other hosts run go there (`forwarding`).
        self.forwarder: Forwarder | None = None
        self._group: asyncio.TaskGroup | None = None
        self.io = WorkerIO(self.config, self.dispatcher, self.asker, self.emit)
        #: OpenTelemetry traces of the runs (`actors/tracing.py`); None: off.
        self.tracer: RunTracer | None = None

    def trace_parent(self, sid: str, traceparent: str) -> None:
        """The next run of `sid` continues the caller's trace (nothing when not tracing)."""
        if self.tracer is not None:
            self.tracer.expect_parent(sid, traceparent)

    def trace_with(self, tracer: RunTracer) -> None:
        """Make spans of every run's events with `tracer`, and carry its context in the
        model calls' envelopes (the llm caller passes it on to the model's server)."""
        self.tracer = tracer
        self.io.trace_context = tracer.traceparent

    # -- events ------------------------------------------------------------------------

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Stamp the next seq of `session` on an event and publish it: at once without a
        journal, else after the journal has committed it (at the end of this loop
        iteration, with every other event of it: one commit per iteration; streamed text
        may wait `TOKEN_COMMIT_S` for more)."""
        ts = time.time()
        seq = session.stamp(type_, data, ts)
        if self.tracer is not None:  # (off: this test is all it costs)
            self.tracer.on_event(session.id, session.agent.name, session.agent.model_id(),
                                 type_, turn, data, ts)
        frame = encode_event(session.id, seq, type_, turn, ts, data)
        if self.journal is None:
            self.push.send(frame, session.id, seq)
            return
        self.journal.record(session, type_, seq, frame)
        self._unjournaled.append((session.id, seq, frame))
        self._schedule_flush(urgent=type_ not in GROUPED)

    def journal_later(self, session: Session) -> None:
        """Journal `session`'s row (e.g. an operation cancel) with this iteration's commit."""
        if self.journal is None:
            return
        self.journal.touch(session)
        self._schedule_flush()

    @property
    def _flush_scheduled(self) -> bool:
        return self._flush_handle is not None

    def _schedule_flush(self, urgent: bool = True) -> None:
        """Commit at the end of this loop iteration, or (`urgent` False: TOKENs only)
        within `TOKEN_COMMIT_S`; an urgent call brings a waiting commit forward."""
        if self._journal_failing:
            return
        handle = self._flush_handle
        if handle is not None:
            if self._flush_urgent or not urgent:
                return
            handle.cancel()
        loop = asyncio.get_running_loop()
        self._flush_urgent = urgent
        self._flush_handle = (loop.call_soon(self._flush) if urgent
                              else loop.call_later(TOKEN_COMMIT_S, self._flush))

    def _flush(self) -> None:
        """Commit the pending records, publish their events, send the jobs that waited
        for them (tool calls: `Dispatcher.uncommitted`) and the replies that waited for
        them. A failed commit publishes nothing, and sends nothing that waited for it:
        it is tried again."""
        if self._flush_handle is not None:  # (called directly: the pending call is void)
            self._flush_handle.cancel()
            self._flush_handle = None
        assert self.journal is not None
        try:
            self.journal.commit()
        except LeaseLost as exc:  # those sessions are another host's now: never written
            self.leases_lost(set(exc.sids))
            self._flush()  # the rest of the batch
            return
        except JournalError as exc:
            self._commit_failed(exc)
            return
        self._journal_failing = False
        events, self._unjournaled = self._unjournaled, []
        if events:
            self.push.commit(events)
        self.dispatcher.send_out()  # (what waited for this commit: tool jobs)
        if self.outage.active:  # (its STORE_UNAVAILABLE events just went out)
            self.outage.end()
        replies, self._after_commit = self._after_commit, []
        for port, env, peer in replies:
            port.reply(env, peer)
        ended, self._ended = self._ended, []
        for session in ended:  # its end is journaled: a follow-up loads it from the log
            if session.task is None and session.run_over and \
                    self.sessions.get(session.id) is session:
                del self.sessions[session.id]
                self.dispatcher.forget_history(session.id, session.turn_cache.callers())
        if self.journal.log.releases != self._reserve_releases:
            self._reserve_releases = self.journal.log.releases
            self._end_runs("disk_full", "the disk is full: the session log gave up its "
                           "reserve to journal this; the run is ended")

    def leases_lost(self, sids: set[str]) -> None:
        """This host no longer holds `sids` (its leases lapsed: another host may run
        them now): their work stops here, nothing more of them is written or published,
        and they leave memory (a later request loads them from the store)."""
        if self.ownership is not None:
            self.ownership.forget(sids)
        if self.journal is not None:
            self.journal.drop(sids)
        self._unjournaled = [e for e in self._unjournaled if e[0] not in sids]
        self.outage.forget(sids)
        for sid in sids:
            session = self.sessions.pop(sid, None)
            self.dispatcher.abort_session(sid)
            if session is not None:
                self.dispatcher.forget_history(sid, session.turn_cache.callers())
            self.leases.drop(sid)
            if session is not None and session.task is not None and not session.task.done():
                session.suspended = True  # (its task's end writes nothing: `_run_ended`)
                session.task.cancel()
        log.warning("stopped %d session(s) whose lease lapsed: %s", len(sids),
                    ", ".join(sorted(sids)[:5]))

    def _commit_failed(self, exc: JournalError) -> None:
        """Nothing of the batch was written: keep it (and its events unpublished), end the
        runs under way with `ERROR` naming the cause, and try again on a timer."""
        first = not self._journal_failing
        self._journal_failing = True
        if first and self.ownership is not None and not isinstance(exc, JournalFull):
            # A shared store out of reach (restarted, a cut link): the runs wait for it,
            # their events pending, and go on when it returns; past their leases they
            # stop here, and whichever host claims them resumes them from the store.
            log.error("the store cannot be written (%s): %d event(s) wait for it",
                      exc, len(self._unjournaled))
            self.outage.begin(str(exc))
        elif first:
            log.error("journal commit failed (%s): %d event(s) wait; runs under way end",
                      exc, len(self._unjournaled))
            self._end_runs("disk_full" if isinstance(exc, JournalFull) else "journal", str(exc))
        asyncio.get_running_loop().call_later(JOURNAL_RETRY_S, self._retry_flush)

    def _retry_flush(self) -> None:
        """Try a failed commit again, unless the shared store is known out of reach (its
        lease renewals failing): a try would only block the loop, up to a connection's
        timeout over a cut link, and delay stopping the sessions in time. Then later."""
        if self.ownership is not None and self.ownership.failing:
            asyncio.get_running_loop().call_later(JOURNAL_RETRY_S, self._retry_flush)
            return
        self._flush()

    def store_unreachable(self, error: str) -> None:
        """A lease renewal failed: the store is out of reach (`supervisor/outage.py`).
        An outage begins now, even with nothing to commit (a session waiting on a long
        model call); its `STORE_UNAVAILABLE` events are tried like any failed commit."""
        if self._journal_failing or self.journal is None or not self._waiting_sessions():
            return  # (a failed commit began it and tries again on its timer; or none waits)
        self._commit_failed(JournalError(error))

    def _waiting_sessions(self) -> list[Session]:
        """The sessions an outage makes wait: runs under way held here."""
        held = self.ownership.fence.epochs if self.ownership is not None else {}
        return [s for s in self.sessions.values() if not s.run_over and s.id in held]

    def _end_runs(self, error: str, message: str) -> None:
        """End every run under way with `ERROR` (the journal cannot keep them going)."""
        for session in list(self.sessions.values()):
            if not session.run_over and session.driver is not None:
                self.dispatcher.abort_session(session.id)
                session.driver.fail(error, message)  # `ERROR` now, its task aborted

    def reply_committed(self, env: Envelope, peer: bytes | None, port: Port | None = None) -> None:
        """Send `env` (on `port`, default the api) once what this iteration emitted is
        journaled: a client told that a run started, or was cancelled, must find it so
        after a supervisor restart."""
        port = port or self.api
        if self._flush_scheduled or self._journal_failing:
            self._after_commit.append((port, env, peer))
            self._schedule_flush()  # (a reply does not wait for more TOKENs)
        else:
            port.reply(env, peer)

    def unwritable(self) -> str:
        """Why the session log cannot take more now (its disk low, its commits failing),
        or "" (no log: nothing to write)."""
        low = self.journal.log.low_space() if self.journal is not None else ""
        if self.outage.active:
            return f"the store is unavailable ({self.outage.error}): try again when it is back"
        if low or self._journal_failing:
            return low or "the session log cannot be written: try again later"
        return ""

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of the supervisor's task group (cancelled with it)."""
        assert self._group is not None
        return self._group.create_task(coro, name=name)

    async def _keep_reserve(self) -> None:
        """Remake the session log's reserve once the disk has room again."""
        while self.journal is not None:
            await asyncio.sleep(RESERVE_CHECK_S)
            self.journal.log.keep_reserve()

    # -- sessions: in memory while running, else in the log ----------------------------

    def resend(self, sid: str, req: ReplayRequest) -> ReplayBatch | ErrorReply:
        """Events `req` asks for, from the session log (the broadcaster lost them): `replay.py`.

        What this loop iteration emitted is committed (and pushed) first. The broadcaster
        asks for what `ListSessions` reported, whose `last_seq` counts an event from its
        emit, and the request can be served in the same iteration as that report, before
        the commit `emit` scheduled. Answered from the log alone, events not written yet
        would be "gone": the broadcaster would skip them, refuse them as duplicates once
        pushed, and every viewer would see a hole.
        """
        if self.journal is None:
            return ErrorReply("gone", "this supervisor keeps no journal")
        if self._flush_scheduled:
            self._flush()
        return replay_batch(self.journal.log, sid, req, self._unjournaled)

    # -- api ---------------------------------------------------------------------------

    def _lease_expired(self, sid: str) -> None:
        """A run another host asked for lost its asker: end it as a UI cancel would."""
        session = self.sessions.get(sid)
        if session is None or session.run_over:
            return
        self.dispatcher.abort_session(sid)
        if session.driver is not None:
            session.driver.cancel(CancelMode.UI, "lease expired: the asking host went silent")
        elif session.task is not None:
            session.task.cancel()

    def handle_api(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Requests of clients (`supervisor/api.py`)."""
        serve_api(self, peer, env)

    # -- retention ---------------------------------------------------------------------

    def forget_sessions(self, sids: list[str]) -> None:
        """Drop `sids` from memory and tell the broadcaster to drop their logs (behind
        whatever this iteration emitted, which goes out first)."""
        if self._flush_scheduled:
            self._flush()
        gone = set(sids)
        for sid in sids:
            self.sessions.pop(sid, None)
        for key in [k for k, started in self._starts.items() if started.session in gone]:
            del self._starts[key]
        self.push.forget(sids)

    # -- running -----------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        """Sessions by state, workers, jobs, and per-port counters."""
        states: dict[str, int] = {}
        for s in self.sessions.values():
            states[s.state] = states.get(s.state, 0) + 1
        return {
            "sessions": states,
            "outbox": len(self.push.outbox),
            "outbox_bytes": self.push.outbox_bytes,
            "journal_failing": self._journal_failing,
            "pending_events": len(self._unjournaled),
            **self.dispatcher.statistics(),
            "mcp": self.dispatcher.mcp_servers(),
            "ports": self.reactor.statistics(),
            "auth": self.gate.statistics() if self.gate else {},
            "ask": self.asker.statistics(),
            "store": self._store_overview(),
            "forwarding": self.forwarder.statistics() if self.forwarder is not None else {},
        }

    def _store_overview(self) -> dict[str, Any]:
        """The shared store for `oploop status`: hosts and leases, or (unavailable) since
        when and the sessions waiting, without trying to reach it from the loop."""
        if self.ownership is None:
            return {}
        unavailable = self.outage.overview()
        if not unavailable:
            return self.ownership.overview()
        return {**self.ownership.overview(read=False), "unavailable": unavailable}

    async def serve(self) -> None:
        """Serve until cancelled; runs in flight then are left to the next supervisor."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                if self.ownership is not None:
                    # This host id's former leases taken back before a run can start here
                    # (one begun meanwhile had its lease taken at the next epoch too, and a
                    # commit of it in between was refused as a lease lost); within
                    # `RENEW_WAIT_S`, a store slow or away is retried by `ownership.run`.
                    await self.ownership.tick(time.monotonic(), mine=True)
                group.create_task(self.reactor.run(), name="reactor")
                group.create_task(self.dispatcher.beat(), name="heartbeat")
                group.create_task(self.push.drain(), name="outbox")
                group.create_task(self._keep_reserve(), name="reserve")
                if self.ownership is not None:  # (what the first pass claimed resumes)
                    group.create_task(self.ownership.run(), name="leases")
                elif self.resume_at_start:
                    self.runs.resume_journaled()
                if self.pruner is not None:  # at start, then every [retention] every
                    group.create_task(self.pruner.run(), name="retention")
                notify_ready()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.runs.suspend()
                    raise
        finally:
            if self.journal is not None:
                if self.journal.batch and not self._journal_failing:
                    self._flush()  # what this iteration emitted still goes out
                if self.ownership is not None:
                    self.ownership.hand_over()
                    self.ownership.close()
                if self.forwarder is not None:
                    self.forwarder.close()
                self.journal.close()
            if self.pruner is not None:
                self.pruner.close()
            self.leases.close()
            self.dispatcher.forgets.close()
            await self.asker.aclose()
            self.reactor.close()
            if self.gate is not None:
                self.gate.stop()
            if self.tracer is not None:
                self.tracer.shutdown()  # the runs' open spans, and what waits for export


async def _main(settings: Settings) -> None:
    endpoints = Endpoints.for_home(settings.home)  # the supervisor always runs beside its host
    limits = settings.config.limits
    store = open_store(settings.home, settings.config.store.url,
                       reserve_mb=limits.journal_reserve_mb)
    journal = Journal(settings.home / SESSIONS_FILE, limits.journal_reserve_mb,
                      limits.compact_every_kb, store)
    supervisor = Supervisor(endpoints, settings.config, journal)
    supervisor.resume_at_start = settings.restarted or not settings.embedded
    supervisor.runs.end_at_stop = settings.embedded
    # Restarted by the host, alone: its executors may still run the calls in flight.
    supervisor.runs.adopt = settings.restarted
    # A worker going after our host died went with it: we stop, its calls are not ours
    # to write off (`Dispatcher._host_died`).
    supervisor.dispatcher.host_gone = host_gone
    supervisor.dispatcher.on_host_gone = stop_now
    if settings.traces is not None:  # the SDK is imported only then
        nossl.let_in()  # (its OTLP/HTTP exporter may post to https: `__main__` kept ssl out)
        from actors.tracing import RunTracer

        supervisor.trace_with(RunTracer(capture=settings.traces.capture_content))
    if is_pg_url(settings.config.store.url):  # a store other hosts may share: leases
        from actors.peerhosts import control_address, reach_of
        from actors.pglog import PgSessionLog
        from actors.supervisor.forwarding import Forwarder
        from actors.supervisor.ownership import Ownership, host_id, host_name

        assert isinstance(store, PgSessionLog)
        supervisor.ownership = Ownership(
            store, host_id(settings.home), host_name(settings.home),
            settings.config.store.lease_s, claims=supervisor.resume_at_start,
            lost=supervisor.leases_lost, unreachable=supervisor.store_unreachable,
            claimed=supervisor.runs.resume_claimed)
        # The others reach it there, and place new sessions on it unless it is embedded
        # (whose runs end with the CLI that started it).
        supervisor.ownership.control = control_address(settings.home)
        supervisor.ownership.reach = reach_of(settings.home)
        supervisor.ownership.placeable = not settings.embedded
        if supervisor.gate is not None:  # the other hosts' forwarded requests come in
            keyring = supervisor.gate.keyring
            supervisor.ownership.admit = functools.partial(setattr, keyring, "hosts")
        supervisor.forwarder = Forwarder(supervisor.ownership, supervisor.reactor,
                                         supervisor.spawn, settings.home)
    # Retention works on the session log itself (`sessions_overview`, `remove`).
    supervisor.pruner = Pruner(settings.config.retention, journal.log,
                               Tombstones(journal.path), supervisor.running_sessions,
                               supervisor.forget_sessions,
                               functools.partial(remove_workspaces_apart, settings.home))
    await supervisor.serve()


def main() -> None:
    """Entry point of `python -m actors.supervisor`."""
    run_actor("supervisor", _main)
