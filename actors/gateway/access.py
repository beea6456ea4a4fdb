"""Who may use the gateway: the holder of the host's web token.

The token is made by the first host started with a gateway (`urls.load_token`:
`$OPLOOP_HOME/web.token`, 0600) and kept, so a page's address stays valid across
restarts. Every request must carry it:
`Authorization: Bearer TOKEN` (programs, Prometheus), or the cookie that a first
visit with `?token=TOKEN` sets (the page, its scripts and its streams). Anything
else is answered 401 and told nothing more.

The cookie keeps to this gateway. Browsers send a cookie to every port of the
host name that set it, so a cookie set by `http://127.0.0.1:7480` would also go
to any other service on 127.0.0.1 (its pages could then read it from their own
requests). On loopback the page therefore lives at a host name of its own,
`oploop-<id>.localhost` (`urls.page_host`: browsers resolve every `*.localhost`
name to loopback themselves, RFC 6761), and the cookie is set only there: no
other local service is reached under that name, so none receives it. A first
visit at 127.0.0.1 with `?token=` is redirected there, and no cookie is ever set
for 127.0.0.1 itself. The cookie is `HttpOnly` (no script reads it),
`SameSite=Strict` (no request that another site starts carries it, top-level
navigations included), `Path=/`, and named after the gateway's token
(`oploop_<id>`), so two gateways in one browser never overwrite each other's.
Off loopback (HTTPS with a certificate for the host's name) it is also
`Secure`, on that name.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from actors.gateway.urls import cookie_name, hostname, page_host

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The cookie older gateways set on 127.0.0.1 (every local service received it):
#: deleted when a browser that still holds it comes by.
LEGACY_COOKIE = "oploop_token"


def local_path(path: str) -> str:
    """`path` as a redirect target that stays on this gateway: `//evil.com/` (which a
    browser reads as another site) and `/\\evil.com` become `/evil.com/`-like paths."""
    return "/" + path.lstrip("/\\")


def require(token: str, *, secure: bool = False, loopback: bool = True) -> Middleware:
    """The middleware that lets through only requests carrying `token` (`secure`: the
    cookie is sent over HTTPS only; `loopback`: the cookie lives on the page's own
    host name, `urls.page_host`)."""
    name = cookie_name(token)
    own_host = page_host(token)

    def valid(given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), token.encode())

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if valid(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None) \
                or valid(request.cookies.get(name)):
            return await handler(request)
        if request.method == "GET" and valid(request.query.get("token")):
            path = local_path(request.rel_url.path)
            if loopback and hostname(request.host) != own_host:
                # To the page's own name, token and all; the cookie is set there.
                port = request.url.port
                moved = web.HTTPFound(request.url.with_host(own_host).with_port(port)
                                      .with_path(path).with_query(request.query))
                if LEGACY_COOKIE in request.cookies:  # set here by an older gateway: gone
                    moved.del_cookie(LEGACY_COOKIE, path="/")
                raise moved
            # A first visit: keep the token in a cookie, and take it out of the address
            # (and so of the history and of what the page's links pass on).
            query = {k: v for k, v in request.query.items() if k != "token"}
            resp = web.HTTPFound(request.rel_url.with_path(path).with_query(query))
            resp.set_cookie(name, token, httponly=True, samesite="Strict", path="/",
                            secure=secure or None)
            raise resp
        return web.json_response({"error": "unauthorized", "message": "a token is required"},
                                 status=401)

    return check
