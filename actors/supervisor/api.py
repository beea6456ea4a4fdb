"""The supervisor's `api` socket: what clients ask (start a run, list and inspect
sessions, list tools, stats, cancel, remove and prune) and the broadcaster's replay
requests, each served by the handler `HANDLERS` names for the request's type. A peer
host's key may send only `PEER_ASKS`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.core.catalogue import listing
from actors.machines import LOCAL
from actors.supervisor.admission import PEER
from actors.supervisor.mcpasks import serve_get_prompt
from bus.mcpwire import GetPrompt
from bus.messages import (
    Body,
    Cancel,
    Envelope,
    InspectSession,
    ListSessions,
    ListTools,
    PruneSessions,
    RemoveSessions,
    ReplayRequest,
    SessionInfo,
    SessionList,
    SessionsRemoved,
    StartRun,
    Stats,
    StatsReply,
    ToolList,
)

if TYPE_CHECKING:
    from actors.supervisor.actor import Supervisor

log = logging.getLogger("oploop.supervisor")

#: What a peer host's key may send to the api (anything else is refused, "forbidden").
PEER_ASKS = (StartRun, ListTools, Cancel)


def serve_api(sup: Supervisor, peer: bytes | None, env: Envelope) -> None:
    """Serve one request of the api socket (an error reply for what it does not serve,
    or a peer key may not send)."""
    body = env.body
    port = sup.api
    if (port.user_id or "").startswith(PEER + ":") and not isinstance(body, PEER_ASKS):
        port.reply_error(peer, env.id, "forbidden",
                         f"a peer key may not send {env.kind} (only start_run, "
                         "list_tools and cancel of its own runs)")
        return
    handler = HANDLERS.get(type(body))
    if handler is None:
        port.reply_error(peer, env.id, "bad_request", f"api does not serve {env.kind}")
        return
    handler(sup, peer, env, body)


def _start(sup: Supervisor, peer: bytes | None, env: Envelope, body: StartRun) -> None:
    sup.runs.start(peer, env, body)


def _list(sup: Supervisor, peer: bytes | None, env: Envelope, body: ListSessions) -> None:
    sup.api.reply(Envelope(SessionList(sup.summaries()), id=env.id), peer)


def _inspect(sup: Supervisor, peer: bytes | None, env: Envelope, body: InspectSession) -> None:
    session = sup.session(body.session)
    if session is None:
        sup.api.reply_error(peer, env.id, "unknown_session", sup.no_session(body.session))
        return
    history = session.history if body.history else []
    sup.api.reply(Envelope(SessionInfo(session.summary(), history), id=env.id), peer)


def _tools(sup: Supervisor, peer: bytes | None, env: Envelope, body: ListTools) -> None:
    agent = sup.config.agent(body.agent)
    if agent is None:
        sup.api.reply_error(peer, env.id, "unknown_agent", sup.no_agent(body.agent))
        return
    where = agent.target_machine or LOCAL
    states = {s.get("name"): s.get("state") for s in sup.dispatcher.mcp_servers()
              if s.get("machine") == where}
    listed = listing(sup.io.tool_catalogue(where), agent, sup.config.hidden, states)
    sup.api.reply(Envelope(ToolList(listed), id=env.id), peer)


def _stats(sup: Supervisor, peer: bytes | None, env: Envelope, body: Stats) -> None:
    sup.api.reply(Envelope(StatsReply(sup.statistics()), id=env.id), peer)


def _cancel(sup: Supervisor, peer: bytes | None, env: Envelope, body: Cancel) -> None:
    # Accepted here too (the same rules), but behind the api's data; the
    # control socket is the fast path (`scripts/bench` compares the two).
    if not sup.runs.may_end(sup.api.user_id, body.session):
        sup.api.reply_error(peer, env.id, "forbidden",
                            "a peer key may cancel only the runs it started")
        return
    sup.runs.cancel(peer, env, body, sup.api)


def _replay(sup: Supervisor, peer: bytes | None, env: Envelope, body: ReplayRequest) -> None:
    """The broadcaster recovering events it lost."""
    sup.api.reply(Envelope(sup.resend(env.sid, body), id=env.id, sid=env.sid), peer)


def _remove(sup: Supervisor, peer: bytes | None, env: Envelope, req: RemoveSessions) -> None:
    """`oploop rm`: delete the sessions named, refusing running and unknown ones."""
    if sup.pruner is None:
        sup.api.reply_error(peer, env.id, "unavailable", "this supervisor keeps no store")
        return
    running = sup.running_sessions()
    refused: dict[str, str] = {}
    for sid in dict.fromkeys(req.sessions):
        if sid in running:
            refused[sid] = f"session {sid} is running (cancel it first)"
        elif not sup.known(sid):
            refused[sid] = sup.no_session(sid)
    removed = [sid for sid in dict.fromkeys(req.sessions) if sid not in refused]
    sup.pruner.remove(removed)
    sup.api.reply(Envelope(SessionsRemoved(removed, refused), id=env.id), peer)


def _prune(sup: Supervisor, peer: bytes | None, env: Envelope, req: PruneSessions) -> None:
    sup.spawn(_prune_sessions(sup, peer, env, req), "prune")


async def _prune_sessions(sup: Supervisor, peer: bytes | None, env: Envelope,
                          req: PruneSessions) -> None:
    """`oploop sessions prune`: apply retention now, with the request's overrides."""
    if sup.pruner is None:
        sup.api.reply_error(peer, env.id, "unavailable", "this supervisor keeps no store")
        return
    try:
        removed = await sup.pruner.prune(
            older_than_s=req.older_than_s if req.older_than_s >= 0 else None,
            keep=req.keep if req.keep >= 0 else None)
    except Exception as exc:  # the RPC edge: a store error becomes an error reply
        log.exception("prune failed")
        sup.api.reply_error(peer, env.id, "unavailable", f"cannot prune: {exc}")
        return
    sup.api.reply(Envelope(SessionsRemoved(removed), id=env.id), peer)


#: The handler of each request the api serves.
HANDLERS: dict[type[Body], Callable[[Supervisor, bytes | None, Envelope, Any], None]] = {
    StartRun: _start,
    ListSessions: _list,
    InspectSession: _inspect,
    ListTools: _tools,
    Stats: _stats,
    Cancel: _cancel,
    ReplayRequest: _replay,
    RemoveSessions: _remove,
    PruneSessions: _prune,
    GetPrompt: serve_get_prompt,
}
