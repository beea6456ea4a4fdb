"""Who may use the gateway: the holder of the host's web token.

The token is made at the gateway's first start (`$OPLOOP_HOME/web.token`, 0600) and
kept, so a page's address stays valid across restarts. Every request must carry it:
`Authorization: Bearer TOKEN` (programs, Prometheus), or the cookie that a first
visit with `?token=TOKEN` sets (the page, its scripts and its streams). Anything
else is answered 401 and told nothing more.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from actors.gateway.urls import TOKEN_FILE

COOKIE = "oploop_token"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_token(home: Path) -> str:
    """The home's web token, made (0600) if there is none yet."""
    path = home / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if len(token) >= 16:
        return token
    token = secrets.token_urlsafe(24)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def require(token: str, *, secure: bool = False) -> Middleware:
    """The middleware that lets through only requests carrying `token` (`secure`: the
    cookie is sent over HTTPS only)."""

    def valid(given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), token.encode())

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if valid(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None) \
                or valid(request.cookies.get(COOKIE)):
            return await handler(request)
        if request.method == "GET" and valid(request.query.get("token")):
            # A first visit: keep the token in a cookie, and take it out of the address
            # (and so of the history and of what the page's links pass on).
            query = {k: v for k, v in request.query.items() if k != "token"}
            resp = web.HTTPFound(request.rel_url.with_query(query))
            resp.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/",
                            secure=secure or None)
            raise resp
        return web.json_response({"error": "unauthorized", "message": "a token is required"},
                                 status=401)

    return check
