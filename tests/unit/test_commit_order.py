"""What leaves for a worker before this turn's events are in the session log, and what
waits for them: a tool job leaves only once its `TOOL_START` is committed (a call the log
does not show started would be neither answered "interrupted" after a crash nor kept from
running twice), whatever else was sent or scheduled in the same turn of the loop; a model
call needs no commit (made again after a crash: nothing is lost).

A real `Supervisor` with its session log on disk; the work socket is a recording fake of
`bus.sockets.Port`'s sending side that notes, at each send, how far the log has the
session's events.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from supervisorkit import add_session, loop_turns, supervisor_on_disk

from actors.core.session import Session
from actors.sessionlog import JournalFull
from actors.supervisor.journal import Journal
from bus.codec import decode
from bus.messages import Envelope, LlmJob, Ready, ToolJob
from bus.vocab import EventType


class LoggedPipe:
    """The work socket's sending side: each job sent, with the last seq of its session
    in the session log at that moment (None: nothing of it there yet)."""

    user_id = None
    peer_address = None

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.sent: list[tuple[str, str, int | None]] = []  # (kind, sid, last seq in the log)

    def send(self, env: Envelope, peer: bytes | None = None) -> None:
        self.sent.append((env.kind, env.sid, self.journal.log.last_seq(env.sid)))

    def send_frame(self, frame: bytes, peer: bytes | None = None) -> None:
        self.send(decode(frame), peer)

    def jobs(self) -> list[tuple[str, str, int | None]]:
        return [sent for sent in self.sent if sent[0] in (LlmJob.KIND, ToolJob.KIND)]


class Host:
    """A supervisor with its log, an executor and an llm caller registered on `work`."""

    def __init__(self, home: str) -> None:
        _, self.journal, self.supervisor = supervisor_on_disk(home)
        self.work = LoggedPipe(self.journal)
        dispatcher = self.supervisor.dispatcher
        dispatcher.work = self.work  # type: ignore[assignment]
        dispatcher.handle_work(b"ex", Envelope(Ready("tool", 4, [], "", []), id="1"), b"")
        dispatcher.handle_work(b"llm", Envelope(Ready("llm", 8, [], "", []), id="1"), b"")

    def session(self, sid: str) -> Session:
        return add_session(self.supervisor, sid)

    def model_call(self, session: Session) -> None:
        self.supervisor.dispatcher.submit("llm", LlmJob({"messages": []}, False),
                                          sid=session.id, deadline=0.0,
                                          on_progress=lambda env: None)

    def tool_call(self, session: Session, call: str) -> None:
        """What the run's driver does: `TOOL_START`, then the job, in one step."""
        self.supervisor.emit(session, EventType.TOOL_START, 1,
                             {"call_id": call, "name": "read_file", "input": {}})
        self.supervisor.dispatcher.submit("tool", ToolJob("read_file", {"path": "x"},
                                                          call_id=call),
                                          sid=session.id, deadline=0.0,
                                          on_progress=lambda env: None)

    def close(self) -> None:
        self.supervisor.reactor.close()
        self.journal.close()


@pytest.fixture
def host(short_home):
    made = Host(short_home)
    yield made
    made.close()


def test_a_tool_job_leaves_only_once_its_tool_start_is_in_the_log(host):
    """The outbox's turn was scheduled first (a model call of another session, no event
    with it), the commit after it: the tool job still waits for the commit."""
    a, b = host.session("sa"), host.session("sb")

    async def scenario() -> None:
        host.supervisor.emit(a, EventType.SESSION_START, 0, {})
        await loop_turns()  # (sa's first event committed: the log knows it)
        host.model_call(b)  # schedules the outbox's send before any commit is
        host.tool_call(a, "c1")  # TOOL_START is seq 2
        await loop_turns()

    asyncio.run(scenario())
    assert host.work.jobs() == [(LlmJob.KIND, "sb", None), (ToolJob.KIND, "sa", 2)]


def test_a_tool_job_waiting_for_a_failing_commit_leaves_only_once_it_succeeds(
        host, monkeypatch):
    """A full disk: the commit of `TOOL_START` fails, and the job does not leave; a model
    call meanwhile waits with it (the outbox goes in one burst when it holds a tool job).
    Once the commit succeeds both go, the tool job with its `TOOL_START` in the log."""
    a, b = host.session("sa"), host.session("sb")
    commit = host.journal.log.commit

    def full(*args: Any, **kwargs: Any) -> None:
        raise JournalFull("disk full")

    async def scenario() -> None:
        monkeypatch.setattr(host.journal.log, "commit", full)
        host.tool_call(a, "c1")
        await loop_turns()
        assert host.supervisor._journal_failing
        assert host.work.jobs() == []
        host.model_call(b)
        await loop_turns()
        assert host.work.jobs() == []
        monkeypatch.setattr(host.journal.log, "commit", commit)  # room again
        host.supervisor._retry_flush()
        await loop_turns()

    asyncio.run(scenario())
    assert host.work.jobs() == [(ToolJob.KIND, "sa", 1), (LlmJob.KIND, "sb", None)]



def test_model_calls_need_no_commit(host):
    """The outbox's turn, come before the commit's, sends model calls at once (made again
    after a crash: nothing is lost), and holds them with a tool job in the same burst."""
    a, b = host.session("sa"), host.session("sb")

    async def scenario() -> None:
        host.model_call(b)  # schedules the outbox's send before any commit is
        host.supervisor.emit(a, EventType.TURN_START, 1, {})
        host.model_call(a)
        await loop_turns()

    asyncio.run(scenario())
    assert host.work.jobs() == [(LlmJob.KIND, "sb", None), (LlmJob.KIND, "sa", None)]
    assert host.journal.log.last_seq("sa") == 1  # (committed right after)
