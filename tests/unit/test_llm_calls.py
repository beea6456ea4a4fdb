"""The retry loop against a fake backend (the real `ModelBackend` interface)."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.llm_caller.calls import call_with_retries
from actors.llm_caller.failures import CallFailed, StreamStalled
from actors.llm_caller.policy import RetryPolicy

MESSAGE = {"role": "assistant", "content": [{"type": "text", "text": "ok"}],
           "stop_reason": "end_turn"}


class FlakyBackend:
    """Streams fail `failures` times (stalled), then succeed; records what was called."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[str] = []

    async def stream(self, request, on_delta, *, bounds, timeout_s):
        self.calls.append("stream")
        on_delta("text", "partial")
        if len(self.calls) <= self.failures:
            raise StreamStalled(bounds.idle_s)
        return MESSAGE

    async def create(self, request, *, timeout_s):
        self.calls.append("create")
        return MESSAGE

    async def aclose(self):
        pass


def call(backend, deadline, attempts=6):
    retries = []
    policy = RetryPolicy(attempts=attempts, base_s=0.001, cap_s=0.01)
    result = asyncio.run(call_with_retries(
        backend, policy, {"model": "m"}, stream=True, deadline=deadline,
        on_delta=lambda channel, text: None, on_retry=lambda *a: retries.append(a),
    ))
    return result, retries


def test_a_stream_dying_near_the_deadline_falls_back_to_one_plain_call():
    backend = FlakyBackend(failures=1)
    result, retries = call(backend, deadline=time.time() + 5)  # inside the 15 s window
    assert backend.calls == ["stream", "create"] and result == MESSAGE
    assert retries[0][0] == 1 and "stall" in retries[0][1]


def test_far_from_the_deadline_it_streams_again():
    backend = FlakyBackend(failures=2)
    call(backend, deadline=time.time() + 600)
    assert backend.calls == ["stream", "stream", "stream"]


def test_attempts_are_bounded():
    backend = FlakyBackend(failures=99)
    with pytest.raises(CallFailed) as failed:
        call(backend, deadline=time.time() + 600, attempts=3)
    assert failed.value.attempts == 3 and len(backend.calls) == 3
    assert failed.value.errors == ["stream_stalled"] * 3
    assert "gave up after 3 attempts in" in failed.value.message


def test_a_reply_not_streamed_is_told_to_on_delta_whole():
    backend = FlakyBackend(failures=1)
    told = []
    policy = RetryPolicy(attempts=2, base_s=0.001, cap_s=0.01)
    asyncio.run(call_with_retries(
        backend, policy, {"model": "m"}, stream=True, deadline=time.time() + 5,
        on_delta=lambda channel, text: told.append((channel, text)), on_retry=lambda *a: None))
    assert told == [("text", "partial"), ("text", "ok")]  # the void attempt's, then the reply


def test_a_whole_call_bound_ends_it_as_a_timeout():
    class Hanging(FlakyBackend):
        async def create(self, request, *, timeout_s):
            await asyncio.Event().wait()

    with pytest.raises(CallFailed) as failed:
        asyncio.run(call_with_retries(
            Hanging(0), RetryPolicy(attempts=2), {"model": "m"}, stream=False, deadline=None,
            on_delta=lambda *a: None, on_retry=lambda *a: None, total_s=0.05))
    assert failed.value.failure.error == "timeout" and failed.value.errors == ["timeout"]


def test_retry_after_is_honoured_as_sent_and_the_schedule_doubles():
    policy = RetryPolicy(base_s=0.5, cap_s=32.0)
    # retry-after is the server's to set, up to its own cap (beyond: the call fails)
    assert policy.backoff_s(1, 100.0) == 100.0 and policy.backoff_s(1, 1.0) == 1.0
    for n in range(1, 8):
        step = min(32.0, 0.5 * 2 ** (n - 1))
        assert step <= policy.backoff_s(n, None) <= min(32.0, step * 1.5)
