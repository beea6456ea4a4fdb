"""The gateway process: an aiohttp server in front of one bus client."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from actors.config import HttpConfig
from actors.gateway import access, api
from actors.gateway.feed import Feed
from actors.gateway.limits import (
    HEADER_S,
    MAX_CONNECTIONS,
    MAX_PER_ADDRESS,
    RESERVE_FDS,
    STREAM_FDS,
    LimitedSite,
    Limiter,
    Quiet,
    descriptors_left,
    fitted,
    on_loop_exception,
)
from actors.gateway.metrics import Metrics
from actors.gateway.urls import WEB_URL_FILE, page_host
from actors.runtime import notify_ready, run_actor
from actors.settings import Settings
from bus.client import Client

log = logging.getLogger("oploop.gateway")

#: The page and its scripts, served as they are (no build step).
STATIC = Path(__file__).parent / "static"
#: How long a stopping gateway lets open requests (SSE streams) finish.
SHUTDOWN_S = 0.5


class GatewayError(Exception):
    """The gateway cannot serve (its configured port is taken, ...)."""


class Gateway:
    """The HTTP face of one host: the page, the API, the metrics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.http: HttpConfig = settings.config.http
        self.endpoints = settings.endpoints()
        self.run_dir = self.endpoints.run_dir
        self.max_prompt_chars = settings.config.limits.max_prompt_chars
        # A body holds at most the prompt (UTF-8: up to 4 bytes a char) and a few fields.
        self.max_body = self.max_prompt_chars * 4 + 65_536
        self.metrics = Metrics()
        self.feed = Feed()
        self._client: Client | None = None
        self.url = ""
        #: What every request must carry (`access.py`).
        self.token = access.load_token(settings.home)
        #: The page's own host name on loopback (where the token's cookie lives).
        self.page_host = page_host(self.token)
        #: Overloads (connections, descriptors, slow clients) in one log line an interval.
        self.quiet = Quiet()
        self.limiter = Limiter(MAX_CONNECTIONS, MAX_PER_ADDRESS)
        self.limiter.quiet = self.quiet
        self.streams = 0

    @contextlib.contextmanager
    def stream_slot(self) -> Iterator[None]:
        """Hold one of the `api.MAX_STREAMS` SSE streams (fewer under a low descriptor
        limit) while the block runs; a 503 when none is free, or descriptors run short."""
        cap = fitted(api.MAX_STREAMS, STREAM_FDS)  # under the descriptor limit of now
        if self.streams >= cap:
            self.quiet.warn("streams", f"{cap} SSE streams open: refused another")
            raise api.ApiError(503, "unavailable", f"{cap} streams are open: "
                               "try again later")
        if descriptors_left() < RESERVE_FDS:
            self.quiet.warn("descriptors", "too few descriptors left: refused an SSE stream")
            raise api.ApiError(503, "unavailable", "the gateway is out of descriptors: "
                               "try again later")
        self.streams += 1
        try:
            yield
        finally:
            self.streams -= 1

    @property
    def client(self) -> Client:
        """The bus client (set while serving)."""
        assert self._client is not None, "the gateway is not serving"
        return self._client

    def app(self) -> web.Application:
        """The aiohttp application: API, metrics, page."""
        app = web.Application(
            middlewares=[api.errors, api.guard,
                         access.require(self.token, secure=self.http.tls,
                                        loopback=self.http.loopback)],
            client_max_size=self.max_body)
        app.on_response_prepare.append(api.secure_headers)
        app[api.GATEWAY] = self
        api.add_routes(app)
        app.router.add_get("/", self._page)
        app.router.add_get("/s/{sid}", self._page)
        app.router.add_static("/static/", STATIC)
        return app

    async def _page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def serve(self) -> None:
        """Connect to the host, listen, say ready, and serve until cancelled."""
        async with Client.connect(endpoints=self.endpoints) as client:
            self._client = client
            # A client gone mid-stream cancels its handler (and so closes its SUB socket).
            # keepalive_timeout: a request head must come within HEADER_S of the
            # connection (or of the last answer), else it is closed (`limits.py`).
            runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                   shutdown_timeout=SHUTDOWN_S, keepalive_timeout=HEADER_S)
            asyncio.get_running_loop().set_exception_handler(on_loop_exception(self.quiet))
            await runner.setup()
            url_file = self.run_dir / WEB_URL_FILE
            try:
                self.url = await self._listen(runner)
                tmp = url_file.with_suffix(".tmp")
                tmp.write_text(self.url + "\n")
                os.chmod(tmp, 0o600)
                os.replace(tmp, url_file)
                log.info("gateway serving %s", self.url)
                notify_ready()
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._follow(client), name="follow")
            finally:
                url_file.unlink(missing_ok=True)
                await runner.cleanup()
                self._client = None

    async def _follow(self, client: Client) -> None:
        """Every event published, to the metrics and the sessions list's streams."""
        async for ev in client.live():
            try:
                self.metrics.observe(ev)
                self.feed.publish(ev)
            except (KeyError, TypeError, ValueError) as exc:  # a bad event costs a count
                log.warning("event not counted: %s", exc)

    async def _listen(self, runner: web.AppRunner) -> str:
        """Bind `[http] listen`; the default port, when taken (another host), gives
        way to a free one. Returns the URL served."""
        host, port = self.http.host, self.http.port
        ssl_context = self._ssl_context()
        try:
            await LimitedSite(runner, host, port, ssl_context=ssl_context,
                              limiter=self.limiter).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or self.http.explicit:
                raise GatewayError(f"cannot listen on {self.http.listen} ([http] listen, "
                                   f"OPLOOP_HTTP_LISTEN): {exc.strerror or exc}") from exc
            log.warning("port %d is taken: the gateway listens on a free one", port)
            await LimitedSite(runner, host, 0, ssl_context=ssl_context,
                              limiter=self.limiter).start()
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        return f"{'https' if ssl_context else 'http'}://{shown}:{bound[1]}/"

    def _ssl_context(self) -> ssl.SSLContext | None:
        """HTTPS with `[http] cert` and `key`, else None."""
        if not self.http.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.http.cert, self.http.key)
        except (OSError, ssl.SSLError) as exc:
            raise GatewayError(f"cannot load [http] cert/key: {exc}") from exc
        return context


def main() -> None:
    """Entry point of `python -m actors.gateway`."""

    async def _main(settings: Settings) -> None:
        try:
            await Gateway(settings).serve()
        except GatewayError as exc:
            print(f"oploop gateway: {exc}", file=sys.stderr)
            sys.exit(1)

    run_actor("gateway", _main)
