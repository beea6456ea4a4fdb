"""The HTTP/1.1 side: asyncio streams, `h11` for the protocol, plans executed in order.

One task per connection, owned by the server and cancelled by `aclose()`.
Connections are kept alive between requests. A bad request gets the API's
error JSON and the connection goes on; a bad connection (broken HTTP, the
peer gone) ends only itself. `h11` frames bodies: with `content-length` for
JSON, chunked for SSE — so a `Drop` (closing without the zero-length chunk)
is visibly different from an `End`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import h11

from actors.offline_model.cache import PromptCache, PromptTooLong, prompt_size
from actors.offline_model.plan import (
    Action,
    Body,
    Drop,
    End,
    Event,
    Head,
    Sleep,
    Stall,
    api_error,
    plan_document,
    plan_error,
    plan_response,
)
from actors.offline_model.rules import is_summary_request
from actors.offline_model.scenario import (
    Scenario,
    ScenarioSource,
    as_scenario,
    first_prompt,
    session_of,
)
from actors.offline_model.wire import (
    InvalidRequest,
    encode_sse,
    new_message_id,
    new_request_id,
    validate_request,
)

log = logging.getLogger("oploop.offline_model")

SERVER_NAME = "oploop-offline-model"
#: Bodies above this are refused with 413 (long histories are well below it).
MAX_BODY_BYTES = 32 * 1024 * 1024
_READ_SIZE = 64 * 1024
_REASONS = {529: b"Overloaded"}


class BodyTooLarge(Exception):
    """The request body went past `MAX_BODY_BYTES`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")
        self.limit = limit


#: `GET` here answers the server's counters as JSON (not part of the Messages API).
STATS_PATH = "/v1/offline/stats"
#: The Messages API's token counting (`{"input_tokens": N}`, nothing generated).
COUNT_PATH = "/v1/messages/count_tokens"
#: The context window the offline model enforces unless told otherwise (tokens).
DEFAULT_CONTEXT_WINDOW = 200_000


@dataclass(frozen=True)
class ServerStatistics:
    """Counters for tests and `status`: connections and requests served."""

    connections_open: int
    connections_total: int
    requests: int
    error_responses: int
    #: Responses whose client hung up mid-way (an aborted stream, a cancel).
    abandoned: int = 0
    #: Requests refused as over the context window, and the largest one answered (tokens).
    too_long: int = 0
    largest_prompt: int = 0


class OfflineServer:
    """The offline model listening on `host:port`; close it with `aclose()`."""

    def __init__(self, scenario: Scenario | None = None, *, delta_delay_s: float = 0.0,
                 context_window: int = DEFAULT_CONTEXT_WINDOW) -> None:
        self.scenario = scenario
        self.delta_delay_s = delta_delay_s
        #: Requests over this many input tokens are refused as the API does (0: none).
        self.context_window = context_window
        self._too_long = 0
        self._largest = 0
        #: What the prompt cache holds, so that usage counts cache writes and reads.
        self.prompt_cache = PromptCache()
        self.host = ""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._closing = False
        self._connections: set[asyncio.Task[None]] = set()
        self._connections_total = 0
        self._requests = 0
        self._errors = 0
        self._abandoned = 0
        #: When (`time.time()`) the latest scripted stall began: the stalls bench
        #: measures from it to the client's retry.
        self.last_stall_at = 0.0

    async def listen(self, host: str, port: int, sock: socket.socket | None = None) -> None:
        """Bind and start accepting; `port` 0 picks a free one (see `.port`). With
        `sock`, accept on that listening socket instead (one the host bound and keeps)."""
        # A plain callback, not a coroutine: it runs inside connection_made, so
        # the connection's task is registered before aclose() can miss it.
        if sock is not None:
            self._server = await asyncio.start_server(self._accept, sock=sock)
        else:
            self._server = await asyncio.start_server(self._accept, host, port,
                                                      reuse_address=True)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    def statistics(self) -> ServerStatistics:
        """A snapshot of the counters."""
        return ServerStatistics(
            len(self._connections), self._connections_total, self._requests, self._errors,
            self._abandoned, self._too_long, self._largest,
        )

    async def aclose(self) -> None:
        """Stop listening, end every connection (streams in flight included), wait for them."""
        self._closing = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> OfflineServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.close()
            return
        task = asyncio.get_running_loop().create_task(self._connection(reader, writer))
        self._connections.add(task)
        self._connections_total += 1
        task.add_done_callback(self._connections.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            await self._serve(conn, reader, writer)
        except (ConnectionError, TimeoutError):
            # The peer went away; nothing to answer. Mid-response, that is a client
            # abandoning a reply (a cancelled stream): counted, for tests and status.
            if conn.our_state is h11.SEND_BODY:
                self._abandoned += 1
        except Exception:  # the connection's edge: log, end this connection only
            log.exception("offline model: connection failed")
        finally:
            writer.close()
            with contextlib.suppress(OSError):  # the peer may already be gone
                await writer.wait_closed()

    async def _serve(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Requests on one connection, one after another, until either side closes."""
        while True:
            try:
                request = await self._read_request(conn, reader, writer)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = exc.error_status_hint
                    error = api_error(status, f"malformed HTTP request: {exc}")
                    await self._execute(conn, writer, plan_error(status, error, new_request_id()))
                return
            except BodyTooLarge as exc:
                error = api_error(413, str(exc))
                plan = plan_error(413, error, new_request_id(), (("connection", "close"),))
                await self._execute(conn, writer, plan)
                return
            if request is None:
                return
            finished = await self._execute(conn, writer, self._route(*request))
            if not finished or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # dropped on purpose, or `connection: close`
            conn.start_next_cycle()

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[h11.Request, bytes] | None:
        """The next request and its whole body, or None when the peer closed cleanly."""
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    await self._send(
                        conn, writer, h11.InformationalResponse(status_code=100, headers=[])
                    )
                conn.receive_data(await reader.read(_READ_SIZE))
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise BodyTooLarge(MAX_BODY_BYTES)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None  # h11 never ends a message it did not start
                return head, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def _route(self, head: h11.Request, body: bytes) -> list[Action]:
        """The plan for one request: an error, or the model's answer."""
        self._requests += 1
        request_id = new_request_id()
        target = head.target.decode("latin-1").split("?", 1)[0]
        if target.rstrip("/") == STATS_PATH and head.method == b"GET":
            return plan_document(dataclasses.asdict(self.statistics()))
        if target.rstrip("/") == COUNT_PATH and head.method == b"POST":
            return self._count(body, request_id)
        if target.rstrip("/") != "/v1/messages":
            return self._error(404, f"Not found: {target}", request_id)
        if head.method != b"POST":
            method = head.method.decode("latin-1")
            return self._error(
                405, f"Method {method} not allowed on {target}", request_id, (("allow", "POST"),)
            )
        try:
            request = validate_request(json.loads(body))
        except (ValueError, RecursionError) as exc:
            problem = exc.problem if isinstance(exc, InvalidRequest) else "body is not valid JSON"
            return self._error(400, problem, request_id)
        try:
            prompt = self.prompt_cache.usage(request, self.context_window)
        except PromptTooLong as exc:  # as the API: 400 invalid_request_error, nothing played
            self._too_long += 1
            return self._error(400, str(exc), request_id)
        self._largest = max(self._largest, sum(prompt))
        try:
            # A compaction's summary request is the summariser's (the rules), never a
            # scripted turn of the session it summarises.
            turn = (self.scenario.next_turn(session_of(request), first_prompt(request))
                    if self.scenario and not is_summary_request(request) else None)
            return plan_response(
                request,
                turn,
                message_id=new_message_id(),
                request_id=request_id,
                delta_delay_s=self.delta_delay_s,
                prompt=prompt,
            )
        except Exception as exc:  # a bug in the rules must not take the server down
            log.exception("offline model: could not answer request %s", request_id)
            return self._error(500, f"offline model failed: {exc!r}", request_id)

    def _count(self, body: bytes, request_id: str) -> list[Action]:
        """`count_tokens`: the request's input tokens as a reply to it would count them
        (over the window too: counting is how a client finds out)."""
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            return self._error(400, "body is not valid JSON", request_id)
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            return self._error(400, "messages: field required (a list)", request_id)
        if not isinstance(request.get("model"), str) or not request["model"]:
            return self._error(400, "model: field required (a non-empty string)", request_id)
        try:
            tokens = prompt_size(request)
        except (TypeError, ValueError) as exc:
            return self._error(400, f"cannot count this request: {exc}", request_id)
        return plan_document({"input_tokens": max(1, tokens)})

    def _error(
        self, status: int, message: str, request_id: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> list[Action]:
        self._errors += 1
        return plan_error(status, api_error(status, message), request_id, headers)

    async def _execute(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, plan: list[Action]
    ) -> bool:
        """Carry out a plan; True when the response ended cleanly, False when dropped."""
        for action in plan:
            if isinstance(action, Head):
                headers = [
                    *action.headers,
                    ("date", formatdate(usegmt=True)),
                    ("server", SERVER_NAME),
                ]
                reason = _REASONS.get(action.status) or _reason(action.status)
                event: Any = h11.Response(status_code=action.status, headers=headers, reason=reason)
                await self._send(conn, writer, event)
            elif isinstance(action, Body):
                await self._send(conn, writer, h11.Data(data=action.data))
            elif isinstance(action, Event):
                await self._send(conn, writer, h11.Data(data=encode_sse(action.name, action.data)))
            elif isinstance(action, Sleep):
                await asyncio.sleep(action.seconds)
            elif isinstance(action, Stall):
                self.last_stall_at = time.time()
                await self._stall(conn, writer, action)
            elif isinstance(action, Drop):
                return False
            elif isinstance(action, End):
                await self._send(conn, writer, h11.EndOfMessage())
                return True
            else:
                raise TypeError(f"unknown plan action {action!r}")
        return False

    async def _stall(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, stall: Stall
    ) -> None:
        """Send no content for a while, only pings if asked (a slow or stuck model)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + stall.seconds
        while (left := until - loop.time()) > 0:
            if stall.ping_every_s is None or stall.ping_every_s >= left:
                await asyncio.sleep(left)
                return
            await asyncio.sleep(stall.ping_every_s)
            await self._send(conn, writer, h11.Data(data=encode_sse("ping", {"type": "ping"})))

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, event: Any) -> None:
        data = conn.send(event)
        # A peer that hung up (an llm caller killed or cancelled mid-stream) closes the
        # transport; uvloop's write then raises RuntimeError where asyncio's would only
        # warn. Either way it is a vanished client: say so in the exception that means it.
        if writer.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if data:
            writer.write(data)
        # drain after every event: it applies backpressure and notices a vanished peer
        await writer.drain()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def start_server(
    host: str = "127.0.0.1",
    port: int = 0,
    scenario: ScenarioSource = None,
    *,
    delta_delay_s: float = 0.0,
    sock: socket.socket | None = None,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
) -> OfflineServer:
    """Start the offline model; `scenario` may be a path, parsed JSON or a `Scenario`.

    `delta_delay_s` paces streamed deltas (0 = as fast as possible) unless a
    scripted turn sets its own `delay_s`. `sock`: a listening socket to serve on
    instead of binding `host:port`. `context_window`: larger requests are refused
    (400 "prompt is too long"), as the API does.
    """
    server = OfflineServer(as_scenario(scenario), delta_delay_s=delta_delay_s,
                           context_window=context_window)
    await server.listen(host, port, sock)
    return server
