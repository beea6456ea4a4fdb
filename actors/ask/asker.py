"""The supervisor's side of `ask_machine`: one client per peer, the asks, and the
cancels that must reach a remote run after its ask has ended here.

An ask cancelled here (a UI cancel of the caller, its deadline), lost, or timed out
leaves a run on the peer. The asker sends that peer a `Cancel` for it at once, on
the peer's priority control socket, and again every `RENEW_EVERY_S` until the peer
answers or the run's lease has run out there anyway: whichever comes first ends
it, so a cut link delays the cancel to the link's return, never past the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from actors.ask import link
from actors.ask.peers import Peer
from actors.ask.relay import Relay
from actors.ask.tool import NAME, check, spec
from actors.bounds import MAX_RESULT_CHARS, cut_text
from bus.client import Client
from bus.endpoints import Endpoints
from bus.errors import Backpressure, BusError, RemoteError, RequestTimeout
from bus.vocab import CancelMode

log = logging.getLogger("oploop.ask")


class Asker:
    """Runs the `ask_machine` calls of one host to its `peers`."""

    def __init__(self, peers: Mapping[str, Peer], max_answer_chars: int = MAX_RESULT_CHARS
                 ) -> None:
        """`max_answer_chars`: an answer longer is cut (`limits.max_result_chars`)."""
        self.peers = dict(peers)
        self.max_answer_chars = max_answer_chars
        self._clients: dict[str, Client] = {}
        #: Cancels of remote runs still on their way, and clients of lost links closing
        #: (owned here, awaited at close).
        self._cancels: set[asyncio.Task[None]] = set()
        self.counts = {"asks": 0, "lost": 0, "cancels_sent": 0}

    def tool_spec(self) -> dict[str, Any] | None:
        """The tool's spec when peers are configured, else None (not offered)."""
        return spec(self.peers) if self.peers else None

    async def ask(self, call_input: Any, tool_use_id: str,
                  emit: Callable[[dict[str, Any]], None],
                  traceparent: str = "") -> tuple[str, bool]:
        """Carry out one call: (output, is_error). `emit` publishes a `MACHINE_EVENT`
        in the caller's session. A cancel of the calling task cancels the remote run.
        `traceparent`: the call's trace context, sent with the remote `StartRun`."""
        checked = check(call_input, self.peers)
        if isinstance(checked, str):
            return checked, True
        peer, prompt = checked
        self.counts["asks"] += 1
        client = self._client(peer)
        try:
            session, from_seq = await link.start(client, peer, prompt, traceparent)
        except link.AskFailed as exc:
            return str(exc), True
        relay = Relay(peer.name, tool_use_id, session)
        ended = False
        try:
            async with asyncio.timeout(peer.timeout_s):
                answer = await link.follow(client, peer, session, from_seq, relay, emit)
            ended = True
            return cut_text(answer.output, self.max_answer_chars), answer.is_error
        except TimeoutError:
            return (f"machine {peer.name}: no answer within {peer.timeout_s:g} s "
                    f"(peers.{peer.name}.timeout_s); its run is cancelled", True)
        except link.MachineLost as exc:
            self.counts["lost"] += 1
            log.warning("ask to %s (remote session %s): %s", peer.name, session, exc)
            # Its TCP connections may hang for minutes (no reset comes over a silent
            # link): the cancel, and the next ask, go over new ones, made as soon as
            # the link is back.
            if self._clients.get(peer.name) is client:
                del self._clients[peer.name]
            self._own(client.aclose(), None)
            client = self._client(peer)
            return str(exc), True
        except link.AskFailed as exc:
            return str(exc), True
        finally:
            if not ended:  # cancelled, lost, timed out: the remote run must end too
                self._cancel_remote(client, peer, session)

    def _client(self, peer: Peer) -> Client:
        client = self._clients.get(peer.name)
        if client is None:
            client = Client.opened(Endpoints.elsewhere(peer.connect, peer.keys))
            self._clients[peer.name] = client
        return client

    def _cancel_remote(self, client: Client, peer: Peer, session: str) -> None:
        self._own(self._send_cancel(client, peer, session), f"ask-cancel-{session}")

    def _own(self, work: Coroutine[Any, Any, None], name: str | None) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _send_cancel(self, client: Client, peer: Peer, session: str) -> None:
        """`Cancel` the remote run until the peer answers or its lease is over."""
        give_up = time.monotonic() + link.LEASE_S + link.LOST_AFTER_S
        while time.monotonic() < give_up:
            self.counts["cancels_sent"] += 1
            try:
                await client.cancel(session, CancelMode.UI, f"the asking host cancelled its {NAME}",
                                    timeout=link.RENEW_EVERY_S)
                return
            except RemoteError:  # ended already, or unknown: nothing left to cancel
                return
            except RequestTimeout:
                continue  # the link is down: ask again (a late ack is harmless)
            except Backpressure as exc:  # not connected (yet): the link may come back
                log.info("cannot cancel %s's session %s yet: %s", peer.name, session, exc)
                await asyncio.sleep(link.RENEW_EVERY_S)
                continue
            except BusError as exc:
                log.warning("cannot cancel %s's session %s: %s", peer.name, session, exc)
                return
        log.info("gave up cancelling %s's session %s: its lease has ended it", peer.name,
                 session)

    def statistics(self) -> dict[str, Any]:
        """Asks made, links lost, cancels sent, cancels in flight."""
        return dict(self.counts, cancelling=len(self._cancels))

    async def aclose(self) -> None:
        """Let the cancels in flight go out (briefly), then close every client."""
        if self._cancels:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.gather(*list(self._cancels), return_exceptions=True)
            tasks = list(self._cancels)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
