"""What went wrong with a model call, in our words: the SDK's errors translated once."""

from __future__ import annotations

import email.utils
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

#: HTTP statuses worth another attempt (the rest of 4xx are the caller's fault).
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class StreamStalled(Exception):
    """No content delta for `idle_s` seconds (pings do not count)."""

    def __init__(self, idle_s: float) -> None:
        super().__init__(f"stream stalled: no content for {idle_s:g} s")
        self.idle_s = idle_s


class StreamIncomplete(Exception):
    """The stream ended cleanly but without `message_stop`: the reply is partial."""

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


class CallFailed(Exception):
    """Raised by the retry loop when the last attempt failed or the failure is final."""

    def __init__(self, failure: CallFailure, attempts: int) -> None:
        super().__init__(f"{failure.error}: {failure.message} (after {attempts} attempt(s))")
        self.failure = failure
        self.attempts = attempts
