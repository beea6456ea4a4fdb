"""`oploop compact S`: the control socket's `Compact`, served by the supervisor.

A running session is told through its driver (it compacts before its next model
call). A session with no run open is compacted here, in a task of the supervisor
that holds the session as a run's task would (a run started meanwhile waits for
it, and the session stays in memory until its `COMPACTED` is journaled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from actors.core.compaction import apply_between_runs, compact_between_runs
from actors.core.session import Session
from actors.supervisor.runhost import RunHost
from bus.messages import Compact, CompactAck, Envelope

log = logging.getLogger("oploop.supervisor")

def serve_compact(sup: RunHost, ended: Callable[[Session, asyncio.Task[None]], None],
                  peer: bytes | None, env: Envelope, req: Compact, by: str) -> None:
    """Serve one `Compact`: queue it on a running run, else compact the session now."""
    port = sup.control
    session = sup.session(req.session)
    if session is None:
        port.reply_error(peer, env.id, "unknown_session", sup.no_session(req.session))
        return
    if session.task is not None and not session.task.done() and session.run_over:
        port.reply_error(peer, env.id, "busy", f"session {session.id} is being compacted "
                                               "or its last run is still ending: try again")
        return
    driver = session.driver
    if driver is not None and not session.run_over:
        driver.request_compaction(by)
        sup.reply_committed(Envelope(CompactAck(session.id, "queued"), id=env.id), peer, port)
        return
    if not session.run_over:  # open in the log, not resumed here (yet)
        port.reply_error(peer, env.id, "busy", f"session {session.id}'s run is open but not "
                                               "running here yet: try again once it runs")
        return
    if not session.history:
        port.reply_error(peer, env.id, "nothing_to_compact",
                         f"session {session.id} has no history yet")
        return
    unwritable = sup.unwritable()
    if unwritable:
        port.reply_error(peer, env.id, "disk_full", unwritable)
        return
    task = sup.spawn(_compact_idle(sup, peer, env, session, by),
                     f"compact-{session.id}")
    session.task = task  # (held as a run's task: in memory, and a new run waits for it)
    task.add_done_callback(lambda t: ended(session, t))


async def _compact_idle(sup: RunHost, peer: bytes | None, env: Envelope,
                        session: Session, by: str) -> None:
    port = sup.control
    try:
        outcome = await compact_between_runs(session, sup.io, by)
    except Exception as exc:  # the request's edge: an answer, never the supervisor's end
        log.exception("session %s: compaction failed", session.id)
        port.reply_error(peer, env.id, "internal", f"compaction failed: {exc}")
        return
    if outcome.compacted is None:
        why = outcome.note or "every tool result is cleared and nothing is left to summarise"
        port.reply_error(peer, env.id, "nothing_to_compact",
                         f"session {session.id}: {why} ({outcome.tokens} tokens)")
        return
    if not apply_between_runs(session, outcome.compacted, sup.io.emit):
        port.reply_error(peer, env.id, "busy", f"session {session.id} was compacted "
                                               "meanwhile: nothing done")
        return
    sup.journal_later(session)
    ack = CompactAck(session.id, "compacted", outcome.compacted.before_tokens,
                     outcome.tokens, outcome.note)
    sup.reply_committed(Envelope(ack, id=env.id), peer, port)
