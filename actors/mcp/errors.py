"""What an HTTP server's error answers mean: the status and reason they came with, and
whether the server lost our session.

The SDK's streamable HTTP client turns an HTTP error into a JSON-RPC error of its own
("Server returned an error response", "Session terminated") and drops the status; a
response hook on the `httpx2` client we give it (`HttpStatus.hook`) keeps the last one,
so an error can say `HTTP 401 Unauthorized` and a 404 can be told from a tool's error.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mcp_types as types

#: An error answer older than this is not the cause of an error seen now.
FRESH_S = 30.0
#: How servers say they do not know a session: the SDK's own servers ("Session not
#: found"), its client's stand-in for a 404 ("Session terminated"), the TypeScript
#: SDK's 400 ("Bad Request: No valid session ID provided").
_LOST = re.compile(r"session (?:not found|terminated|expired)|no valid session|"
                   r"unknown session|invalid session", re.IGNORECASE)

#: The most of an error answer's body read for what it says.
BODY_BYTES = 64 * 1024

#: What to do about an HTTP status, said after it.
_ADVICE = {
    401: "unauthorized: check headers or run `oploop mcp login {name}`",
    403: "forbidden: the credentials in headers may not use this server",
}


class HttpStatus:
    """The last HTTP error status (>= 400) an HTTP server answered, with its reason."""

    def __init__(self) -> None:
        self.code = 0
        self.reason = ""
        #: The JSON-RPC error message of its body, if it had one (the SDK drops one
        #: without an `id`, as the TypeScript SDK's servers send their 400s).
        self.said = ""
        self._at = 0.0

    async def hook(self, response: Any) -> None:
        """An `httpx2` response event hook: keep an error status of a POST (what a call
        or `initialize` was answered; the GET stream's own errors are not a call's)."""
        if response.status_code >= 400 and response.request.method == "POST":
            self.code = response.status_code
            self.reason = response.reason_phrase or ""
            self._at = time.monotonic()
            self.said = await _error_message(response)

    def recent(self) -> int:
        """The status of an error answer of the last `FRESH_S` seconds (0: none)."""
        return self.code if self.code and time.monotonic() - self._at < FRESH_S else 0

    def forget(self) -> None:
        """A new session: its errors are its own."""
        self.code, self.reason, self.said, self._at = 0, "", "", 0.0


async def _error_message(response: Any) -> str:
    """`error.message` of a small JSON error body ("" otherwise); read here, the SDK
    reads the same bytes again (kept by the response)."""
    size = response.headers.get("content-length", "")
    if not response.headers.get("content-type", "").startswith("application/json") or \
            not size.isdigit() or int(size) > BODY_BYTES:
        return ""
    try:
        body = json.loads(await response.aread())
        message = body["error"]["message"]
    except Exception:  # (any body at all: it only adds words to an error)
        return ""
    return message[:500] if isinstance(message, str) else ""


def lost_session(error: types.ErrorData, status: HttpStatus) -> bool:
    """Whether `error` says the server does not know our session (it restarted, or
    expired it): a 404, or a 400 naming the session, or the words of one."""
    code = status.recent()
    words = f"{error.message} {status.said if code else ''}"
    return code == 404 or bool(_LOST.search(words)) and code in (0, 400, 404)


def http_cause(error: types.ErrorData, status: HttpStatus, server: str = "") -> str:
    """`error` with the HTTP status and reason it came with, and what to do about it."""
    code = status.recent()
    said = f"error {error.code}: {error.message}"
    if not code:
        return said
    if status.said and status.said not in error.message:
        said += f"; it said: {status.said}"
    head = f"HTTP {code} {status.reason}".rstrip()
    advice = _ADVICE.get(code)
    if advice:
        return f"{advice.format(name=server)} ({head}; {said})"
    return f"{head} ({said})"
