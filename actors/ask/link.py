"""One ask, start to end: start the run on the peer, relay its events, keep its lease,
notice a lost link, and say how it ended.

The link is alive while anything comes back from the peer: an event of the run or
a reply to the lease renewal sent every `RENEW_EVERY_S` on the peer's priority
control socket. Silent for `LOST_AFTER_S`, the ask ends with `MachineLost`; the
caller then cancels the remote run (`asker.Asker`), which ends there anyway when
its lease (`LEASE_S`) runs out without a renewal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.ask.peers import Peer
from actors.ask.relay import Relay
from bus.client import Client
from bus.errors import AccessDenied, BusError, RemoteError, RequestTimeout
from bus.vocab import TERMINAL, EventType

#: A renewal is sent this often; its reply is the link's heartbeat.
RENEW_EVERY_S = 1.0
#: Nothing back from the peer for this long: the machine is lost.
LOST_AFTER_S = 3.0
#: How long the remote run outlives its last renewal.
LEASE_S = 10.0
#: How long the start of the remote run may take (the peer answers once journaled).
START_TIMEOUT_S = LOST_AFTER_S
#: How often the ask looks at the clock (lost link, streamed text due).
_TICK_S = 0.25


class AskFailed(Exception):
    """The ask could not be carried out; `str()` is the tool's error text."""


class MachineLost(AskFailed):
    """The peer went silent for `LOST_AFTER_S` mid-ask."""

    def __init__(self, machine: str) -> None:
        super().__init__(f"machine {machine} lost (no reply for {LOST_AFTER_S:g} s); "
                         "its run is cancelled when the link returns or its lease ends")
        self.machine = machine


@dataclass(frozen=True, slots=True)
class Answer:
    """How the remote run ended, as the tool's result."""

    output: str
    is_error: bool


async def start(client: Client, peer: Peer, prompt: str,
                traceparent: str = "") -> tuple[str, int]:
    """Start the run on `peer` (a child of the trace `traceparent`, if any); (remote
    session, its first seq). Raises `AskFailed`."""
    try:
        started = await client.start(prompt, agent=peer.agent, lease_s=LEASE_S,
                                     timeout=START_TIMEOUT_S, traceparent=traceparent)
    except AccessDenied as exc:
        raise AskFailed(f"machine {peer.name} refused our key: {exc}") from None
    except RequestTimeout:
        raise AskFailed(f"machine {peer.name} unreachable at {peer.connect} "
                        f"(no reply within {START_TIMEOUT_S:g} s)") from None
    except RemoteError as exc:
        raise AskFailed(f"machine {peer.name} refused the run: {exc.code}: {exc}") from None
    except BusError as exc:
        raise AskFailed(f"machine {peer.name}: {exc}") from None
    return started.session, started.from_seq


async def follow(client: Client, peer: Peer, session: str, from_seq: int, relay: Relay,
                 emit: Callable[[dict[str, Any]], None]) -> Answer:
    """Relay the remote run's events until its terminal one, keeping its lease; raises
    `MachineLost` when the peer goes silent."""
    heard = [time.monotonic()]
    ended: list[Answer] = []

    async def events() -> None:
        async for ev in client.events(session, from_seq, stop_at="first"):
            heard[0] = time.monotonic()
            for payload in relay.feed(ev, heard[0]):
                emit(payload)
            if ev["type"] in TERMINAL:
                ended.append(_answer(peer.name, ev))
                return

    async def renew() -> None:
        try:
            await client.renew(session, LEASE_S, timeout=LOST_AFTER_S)
        except RemoteError:  # (the run has just ended there): an answer all the same
            pass
        except BusError:  # no answer: silence is what counts
            return
        heard[0] = time.monotonic()

    watcher = asyncio.ensure_future(events())
    renewal: asyncio.Future[None] | None = None
    sent = 0.0
    try:
        while not watcher.done():
            now = time.monotonic()
            if now - heard[0] > LOST_AFTER_S:
                raise MachineLost(peer.name)
            if (renewal is None or renewal.done()) and now - sent >= RENEW_EVERY_S:
                renewal, sent = asyncio.ensure_future(renew()), now
            for payload in relay.tick(now):
                emit(payload)
            await asyncio.wait([watcher], timeout=_TICK_S)
        watcher.result()  # (a bug or a refusal in the events' loop surfaces here)
    except BusError as exc:
        raise AskFailed(f"machine {peer.name}: {exc}") from None
    finally:
        for task in (watcher, renewal):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (watcher, renewal) if t is not None),
                             return_exceptions=True)
    if not ended:
        raise AskFailed(f"machine {peer.name}: the run's events ended without its end")
    return ended[0]


def _answer(machine: str, ev: dict[str, Any]) -> Answer:
    data = ev.get("data") or {}
    kind = ev["type"]
    if kind == EventType.DONE:
        return Answer(str(data.get("text", "")), False)
    if kind == EventType.ERROR:
        return Answer(f"machine {machine}: its run failed: {data.get('error', 'error')}: "
                      f"{data.get('message', '')}", True)
    reason = data.get("reason") or data.get("mode") or "cancelled"
    return Answer(f"machine {machine}: its run was cancelled ({reason})", True)
