"""The gateway process: an aiohttp server in front of one bus client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from aiohttp import web

from actors.config import HttpConfig
from actors.gateway import access, api, listen
from actors.gateway.feed import Feed, Notice
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
from actors.gateway.urls import WEB_URL_FILE, load_token, page_host
from actors.runtime import notify_ready, run_actor
from actors.settings import Settings
from bus.client import Client
from bus.errors import BusError
from bus.vocab import TERMINAL, EventType

log = logging.getLogger("oploop.gateway")

#: The page and its scripts, served as they are (no build step).
STATIC = Path(__file__).parent / "static"
#: How long a stopping gateway lets open requests (SSE streams) finish.
SHUTDOWN_S = 0.5
#: How long the first `/api/events` stream waits for its subscription to be in effect.
SUBSCRIBE_WAIT_S = 2.0
#: Cancelled sessions followed to their CANCELLED at once (more are not timed), how
#: long at most, and how long the seq a cancel starts from is asked for.
MAX_CANCEL_WATCHES = 64
CANCEL_WATCH_S = 300.0
CANCEL_SEQ_TIMEOUT_S = 1.0


class GatewayError(Exception):
    """The gateway cannot serve (its configured port is taken, ...)."""


class Gateway:
    """The HTTP face of one host: the page, the API, the metrics."""

    def __init__(self, settings: Settings, sock: socket.socket | None = None) -> None:
        """`sock`: the listening socket to serve (the host's), else `[http] listen`."""
        self.settings = settings
        self.sock = sock
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
        self.token = load_token(settings.home)
        #: The page's own host name on loopback (where the token's cookie lives).
        self.page_host = page_host(self.token)
        #: Overloads (connections, descriptors, slow clients) in one log line an interval.
        self.quiet = Quiet()
        self.limiter = Limiter(MAX_CONNECTIONS, MAX_PER_ADDRESS)
        self.limiter.quiet = self.quiet
        self.streams = 0
        #: The subscription to every session's events and its "in effect" (`notices`).
        self._following: tuple[asyncio.Task[None], asyncio.Event] | None = None
        #: The sessions followed until the CANCELLED of a cancel sent (`timing_cancel`).
        self._cancel_watches: set[asyncio.Task[None]] = set()

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
            # Its own socket's address is published here; the host's, by the host.
            url_file = self.run_dir / WEB_URL_FILE if self.sock is None else None
            try:
                self.url = await self._listen(runner)
                if url_file is not None:
                    listen.write_url(self.run_dir, self.url)
                log.info("gateway serving %s", self.url)
                notify_ready()
                await asyncio.Event().wait()  # requests are served by the runner's tasks
            finally:
                for task in {*self._cancel_watches,
                             *([self._following[0]] if self._following else [])}:
                    task.cancel()
                if url_file is not None:
                    url_file.unlink(missing_ok=True)
                await runner.cleanup()
                self._client = None

    @contextlib.asynccontextmanager
    async def notices(self) -> AsyncIterator[asyncio.Queue[Notice | None]]:
        """One `/api/events` stream's queue of notices (`feed.py`), while the block
        runs. The gateway follows every session's live events only while a stream is
        open: the first one subscribes (and waits, `SUBSCRIBE_WAIT_S` at most, until
        the broadcaster has the subscription: from then on no notice is missed), the
        last one gone unsubscribes. With no web client, a turn costs the gateway nothing."""
        try:
            with self.feed.watch() as queue:
                if self._following is None:
                    subscribed = asyncio.Event()
                    self._following = (asyncio.create_task(self._follow(subscribed),
                                                           name="follow"), subscribed)
                with contextlib.suppress(TimeoutError):  # (a broadcaster restarting)
                    async with asyncio.timeout(SUBSCRIBE_WAIT_S):
                        await self._following[1].wait()
                yield queue
        finally:
            if not self.feed.streams and self._following is not None:
                self._following[0].cancel()
                self._following = None

    async def _follow(self, subscribed: asyncio.Event) -> None:
        """Every event published, to the open `/api/events` streams."""
        async for ev in self.client.live(on_subscribed=subscribed.set):
            try:
                self.feed.publish(ev)
            except (KeyError, TypeError, ValueError) as exc:  # a bad event: no notice
                log.warning("event not published to the list's streams: %s", exc)

    @contextlib.asynccontextmanager
    async def timing_cancel(self, sid: str) -> AsyncIterator[None]:
        """Wrap the forwarding of a cancel of `sid`: once it is accepted, `sid` is
        followed from the seq it was at to its CANCELLED, whose `ts` ends the timing
        (`oploop_gateway_cancel_seconds`; `MAX_CANCEL_WATCHES` sessions at once)."""
        last = None
        if len(self._cancel_watches) < MAX_CANCEL_WATCHES:
            with contextlib.suppress(BusError):  # (then the cancel is not timed)
                last = await self.client.last_seq(sid, timeout=CANCEL_SEQ_TIMEOUT_S)
        sent = time.time()  # the events' `ts` clock (the supervisor's, on this machine)
        yield  # the cancel forwarded: raises when refused, and nothing is timed
        if last is not None:
            task = asyncio.create_task(self._until_cancelled(sid, last + 1, sent),
                                       name=f"cancel {sid}")
            self._cancel_watches.add(task)
            task.add_done_callback(self._cancel_watches.discard)

    async def _until_cancelled(self, sid: str, from_seq: int, sent: float) -> None:
        """Follow `sid` from `from_seq` to its run's end; a CANCELLED is timed."""
        try:
            async with asyncio.timeout(CANCEL_WATCH_S):
                async for ev in self.client.events(sid, from_seq, stop_at="first"):
                    if ev["type"] == EventType.CANCELLED:
                        self.metrics.cancel_seconds.observe(max(0.0, ev["ts"] - sent))
                    if ev["type"] in TERMINAL:
                        return
        except (TimeoutError, BusError) as exc:  # ended otherwise (removed, ...): untimed
            log.debug("cancel of %s not timed: %s", sid, exc)

    async def _listen(self, runner: web.AppRunner) -> str:
        """Serve the socket the host bound (`listen.py`), or bind `[http] listen` here
        (run alone). Returns the URL served."""
        try:
            ssl_context = listen.ssl_context(self.http)
            sock = self.sock if self.sock is not None else listen.bind(self.http)
        except listen.ListenError as exc:
            raise GatewayError(str(exc)) from exc
        await LimitedSite(runner, sock, ssl_context=ssl_context, limiter=self.limiter,
                          backlog=listen.BACKLOG).start()
        return listen.url_of(sock, ssl_context is not None)


def main() -> None:
    """Entry point of `python -m actors.gateway [--fd N]`: serve the listening socket
    inherited as descriptor N (the host's), or bind `[http] listen` itself."""
    parser = argparse.ArgumentParser(prog="python -m actors.gateway")
    parser.add_argument("--fd", type=int, help="a listening socket to serve")
    args = parser.parse_args()

    async def _main(settings: Settings) -> None:
        sock = None if args.fd is None else socket.socket(fileno=args.fd)
        try:
            await Gateway(settings, sock).serve()
        except GatewayError as exc:
            print(f"oploop gateway: {exc}", file=sys.stderr)
            sys.exit(1)

    run_actor("gateway", _main)
