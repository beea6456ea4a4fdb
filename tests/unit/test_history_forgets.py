"""An llm caller lets go of a session's history once the supervisor holds that session
no more (`supervisor/forgets.py`): no delta will ever build on it, and it was dead
weight in the caller until newer histories pushed it out.

The supervisor's side runs on a real `Supervisor` with its session log on disk, the
work socket's sending side recorded; the caller's side is a real `LlmCaller` with the
scripted model, taking `ForgetSessions` as it comes off its work socket (`_on_work`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from supervisorkit import Pipe, add_session, loop_turns, supervisor_on_disk

from actors.core.session import Session
from actors.llm_caller.actor import LlmCaller
from actors.llm_caller.bodies import BodyCache
from actors.llm_caller.histories import HISTORY_MISS, HistoryCache
from actors.llm_caller.scripted import ScriptedBackend
from actors.supervisor import forgets
from bus.endpoints import Endpoints
from bus.messages import Envelope, ForgetSessions, JobFailed, LlmJob, LlmResult, Ready
from bus.vocab import EventType

USER = {"role": "user", "content": "read the file"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "x" * 5_000}]}


def forgets_sent(pipe: Pipe) -> list[tuple[list[str], bytes | None]]:
    """The `ForgetSessions` sent: (sessions, to whom)."""
    return [(env.body.sessions, peer) for env, peer in pipe.sent
            if isinstance(env.body, ForgetSessions)]


# -- the caller's side --------------------------------------------------------------------

def test_a_forgotten_history_frees_its_bytes_and_a_delta_on_it_misses():
    cache = HistoryCache()
    cache.resolve(LlmJob({"messages": [USER, REPLY]}, history_key="s1", rev=1))
    cache.resolve(LlmJob({"messages": [USER]}, history_key="s2", rev=1))
    held = cache.bytes
    dropped = cache.forget(["s1", "unknown"])
    assert dropped == [USER, REPLY] and len(cache) == 1 and cache.bytes < held - 5_000
    assert cache.forget(["s1"]) == []  # (again: nothing)


def test_a_body_cache_lets_go_of_the_json_of_dropped_messages_only():
    cache = BodyCache()
    kept = {"role": "user", "content": "kept"}
    cache.body({"model": "m", "messages": [USER, REPLY, kept]})
    cache.drop([USER, REPLY, {"role": "user", "content": "never encoded"}])
    assert len(cache) == 1
    before = cache.encoded
    body = cache.body({"model": "m", "messages": [kept]})
    assert cache.encoded == before and json.loads(body)["messages"] == [kept]


def _caller(home: Path) -> LlmCaller:
    endpoints = Endpoints.for_home(home)
    caller = LlmCaller(endpoints, ScriptedBackend())
    caller.work = Pipe()  # type: ignore[assignment]
    return caller


def test_an_llm_caller_told_to_forget_a_session_answers_a_delta_on_it_with_a_miss(tmp_path):
    async def main() -> tuple[Any, Any, Any]:
        caller = _caller(tmp_path)
        try:
            first = await caller.perform(Envelope(LlmJob(
                {"model": "m", "max_tokens": 10, "messages": [USER]},
                history_key="s1", rev=1), job="j1"))
            delta = LlmJob({"messages": []}, history_key="s1", base_rev=1, keep=1, rev=2,
                           same_rest=True)
            before = await caller.perform(Envelope(delta, job="j2"))
            caller._on_work(None, Envelope(ForgetSessions(["s1", "s9"])), b"")
            after = await caller.perform(Envelope(delta, job="j3"))
            return first, before, after
        finally:
            caller.reactor.close()

    first, before, after = asyncio.run(main())
    assert isinstance(first, LlmResult) and isinstance(before, LlmResult)
    assert isinstance(after, JobFailed) and after.error == HISTORY_MISS  # (sent in full next)


# -- the supervisor's side ----------------------------------------------------------------

class Host:
    """A supervisor with its log, two llm callers of its own and one of a worker machine
    registered on `work`, which records what is sent."""

    def __init__(self, home: str) -> None:
        _, self.journal, self.supervisor = supervisor_on_disk(home)
        self.work = Pipe()
        dispatcher = self.supervisor.dispatcher
        dispatcher.work = self.work  # type: ignore[assignment]
        for peer, machine in ((b"llm-1", ""), (b"llm-2", ""), (b"far", "far")):
            dispatcher.handle_work(peer, Envelope(Ready("llm", 8, [], machine, []), id="1"),
                                   b"")

    def called(self, sid: str, *callers: bytes) -> Session:
        """A session whose history went to `callers` (what `WorkerIO.call_model` makes)."""
        session = self.supervisor.sessions.get(sid) or add_session(self.supervisor, sid)
        job = session.turn_cache.llm_job(sid, {"messages": [USER]}, False)
        for caller in callers:
            job.for_caller(caller)
        return session

    def model_call(self, sid: str) -> None:
        """A model call of `sid` through the dispatcher (to whichever caller it picks)."""
        self.supervisor.dispatcher.submit("llm", LlmJob({"messages": []}, False), sid=sid,
                                          deadline=0.0, on_progress=lambda env: None)

    def end(self, session: Session) -> None:
        """Its run is over: it leaves memory once that end is committed."""
        self.supervisor.emit(session, EventType.SESSION_START, 0, {})
        self.supervisor.forget_when_committed(session)

    def close(self) -> None:
        self.supervisor.dispatcher.forgets.close()
        self.supervisor.reactor.close()
        self.journal.close()


@pytest.fixture
def host(short_home):
    made = Host(short_home)
    yield made
    made.close()


def test_the_callers_holding_an_ended_session_s_history_are_told_to_drop_it(host):
    async def scenario() -> None:
        a = host.called("sa", b"llm-1", b"llm-2", b"far")
        b = host.called("sb", b"llm-1")
        running = host.called("sc", b"llm-2")
        host.end(a)
        host.end(b)
        host.supervisor.emit(running, EventType.SESSION_START, 0, {})
        await loop_turns()  # (committed: both left memory)
        assert "sa" not in host.supervisor.sessions and "sc" in host.supervisor.sessions
        assert forgets_sent(host.work) == []  # (not one message per ended run)
        host.supervisor.dispatcher.forgets.flush()  # (what its timer does, EVERY_S on)

    asyncio.run(scenario())
    # One message per caller; none to the worker machine's (it may be an older oploop).
    assert sorted(forgets_sent(host.work)) == [(["sa"], b"llm-2"), (["sa", "sb"], b"llm-1")]


def test_a_new_run_s_call_to_that_caller_cancels_its_pending_forget(host):
    async def scenario() -> None:
        host.end(host.called("sa", b"llm-1", b"llm-2"))
        await loop_turns()
        pending = host.supervisor.dispatcher.forgets
        assert pending.pending(b"llm-1") == {"sa"} == pending.pending(b"llm-2")
        host.model_call("sa")  # a follow-up: its call goes to one caller, in full
        await loop_turns()
        taker = next(peer for env, peer in host.work.sent if isinstance(env.body, LlmJob))
        assert pending.pending(taker) == set()
        pending.flush()
        other = b"llm-2" if taker == b"llm-1" else b"llm-1"
        assert forgets_sent(host.work) == [(["sa"], other)]

    asyncio.run(scenario())


def test_the_timer_sends_them_once_and_a_caller_gone_meanwhile_is_skipped(host, monkeypatch):
    monkeypatch.setattr(forgets, "EVERY_S", 0.0)

    async def scenario() -> None:
        host.end(host.called("sa", b"llm-1", b"gone"))
        await loop_turns(5)
        assert forgets_sent(host.work) == [(["sa"], b"llm-1")]
        await loop_turns(5)
        assert forgets_sent(host.work) == [(["sa"], b"llm-1")]  # (once)

    asyncio.run(scenario())
