"""The llm caller's attempts: a bare first attempt, tenacity for the rest, counts kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq

from actors.llm_caller.actor import LlmCaller
from actors.llm_caller.failures import StreamStalled
from actors.llm_caller.policy import RetryPolicy
from bus.codec import decode
from bus.endpoints import Endpoints
from bus.messages import Envelope, JobFailed, LlmJob, LlmResult, Retrying

REPLY = {"role": "assistant", "content": [{"type": "text", "text": "ok"}],
         "stop_reason": "end_turn", "model": "m", "usage": {}}


class FlakyBackend:
    """Fails its first `failures` calls with `error`, then answers."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, []

    async def stream(self, request, on_delta, *, bounds, timeout_s):
        return await self.create(request, timeout_s=timeout_s)

    async def create(self, request, *, timeout_s):
        self.calls.append(request)
        if len(self.calls) <= self.failures:
            raise self.error
        return REPLY

    async def aclose(self):
        pass


def run_job(home: str, backend: FlakyBackend, attempts: int = 4):
    """Perform one job; returns the reply and the Retrying notices the supervisor got."""
    endpoints = Endpoints.for_home(Path(home))
    endpoints.prepare()
    ctx = zmq.Context.instance()
    work = ctx.socket(zmq.ROUTER)
    work.bind(endpoints.address("work"))
    policy = RetryPolicy(attempts=attempts, base_s=0.001, cap_s=0.002)

    async def main():
        caller = LlmCaller(endpoints, backend, policy)
        try:
            return await caller.perform(Envelope(LlmJob({"messages": []}), job="j1"))
        finally:
            caller.reactor.close()

    try:
        reply = asyncio.run(main())
        notices = []
        while work.poll(200):
            body = decode(work.recv_multipart()[-1]).body
            if isinstance(body, Retrying):
                notices.append(body)
    finally:
        work.close(linger=0)
    return reply, notices


def test_a_first_attempt_that_succeeds_sends_no_retry(short_home):
    backend = FlakyBackend(0, StreamStalled(1))
    reply, notices = run_job(short_home, backend)
    assert isinstance(reply, LlmResult) and len(backend.calls) == 1 and notices == []


def test_retryable_failures_are_retried_and_announced_in_order(short_home):
    backend = FlakyBackend(2, StreamStalled(1))
    reply, notices = run_job(short_home, backend)
    assert isinstance(reply, LlmResult) and len(backend.calls) == 3
    assert [n.attempt for n in notices] == [1, 2]
    assert all(n.error.startswith("stream_stalled") for n in notices)


def test_attempts_run_out_after_the_policy_s_count(short_home):
    backend = FlakyBackend(10, StreamStalled(1))
    reply, notices = run_job(short_home, backend, attempts=3)
    assert isinstance(reply, JobFailed) and reply.error == "stream_stalled"
    assert len(backend.calls) == 3 and [n.attempt for n in notices] == [1, 2]


def test_a_final_failure_is_not_retried(short_home):
    backend = FlakyBackend(10, ValueError("bug"))
    reply, notices = run_job(short_home, backend)
    assert isinstance(reply, JobFailed) and reply.error == "internal"
    assert len(backend.calls) == 1 and notices == []


class SlowImportBackend:
    """Counts tokens at once, once `preload` (the SDK's import, at a first call) is done."""

    def __init__(self, import_s: float) -> None:
        self.import_s, self.imported = import_s, False

    async def preload(self):
        await asyncio.sleep(self.import_s)
        self.imported = True

    async def count_tokens(self, request, *, timeout_s):
        if not self.imported:
            await self.preload()
        return 42

    async def aclose(self):
        pass


def test_a_first_count_waits_for_the_sdk_import_outside_its_time_limit(short_home,
                                                                        monkeypatch):
    # The caller imports the SDK at its first call: a count that is that first call
    # must not spend its time limit on the import
    import actors.llm_caller.actor as actor

    monkeypatch.setattr(actor, "COUNT_TIMEOUT_S", 0.2)
    endpoints = Endpoints.for_home(Path(short_home))
    endpoints.prepare()

    async def main():
        caller = LlmCaller(endpoints, SlowImportBackend(0.5), RetryPolicy())
        try:
            return await caller.perform(Envelope(LlmJob({"messages": []}, count=True),
                                                 job="j1"))
        finally:
            caller.reactor.close()

    reply = asyncio.run(main())
    assert isinstance(reply, LlmResult), reply
    assert reply.message["usage"] == {"input_tokens": 42}
