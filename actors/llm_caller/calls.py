"""One model call with the retry policy: tenacity attempts, backoff, watchdog, fallback.

Shared by the llm caller process and by the in-process `Runner`, so both retry
exactly alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.llm_caller.backend import ModelBackend, OnDelta
from actors.llm_caller.failures import (
    CallFailed,
    CallFailure,
    RetryAfterTooLong,
    StreamStalled,
    classify,
)
from actors.llm_caller.policy import RetryPolicy

if TYPE_CHECKING:
    from tenacity import RetryCallState

log = logging.getLogger("oploop.llm")

#: Told before each retry: (failed attempt number, "error: message", wait in s, and
#: after a stall the bound that fired, in s, else 0).
OnRetry = Callable[[int, str, float, float], None]


async def call_with_retries(
    backend: ModelBackend,
    policy: RetryPolicy,
    request: dict[str, Any],
    *,
    stream: bool,
    deadline: float | None,
    on_delta: OnDelta,
    on_retry: OnRetry,
    total_s: float | None = None,
) -> dict[str, Any]:
    """The model's reply to `request`; `CallFailed` once retries are spent or the
    failure is final. A stream that dies close to `deadline` is retried once
    without streaming, which cannot stall mid-way. A reply that was not streamed
    is passed to `on_delta` whole (text and thinking), so it is seen like a
    streamed one. A `retry-after` beyond `policy.retry_after_cap_s` fails the call.
    `total_s` bounds the whole call, retries included (the intent router's)."""
    if total_s is None:
        return await _call(backend, policy, request, stream, deadline, on_delta, on_retry,
                           [])
    preload = getattr(backend, "preload", None)
    if preload is not None:  # the SDK's import (seconds, once) is not the call's time
        await preload()
    errors: list[str] = []
    started = time.time()
    try:
        async with asyncio.timeout(total_s):
            return await _call(backend, policy, request, stream, deadline, on_delta, on_retry,
                               errors)
    except TimeoutError:
        failure = CallFailure("timeout", f"no reply within {total_s:g} s", False)
        raise CallFailed(failure, len(errors) + 1, [*errors, "timeout"],
                         time.time() - started) from None


async def _call(
    backend: ModelBackend, policy: RetryPolicy, request: dict[str, Any], stream: bool,
    deadline: float | None, on_delta: OnDelta, on_retry: OnRetry, errors: list[str],
) -> dict[str, Any]:
    started = time.time()
    deadline = deadline or started + policy.request_timeout_s
    use_stream = stream  # `errors`: each failed attempt's error class, in order
    # A stall widens the bound that fired for the next attempt (`StreamBounds.widened`).
    bounds = policy.bounds

    async def attempt_once() -> dict[str, Any]:
        nonlocal bounds
        timeout_s = max(1.0, deadline - time.time())
        try:
            if use_stream:
                return await backend.stream(request, on_delta, bounds=bounds,
                                            timeout_s=timeout_s)
            reply = await backend.create(request, timeout_s=timeout_s)
        except StreamStalled as exc:
            errors.append("stream_stalled")
            bounds = bounds.widened(exc)
            raise
        except Exception as exc:
            failure = classify(exc)
            errors.append(failure.error)
            hint = failure.retry_after_s
            if failure.retryable and hint is not None and hint > policy.retry_after_cap_s:
                raise RetryAfterTooLong(failure, policy.retry_after_cap_s) from exc
            raise
        replay(reply, on_delta)
        return reply

    def gave_up(exc: BaseException, attempts: int) -> CallFailed:
        return CallFailed(classify(exc), attempts, errors, time.time() - started)

    def before_retry(failed: int, exc: BaseException | None, wait_s: float) -> None:
        nonlocal use_stream
        failure = classify(exc) if exc else None
        if use_stream and deadline - time.time() - wait_s < policy.fallback_window_s:
            use_stream = False
        error = f"{failure.error}: {failure.message}" if failure else "unknown"
        log.info("attempt %d failed (%s); retrying in %.2fs", failed, error, wait_s)
        on_retry(failed, error, wait_s, exc.seconds if isinstance(exc, StreamStalled) else 0.0)

    # The first attempt runs bare: nearly every call succeeds at once, and building
    # tenacity's machinery costs ~25-45 us a call here, worth paying after a failure.
    try:
        return await attempt_once()
    except Exception as exc:
        first = classify(exc)
        if not first.retryable or policy.attempts <= 1:
            raise gave_up(exc, 1) from exc
        first_wait = policy.backoff_s(1, first.retry_after_s)
        before_retry(1, exc, first_wait)
    await asyncio.sleep(first_wait)
    # Imported here, after a first failure and its backoff, not at start: nearly every
    # call succeeds at once, and an idle llm caller held tenacity (~0.45 MiB resident)
    # for nothing; its import (~10 ms, once) is small beside the backoff before it.
    from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

    # tenacity counts from 1 again: its attempt n is the call's attempt n + 1.
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hint = classify(exc).retry_after_s if exc else None
        return policy.backoff_s(state.attempt_number + 1, hint)

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        before_retry(state.attempt_number + 1, exc, state.upcoming_sleep)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts - 1),
        wait=wait,
        retry=retry_if_exception(lambda e: classify(e).retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    attempts = 1
    try:
        async for attempt in retrying:
            with attempt:
                attempts += 1
                return await attempt_once()
    except Exception as exc:
        raise gave_up(exc, attempts) from exc
    raise AssertionError("unreachable: tenacity either returns or raises")


def replay(reply: dict[str, Any], on_delta: OnDelta) -> None:
    """A reply that was not streamed, told to `on_delta` block by block."""
    for block in reply.get("content") or ():
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            on_delta("text", block["text"])
        elif kind == "thinking" and block.get("thinking"):
            on_delta("thinking", block["thinking"])

