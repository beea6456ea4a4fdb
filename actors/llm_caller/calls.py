"""One model call with the retry policy: tenacity attempts, backoff, watchdog, fallback.

Shared by the llm caller process and by the in-process `Runner`, so both retry
exactly alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from actors.llm_caller.backend import ModelBackend, OnDelta
from actors.llm_caller.failures import CallFailed, classify
from actors.llm_caller.policy import RetryPolicy

log = logging.getLogger("oploop.llm")

#: Told before each retry: (failed attempt number, "error: message", wait in s).
OnRetry = Callable[[int, str, float], None]


async def call_with_retries(
    backend: ModelBackend,
    policy: RetryPolicy,
    request: dict[str, Any],
    *,
    stream: bool,
    deadline: float | None,
    on_delta: OnDelta,
    on_retry: OnRetry,
) -> dict[str, Any]:
    """The model's reply to `request`; `CallFailed` once retries are spent or the
    failure is final. A stream that dies close to `deadline` is retried once
    without streaming, which cannot stall mid-way."""
    deadline = deadline or time.time() + policy.request_timeout_s
    use_stream = stream

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hint = classify(exc).retry_after_s if exc else None
        return policy.backoff_s(state.attempt_number, hint)

    def before_sleep(state: RetryCallState) -> None:
        nonlocal use_stream
        exc = state.outcome.exception() if state.outcome else None
        failure = classify(exc) if exc else None
        wait_s = state.upcoming_sleep
        if use_stream and deadline - time.time() - wait_s < policy.fallback_window_s:
            use_stream = False
        error = f"{failure.error}: {failure.message}" if failure else "unknown"
        log.info("attempt %d failed (%s); retrying in %.2fs", state.attempt_number, error, wait_s)
        on_retry(state.attempt_number, error, wait_s)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait,
        retry=retry_if_exception(lambda e: classify(e).retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    attempts = 0
    try:
        async for attempt in retrying:
            with attempt:
                attempts += 1
                timeout_s = max(1.0, deadline - time.time())
                if use_stream:
                    return await backend.stream(
                        request, on_delta, idle_s=policy.idle_s, timeout_s=timeout_s
                    )
                return await backend.create(request, timeout_s=timeout_s)
    except Exception as exc:
        raise CallFailed(classify(exc), attempts) from exc
    raise AssertionError("unreachable: tenacity either returns or raises")
