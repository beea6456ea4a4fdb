"""What went wrong with a model call, in our words: the SDK's errors translated once."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

#: HTTP statuses worth another attempt (the rest of 4xx are the caller's fault).
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class StreamStalled(Exception):
    """A stream made no progress within one of its bounds (`actors.llm_caller.stalls`):
    `bound` is "idle", "first" or "pause", `setting` the variable that sets it, and
    `idle_phase` which of the idle bound's phases the stream was in."""

    def __init__(self, seconds: float, bound: str = "idle",
                 setting: str = "OPLOOP_STREAM_IDLE_S", phase: str = "",
                 idle_phase: str = "between events") -> None:
        what = {
            "idle": f"nothing received for {seconds:g} s",
            "first": f"no content {seconds:g} s after the request",
            "pause": f"no content for {seconds:g} s (pings only)",
        }.get(bound, f"no progress for {seconds:g} s")
        where = f" {phase}" if phase else ""
        super().__init__(f"stream stalled{where}: {what} ({setting})")
        self.seconds, self.bound, self.setting, self.phase = seconds, bound, setting, phase
        self.idle_phase = idle_phase


class StreamMalformed(Exception):
    """The server sent a stream the API never sends (bad JSON, a delta for a block
    never started, a tool input that is not an object): this attempt is void."""

    def __init__(self, fault: str) -> None:
        super().__init__(f"malformed stream: {fault}")
        self.fault = fault


class StreamIncomplete(Exception):
    """The stream ended cleanly but without `message_stop` (after `message_delta`
    too): the reply may be partial, the attempt is retried as truncated."""

    def __init__(self) -> None:
        super().__init__("stream ended without message_stop")


@dataclass(frozen=True, slots=True)
class CallFailure:
    """A failed attempt: a stable `error` tag, whether to retry, and the server's hints."""

    error: str
    message: str
    retryable: bool
    status: int = 0
    retry_after_s: float | None = None


def _retry_after(headers: httpx2.Headers | Any) -> float | None:
    """`retry-after-ms` or `retry-after` (seconds or an HTTP date), when present."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        # (an HTTP date is rare, and the SDK that sends one has loaded `email` anyway:
        # imported here, a scripted caller does without it)
        import email.utils

        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def classify(exc: BaseException) -> CallFailure:
    """Translate any exception of a model call into a `CallFailure`."""
    # The SDK is imported only by the backend that uses it (it costs ~2.6 s and ~90 MB);
    # where it was never imported, no exception can be one of its own.
    sdk = sys.modules.get("anthropic")
    transport = sys.modules.get("httpx2")
    if sdk is not None:
        failure = _classify_sdk(exc, sdk, transport)
        if failure is not None:
            return failure
    if isinstance(exc, StreamStalled):
        return CallFailure("stream_stalled", str(exc), True)
    if isinstance(exc, StreamIncomplete):
        return CallFailure("stream_incomplete", str(exc), True)
    if isinstance(exc, StreamMalformed):
        return CallFailure("stream_malformed", str(exc), True)
    if isinstance(exc, RetryAfterTooLong):
        return CallFailure(exc.failure.error, str(exc), False, exc.failure.status)
    return CallFailure("internal", f"{type(exc).__name__}: {exc}", False)


def _classify_sdk(exc: BaseException, anthropic: Any, httpx2: Any) -> CallFailure | None:
    """The SDK's (and its transport's) exceptions, or None for any other."""
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        kind = exc.type or f"http_{status}"
        message = exc.api_message or str(exc)
        # An `event: error` inside a 200 stream arrives as a status error with 200.
        retryable = status in RETRYABLE_STATUS or status >= 500 or status == 200
        return CallFailure(kind, message, retryable, status, _retry_after(exc.response.headers))
    if isinstance(exc, anthropic.APITimeoutError):
        return CallFailure("timeout", str(exc), True)
    if isinstance(exc, anthropic.APIConnectionError):
        return CallFailure("connection", str(exc.__cause__ or exc), True)
    if httpx2 is not None and isinstance(exc, httpx2.TransportError):
        # A stream dropped mid-way: the SDK lets the transport error through.
        return CallFailure("stream_dropped", f"{type(exc).__name__}: {exc}", True)
    if isinstance(exc, anthropic.AnthropicError):
        return CallFailure("api_error", str(exc), False)
    return None


class RetryAfterTooLong(Exception):
    """The server asked to wait longer than the llm caller's cap: the call fails now."""

    def __init__(self, failure: CallFailure, cap_s: float) -> None:
        super().__init__(
            f"{failure.message}; the server asks to retry after {failure.retry_after_s:g} s, "
            f"beyond the cap of {cap_s:g} s (OPLOOP_RETRY_AFTER_MAX_S)")
        self.failure, self.cap_s = failure, cap_s


class CallFailed(Exception):
    """Raised by the retry loop when the last attempt failed or the failure is final."""

    def __init__(self, failure: CallFailure, attempts: int, errors: list[str] | None = None,
                 elapsed_s: float = 0.0) -> None:
        self.failure = failure
        self.attempts = attempts
        #: Each attempt's error class, in order.
        self.errors = list(errors or [failure.error])
        self.elapsed_s = elapsed_s
        super().__init__(f"{failure.error}: {self.message}")

    @property
    def message(self) -> str:
        """The last failure's message and, after more than one attempt, how many
        over how long with each one's error class (the run's ERROR says it)."""
        if self.attempts <= 1:
            return self.failure.message
        return (f"{self.failure.message} (gave up after {self.attempts} attempts in "
                f"{self.elapsed_s:.1f} s: {', '.join(self.errors)})")
