"""What an HTTP server's error answers mean: the status and reason they came with, and
whether the server lost our session.

The SDK's streamable HTTP client turns an HTTP error into a JSON-RPC error of its own
("Server returned an error response", "Session terminated") and drops the status; a
response hook on the `httpx2` client we give it (`HttpStatus.hook`) keeps the last one,
so an error can say `HTTP 401 Unauthorized` and a 404 can be told from a tool's error.
"""

from __future__ import annotations

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
        self._at = 0.0

    async def hook(self, response: Any) -> None:
        """An `httpx2` response event hook: keep an error status of a POST (what a call
        or `initialize` was answered; the GET stream's own errors are not a call's)."""
        if response.status_code >= 400 and response.request.method == "POST":
            self.code = response.status_code
            self.reason = response.reason_phrase or ""
            self._at = time.monotonic()

    def recent(self) -> int:
        """The status of an error answer of the last `FRESH_S` seconds (0: none)."""
        return self.code if self.code and time.monotonic() - self._at < FRESH_S else 0

    def forget(self) -> None:
        """A new session: its errors are its own."""
        self.code, self.reason, self._at = 0, "", 0.0


def lost_session(error: types.ErrorData, status: HttpStatus) -> bool:
    """Whether `error` says the server does not know our session (it restarted, or
    expired it): a 404, or a 400 naming the session, or the words of one."""
    code = status.recent()
    return code == 404 or bool(_LOST.search(error.message)) and code in (0, 400, 404)


def http_cause(error: types.ErrorData, status: HttpStatus, server: str = "") -> str:
    """`error` with the HTTP status and reason it came with, and what to do about it."""
    code = status.recent()
    said = f"error {error.code}: {error.message}"
    if not code:
        return said
    head = f"HTTP {code} {status.reason}".rstrip()
    advice = _ADVICE.get(code)
    if advice:
        return f"{advice.format(name=server)} ({head}; {said})"
    return f"{head} ({said})"
