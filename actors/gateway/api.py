"""The gateway's JSON + SSE API: each request becomes one bus request of a client.

- `GET /api/sessions`: every session's summary (api `ListSessions`).
- `GET /api/events`: SSE, a notice `{session, seq, type, turn, ts}` for each event of
  any session but the streamed deltas, from now on (the sessions list's live updates).
- `GET /api/sessions/{id}`: one session's summary and history (api `InspectSession`).
- `GET /api/sessions/{id}/events`: SSE, the events from seq 1 (or after
  `Last-Event-ID`), then live (broadcaster replay + events, `Client.events`).
- `POST /api/sessions`: start a session, `{"prompt", "agent"?, "max_turns"?,
  "deadline_s"?, "cwd"?}` (api `StartRun`).
- `DELETE /api/sessions/{id}`: delete a session, history, events and all (api
  `RemoveSessions`, as `oploop rm`): 200 `{"session", "removed": true}`; a running
  one is a 409 (cancel it first), an unknown one a 404.
- `POST /api/sessions/{id}/cancel`: `{"mode"?: "ui"|"operation", "reason"?}`
  (control `Cancel`).
- `POST /api/sessions/{id}/compact`: compact its requests (`oploop compact`): 200 with
  `{before_tokens, after_tokens, note}` once done, 202 when a running run will do it
- `POST /api/sessions/{id}/messages`: a user message, `{"prompt"}` (or `{"text"}`),
  sent with `Client.say` (control `Say`): an idle session starts a follow-up run on
  it (201, as `POST /api/sessions` answers, with `"state": "started"`); a running
  one takes it at its next boundary as a `USER_MESSAGE {text, by}` event (202,
  `{"session", "state": "queued", "run", "from_seq"}`). `by` is "local": the
  gateway is a client of its own host.
- `POST /api/sessions/{id}/approve`: `{"calls"?: [call_id, ...], "all"?: bool,
  "always"?: bool}` (control `DecideCalls`): run calls waiting for approval (the
  `call_id` of their `APPROVAL_REQUESTED`); `always`: their tools' calls for the rest
  of the session too. 200 `{"session", "decided": [...], "by"}`.
- `POST /api/sessions/{id}/deny`: `{"calls"?, "all"?, "reason"?}`: answer them with an
  error saying `reason`; the model goes on. All named calls are decided or none: an
  unknown call, or one decided already ("already decided by ..."), is a 409.
- `POST /api/sessions/{id}/answer`: `{"id": ELICITATION_ID, "action"?: "accept" |
  "decline" | "cancel", "content"?: {...}}` (control `AnswerElicitation`): answer an MCP
  server's question (`ELICITATION_REQUESTED`). 200 `{"session", "id", "by"}`; 409 when
  it waits no more, 400 for content its form refuses.

Errors are JSON `{"error": CODE, "message": TEXT}`: 404 for an unknown session,
400 for malformed JSON or a bad field (a prompt or message over
`limits.max_prompt_chars` names the limit), 409 for a session busy (too many
messages already waiting for its next boundary, or not running, for a cancel),
504 when the host does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from aiohttp import web

from actors.gateway.limits import BODY_S, Quiet, out_of_descriptors
from actors.gateway.urls import hostname
from bus.errors import BusError, RemoteError, RequestTimeout, SessionRemoved
from bus.vocab import CANCEL_MODES, CancelMode

if TYPE_CHECKING:
    from pathlib import Path

    from actors.config import HttpConfig
    from actors.gateway.feed import Feed
    from actors.gateway.metrics import Metrics
    from bus.client import Client


class Gateway(Protocol):
    """What the handlers use of the gateway (`actors.gateway.actor.Gateway`)."""

    feed: Feed
    http: HttpConfig
    metrics: Metrics
    run_dir: Path
    max_body: int
    max_prompt_chars: int
    #: The page's own host name (`oploop-<id>.localhost`) on loopback.
    page_host: str
    #: One log line per interval for floods (descriptors, refused streams).
    quiet: Quiet

    @property
    def client(self) -> Client:
        """The bus client (while serving)."""
        ...

    def stream_slot(self) -> contextlib.AbstractContextManager[None]:
        """Hold one SSE stream slot while the block runs (503 when none is free)."""
        ...

log = logging.getLogger("oploop.gateway")

GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway")

#: HTTP status of each error code a supervisor answers with.
ERROR_STATUS = {
    "unknown_session": 404, "gone": 404,
    "bad_request": 400, "too_large": 400, "unknown_agent": 400, "unknown_host": 400,
    "busy": 409, "not_running": 409, "not_pending": 409, "nothing_to_compact": 409,
    "bad_answer": 400,
    "forbidden": 403, "disk_full": 503, "unavailable": 503, "elsewhere": 409,
}
#: An SSE client whose socket takes no more for this long is dropped (it may come
#: back with `Last-Event-ID`): it holds one bounded buffer, never the others back.
SLOW_CLIENT_S = 5.0
#: Live events queued for one SSE client in zmq (SUB RCVHWM); beyond, the
#: broadcaster drops them for this client alone and they are refetched by seq.
SSE_HWM = 1_000
#: SSE streams open at once (both kinds): each live one holds a zmq socket of the
#: gateway's context (1,023 at most) and descriptors; beyond, a 503 says to come back.
MAX_STREAMS = 512
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """A request the API refuses: becomes a JSON error with `status`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def json_error(status: int, code: str, message: str) -> web.Response:
    """The one shape of every error the API answers."""
    return web.json_response({"error": code, "message": message}, status=status)


#: Host names a browser may use to reach a loopback gateway: any other `Host` header is
#: a page of another site whose name resolves to 127.0.0.1 (DNS rebinding).
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what a web page of another site could make a browser send: a `Host` that
    is not a loopback name (DNS rebinding), and a state-changing request from another
    origin (browsers send `Origin` with every POST, and `Sec-Fetch-Site`); programs
    such as curl send neither and are served."""
    gw = request.app[GATEWAY]
    loopback = gw.http.loopback  # off loopback: TLS names the host
    host = hostname(request.host or "")
    if loopback and host not in LOOPBACK_NAMES and host != gw.page_host:
        return json_error(403, "forbidden", f"Host {request.host!r} is not this gateway's")
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        origin = request.headers.get("Origin")
        site = request.headers.get("Sec-Fetch-Site", "same-origin")
        if (origin is not None and origin != f"{request.scheme}://{request.host}") \
                or site not in ("same-origin", "none"):
            return json_error(403, "forbidden", f"cross-site request (Origin {origin!r})")
    return await handler(request)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn refusals of the API, of the host, and of aiohttp itself into JSON errors."""
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.code, exc.message)
    except RemoteError as exc:
        return json_error(ERROR_STATUS.get(exc.code, 502), exc.code, exc.message)
    except RequestTimeout as exc:
        return json_error(504, "timeout", f"the host did not answer: {exc}")
    except BusError as exc:
        return json_error(502, "bus_error", str(exc))
    except web.HTTPRequestEntityTooLarge as exc:
        return json_error(413, "too_large", f"request body over the limit of "
                          f"{request.app[GATEWAY].max_body} bytes: {exc.text}")
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/api/"):
            raise
        return json_error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
    except Exception as exc:  # the HTTP edge: out of descriptors is a 503, in one line
        if not out_of_descriptors(exc):
            raise
        request.app[GATEWAY].quiet.warn("descriptors", f"out of descriptors: {exc}")
        return json_error(503, "unavailable", "the gateway is out of descriptors: "
                          "try again later")


#: What every answer carries: the page runs only its own scripts and styles, is framed
#: by no page (clickjacking), and passes no address on.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


async def secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: `SECURITY_HEADERS` on every answer, errors and streams too."""
    response.headers.update(SECURITY_HEADERS)


async def read_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body (empty body: `{}`); 400 when it is not one, 408
    when it does not arrive within `BODY_S` (a client trickling it)."""
    try:
        async with asyncio.timeout(BODY_S):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(408, "timeout", f"the request body did not arrive within "
                       f"{BODY_S:g} s") from None
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_request", f"malformed JSON: {exc}") from None
    except RecursionError:  # e.g. 100,000 nested arrays: the parser's stack, not ours
        raise ApiError(400, "bad_request", "malformed JSON: nested too deep") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "expected a JSON object")
    return body


def field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """`body[name]` when it has type `kind`, `default` when absent; else 400."""
    value = body.get(name, default)
    if value is default:
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        label = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ApiError(400, "bad_request", f"{name}: expected {label}, "
                       f"got {type(value).__name__}")
    return value


def flag(body: dict[str, Any], name: str) -> bool:
    """`body[name]` when it is a JSON boolean, False when absent; else 400 (`field`
    refuses booleans, which Python counts as numbers)."""
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(400, "bad_request", f"{name}: expected true or false, "
                       f"got {type(value).__name__}")
    return value


def prompt_of(body: dict[str, Any], limit: int) -> str:
    """The body's prompt: a non-empty string within `limit` characters."""
    prompt = field(body, "prompt", str, None)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "bad_request", "prompt: a non-empty string is required")
    if len(prompt) > limit:
        raise ApiError(400, "too_large", f"prompt of {len(prompt)} chars exceeds the limit "
                       f"of {limit} (limits.max_prompt_chars)")
    return prompt


def started(session: str, run: int, from_seq: int, **more: Any) -> web.Response:
    """A run begun, as the API answers it (201, with the page's address)."""
    return web.json_response({"session": session, "run": run, "from_seq": from_seq,
                              "page": f"/s/{session}", **more}, status=201)


# -- handlers ------------------------------------------------------------------------


async def list_sessions(request: web.Request) -> web.Response:
    """`GET /api/sessions`: every session's summary, newest first."""
    sessions = await request.app[GATEWAY].client.sessions()
    sessions.sort(key=lambda s: s.get("created") or 0, reverse=True)
    return web.json_response({"sessions": sessions})


async def get_session(request: web.Request) -> web.Response:
    """`GET /api/sessions/{id}`: one session's summary and history."""
    info = await request.app[GATEWAY].client.inspect(request.match_info["sid"])
    return web.json_response({"session": info.summary, "history": info.history},
                             dumps=_dumps)


async def start_session(request: web.Request) -> web.Response:
    """`POST /api/sessions`: start a session."""
    gw = request.app[GATEWAY]
    body = await read_object(request)
    prompt = prompt_of(body, gw.max_prompt_chars)
    max_turns = field(body, "max_turns", int, 0)
    deadline_s = field(body, "deadline_s", (int, float), 0.0)
    if max_turns < 0 or deadline_s < 0:
        raise ApiError(400, "bad_request", "max_turns and deadline_s must be >= 0")
    # No directory unless the request names one (the gateway's own is nobody's choice):
    # the agent's `cwd`, else the session's scratch workspace.
    reply = await gw.client.start(prompt, agent=field(body, "agent", str, ""),
                                  max_turns=max_turns, deadline_s=float(deadline_s),
                                  cwd=field(body, "cwd", str, ""),
                                  host=field(body, "host", str, ""))
    return started(reply.session, reply.run, reply.from_seq)


async def delete_session(request: web.Request) -> web.Response:
    """`DELETE /api/sessions/{id}`: delete the session (a running one is refused). The
    `guard` middleware refuses it from another site, as every state-changing request."""
    gw, sid = request.app[GATEWAY], request.match_info["sid"]
    done = await gw.client.remove([sid])
    if sid in done.refused:
        why = done.refused[sid]
        running = why.startswith(f"session {sid} is running")
        status, code = (409, "busy") if running else (404, "unknown_session")
        raise ApiError(status, code, why)
    return web.json_response({"session": sid, "removed": sid in done.removed})


async def send_message(request: web.Request) -> web.Response:
    """`POST /api/sessions/{id}/messages`: a follow-up run on an idle session, a
    message taken at the next boundary of a running one.

    One `Say` whatever the state: the supervisor decides, so a run ending meanwhile
    cannot turn the message into a refusal. It is sent once (a resend could deliver
    it twice): a host that does not answer is a 504 and the message may have landed.
    """
    gw = request.app[GATEWAY]
    body = await read_object(request)
    if "prompt" not in body and "text" in body:
        body = {"prompt": body["text"]}
    prompt = prompt_of(body, gw.max_prompt_chars)
    ack = await gw.client.say(request.match_info["sid"], prompt)
    if ack.state == "started":
        return started(ack.session, ack.run, ack.from_seq, state="started")
    return web.json_response({"session": ack.session, "state": ack.state, "run": ack.run,
                              "from_seq": ack.from_seq}, status=202)


async def cancel_session(request: web.Request) -> web.Response:
    """`POST /api/sessions/{id}/cancel`: cancel the running run (`ui` by default)."""
    body = await read_object(request)
    mode = field(body, "mode", str, CancelMode.UI)
    if mode not in CANCEL_MODES:
        raise ApiError(400, "bad_request", f"mode: expected ui or operation, got {mode!r}")
    gw, sid = request.app[GATEWAY], request.match_info["sid"]
    async with gw.timing_cancel(sid):
        ack = await gw.client.cancel(sid, mode, field(body, "reason", str,
                                                      "cancelled from the web"))
    return web.json_response({"session": ack.session, "state": ack.state})


async def compact_session(request: web.Request) -> web.Response:
    """`POST /api/sessions/{id}/compact`: compact the session's requests, as `oploop
    compact` does (idle: now, answered when done; running: before its next call, 202)."""
    await read_object(request)
    gw = request.app[GATEWAY]
    ack = await gw.client.compact(request.match_info["sid"])
    return web.json_response({"session": ack.session, "state": ack.state,
                              "before_tokens": ack.before_tokens,
                              "after_tokens": ack.after_tokens, "note": ack.note},
                             status=202 if ack.state == "queued" else 200)


async def decide_calls(request: web.Request) -> web.Response:
    """`POST /api/sessions/{id}/approve` and `.../deny`: decide calls waiting for
    approval, as `oploop approve/deny` does (the decision's `by` is "local")."""
    body = await read_object(request)
    calls = field(body, "calls", list, [])
    if not all(isinstance(c, str) and c for c in calls):
        raise ApiError(400, "bad_request", "calls: expected a list of call ids")
    every = flag(body, "all")
    if not calls and not every:
        raise ApiError(400, "bad_request", "name the calls (calls: [...]) or all: true")
    gw, sid = request.app[GATEWAY], request.match_info["sid"]
    if request.match_info["decision"] == "approve":
        ack = await gw.client.approve(sid, calls, all=every,
                                      always=flag(body, "always"))
    else:
        ack = await gw.client.deny(sid, calls, all=every,
                                   reason=field(body, "reason", str, "denied from the web"))
    return web.json_response({"session": ack.session, "decided": ack.decided, "by": ack.by})


async def answer_elicitation(request: web.Request) -> web.Response:
    """`POST /api/sessions/{id}/answer`: answer an MCP server's question, as `oploop
    answer` does (`by` is "local")."""
    body = await read_object(request)
    ask_id = field(body, "id", str, "")
    if not ask_id:
        raise ApiError(400, "bad_request", "id: the question's id (ELICITATION_REQUESTED)")
    content = field(body, "content", dict, {})
    gw, sid = request.app[GATEWAY], request.match_info["sid"]
    ack = await gw.client.answer(sid, ask_id, content,
                                 action=field(body, "action", str, "accept"))
    return web.json_response({"session": ack.session, "id": ack.id, "by": ack.by})


def resume_point(request: web.Request) -> int:
    """The first seq to send: after `Last-Event-ID` (the last seq the client has),
    else `?from_seq=` (default 1)."""
    last = request.headers.get("Last-Event-ID", "").strip()
    try:
        if last:
            return max(1, int(last) + 1)
        return max(1, int(request.query.get("from_seq", "1")))
    except ValueError:
        raise ApiError(400, "bad_request", "Last-Event-ID and from_seq must be integers") from None


async def session_events(request: web.Request) -> web.StreamResponse:
    """`GET /api/sessions/{id}/events`: SSE, one event per message, `id:` = seq.

    Follows the session across its runs until the client leaves; `?stop_at=first`
    ends after the first terminal event, `?stop_at=last` after a terminal event
    that is the newest of the session. The order, without gap or duplicate, is
    `Client.events()`'s (Clone pattern).
    """
    gw = request.app[GATEWAY]
    sid = request.match_info["sid"]
    from_seq = resume_point(request)
    stop_at: Literal["first", "last", ""] = "last"
    match request.query.get("stop_at", ""):
        case "first":
            stop_at = "first"
        case "last":
            stop_at = "last"
        case "":
            stop_at = ""
        case other:
            raise ApiError(400, "bad_request", f"stop_at: expected first or last, got {other!r}")
    # The slot first: beyond the cap a 503 at once, asking the host nothing (a thousand
    # clients' checks at once went unanswered on a busy machine: 504s, not 503s).
    with gw.stream_slot():
        # 404 before the stream starts, not inside it. The broadcaster's answer is cheap;
        # only a session it does not hold (not yet logged, or pruned) asks the
        # supervisor, whose answer carries the whole history.
        if await gw.client.last_seq(sid) is None:
            await gw.client.inspect(sid)
        return await _session_stream(request, gw, sid, from_seq, stop_at)


async def _session_stream(request: web.Request, gw: Gateway, sid: str, from_seq: int,
                          stop_at: Literal["first", "last", ""]) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    gw.metrics.sse_clients.inc()
    try:
        next_seq = from_seq
        while True:
            async for ev in gw.client.events(sid, next_seq, stop_at=stop_at or "last",
                                             hwm=SSE_HWM):
                chunk = f"id: {ev['seq']}\ndata: {_dumps(ev)}\n\n".encode()
                try:
                    async with asyncio.timeout(SLOW_CLIENT_S):
                        await resp.write(chunk)
                except TimeoutError:
                    gw.metrics.sse_dropped.inc()
                    gw.quiet.warn("slow", f"SSE client of {sid} read nothing for "
                                  f"{SLOW_CLIENT_S:g} s: dropped")
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                next_seq = ev["seq"] + 1
            if stop_at:
                return resp
    except SessionRemoved:
        # Deleted (`oploop rm`, retention): the viewer is told, and the stream ends.
        with contextlib.suppress(ConnectionResetError):
            await resp.write(f"event: removed\ndata: {_dumps({'session': sid})}\n\n".encode())
        return resp
    except ConnectionResetError:
        return resp
    except Exception as exc:  # begun already: no 503 can be sent, the stream ends
        if not out_of_descriptors(exc):
            raise
        gw.quiet.warn("descriptors", f"out of descriptors in an SSE stream: {exc}")
        if request.transport is not None:
            request.transport.abort()  # an EventSource comes back with Last-Event-ID
        return resp
    finally:
        gw.metrics.sse_clients.dec()


async def list_events(request: web.Request) -> web.StreamResponse:
    """`GET /api/events`: SSE, a notice for each event of any session but the streamed
    deltas (`feed.py`), from now on."""
    gw = request.app[GATEWAY]
    with gw.stream_slot():
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await _notices(request, gw, resp)
    return resp


async def _notices(request: web.Request, gw: Gateway, resp: web.StreamResponse) -> None:
    async with gw.notices() as queue:
        await resp.write(b": listening\n\n")
        while (notice := await queue.get()) is not None:
            try:
                async with asyncio.timeout(SLOW_CLIENT_S):
                    await resp.write(f"data: {_dumps(notice)}\n\n".encode())
            except TimeoutError:
                break
    if request.transport is not None:  # fell behind: its page reconnects and lists again
        request.transport.abort()


async def metrics(request: web.Request) -> web.Response:
    """`GET /metrics`: Prometheus text format."""
    gw = request.app[GATEWAY]
    body = await gw.metrics.scrape(gw.client, gw.run_dir)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def add_routes(app: web.Application) -> None:
    """Every API route, and `/metrics`."""
    app.router.add_get("/api/events", list_events)
    app.router.add_get("/api/sessions", list_sessions)
    app.router.add_post("/api/sessions", start_session)
    app.router.add_get("/api/sessions/{sid}", get_session)
    app.router.add_delete("/api/sessions/{sid}", delete_session)
    app.router.add_get("/api/sessions/{sid}/events", session_events)
    app.router.add_post("/api/sessions/{sid}/cancel", cancel_session)
    app.router.add_post("/api/sessions/{sid}/messages", send_message)
    app.router.add_post("/api/sessions/{sid}/compact", compact_session)
    app.router.add_post("/api/sessions/{sid}/{decision:approve|deny}", decide_calls)
    app.router.add_post("/api/sessions/{sid}/answer", answer_elicitation)
    app.router.add_get("/metrics", metrics)
