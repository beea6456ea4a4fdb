"""Sockets served on the asyncio loop, control first, data drained in batches.

Measured on these machines: one `await sock.recv()` per message caps a socket
near 50k msg/s and never yields while data keeps arriving, which starved a
control socket for seconds under a flood. So a `Reactor` waits until any socket
is readable, then serves every priority port until it is empty, then at most
`batch` messages from each data port (re-serving priority ports in between),
and yields to the loop between rounds.

The zmq fd is edge-triggered: it fires when something changed, and reading
`ZMQ_EVENTS` re-arms it. A port is therefore *pending* from the moment its fd
fires until a read of `ZMQ_EVENTS` shows it empty; a round looks at pending
ports only. A send can consume the edge that announced an incoming message:
a send from a handler makes its port pending (the round looks again), one from
a task reads `ZMQ_EVENTS` at once and makes the port pending only if a message
waits (waking the reactor for a round after each cost more). Every look costs
a call into libzmq (~1-3 us here) and a failed non-blocking `recv` far more
(~7 us: pyzmq builds an exception), so a port is drained while `ZMQ_EVENTS`
says POLLIN, never until `EAGAIN`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from bus.codec import MAX_FRAME_BYTES, decode, encode
from bus.errors import Backpressure, BadFrame, Closed, PeerGone
from bus.messages import Envelope, ErrorReply

log = logging.getLogger("oploop.bus")

#: Handler of a decoded message: (peer routing id or topic or None, envelope, raw frame).
Handler = Callable[[bytes | None, Envelope, bytes], None]

#: Handler of undecoded frames (XPUB subscription notices and the like).
RawHandler = Callable[[list[bytes]], None]

#: Bound sockets drop a connection whose frame exceeds this; the codec refuses
#: anything above MAX_FRAME_BYTES with a counted error first.
SOCKET_MAXMSGSIZE = 2 * MAX_FRAME_BYTES

# How the frames of each socket type are laid out around the payload.
_ROUTED = {zmq.ROUTER}
_TOPICAL = {zmq.SUB, zmq.XSUB}
_SEND_ONLY = {zmq.PUSH, zmq.PUB}

_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

# What a connecting socket's monitor also follows, to notice a connection libzmq gave up.
_CONNECTION_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED
                      | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED)

#: A connecting port disconnected without libzmq scheduling a reconnect within this
#: long (it does at once when it means to) is connected again by the reactor: see
#: `Reactor.watch_handshakes`. Also the pace of those reconnects (RECONNECT_IVL_MAX).
REVIVE_AFTER_S = 0.5

# Handshake failures that a retry cannot mend: the two sides are set up apart.
_MISCONFIGURED = {int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH),
                  int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)}

# Plain ints: pyzmq's enum members cost a conversion on every call of the hot path.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_RCVMORE = int(zmq.RCVMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)


class Port:
    """One zmq socket of a `Reactor`: decodes what arrives, encodes what leaves.

    Frames that do not decode are counted in `rejected` by reason, logged with
    the peer and kind, and dropped; on a ROUTER with `reply_errors` the peer
    also gets an `ErrorReply(code="bad_frame")`.
    """

    def __init__(
        self,
        reactor: Reactor,
        sock: zmq.Socket[bytes],
        name: str,
        handler: Handler | None,
        *,
        priority: bool,
        reply_errors: bool,
        raw_handler: RawHandler | None = None,
    ) -> None:
        self.reactor = reactor
        self.raw_handler = raw_handler
        self.sock = sock
        self.name = name
        self.handler = handler
        self.priority = priority
        self.reply_errors = reply_errors
        self.routed = sock.type in _ROUTED
        self.topical = sock.type in _TOPICAL
        self.received = 0
        self.rejected: Counter[str] = Counter()
        #: Replies dropped because their requester had gone (see `reply`).
        self.undelivered = 0
        self.closed = False
        #: Send-only sockets are never drained (recv on them is an error).
        self.receives = sock.type not in _SEND_ONLY
        #: Whether the reactor must look at this socket (fd fired, or we sent on it).
        self.pending = True
        #: Read the ZAP User-Id of each message (CURVE sockets whose handlers check it).
        self.identify = False
        #: The User-Id of the message being handled (`identify` ports; None otherwise).
        self.user_id: str | None = None
        #: Where the message being handled came from (`identify` ports over TCP:
        #: "IP" as libzmq's Peer-Address gives it; None otherwise).
        self.peer_address: str | None = None
        #: The address a connecting port connects to (None: it binds).
        self.connect_to: str | None = None
        #: Whether libzmq has dropped its connection for good (watched ports only:
        #: `Reactor.watch_handshakes`), until the reactor connects it again.
        self.abandoned = False
        #: How often the reactor connected it again after libzmq gave up.
        self.revived = 0
        #: The port reading its handshake events (`Reactor.watch_handshakes`), removed
        #: with it.
        self.monitor: Port | None = None

    # -- sending -----------------------------------------------------------------------

    def send(self, env: Envelope, peer: bytes | None = None) -> None:
        """Encode and send `env` (to `peer` on a ROUTER, as topic on a PUB)."""
        self.send_frame(encode(env), peer)

    def send_frame(self, frame: bytes, peer: bytes | None = None) -> None:
        """Send an already encoded frame; raises `PeerGone`, `Backpressure` or `Closed`."""
        if self.closed:
            raise Closed(f"port {self.name} is closed")
        try:
            if peer is None:
                try:
                    self.sock.send(frame, _NOBLOCK)
                except zmq.Again:
                    if not self.abandoned:
                        raise
                    # libzmq dropped the connection (and the queue with it): connect
                    # again now, and queue the frame on the new connection.
                    self.reactor.revive(self)
                    self.sock.send(frame, _NOBLOCK)
            else:
                # Two sends, not send_multipart: its flag arithmetic on pyzmq's enums cost
                # more than the sends. A refusal (EAGAIN, EHOSTUNREACH) comes on the first.
                self.sock.send(peer, _NOBLOCK_MORE)
                self.sock.send(frame, _NOBLOCK)
        except zmq.Again as exc:
            if self.routed and peer is not None:
                # ROUTER_MANDATORY reports an unknown peer as EAGAIN while it may
                # still connect; an unroutable peer raises EHOSTUNREACH below.
                raise Backpressure(f"{self.name}: queue to {peer!r} is full") from exc
            raise Backpressure(f"{self.name}: send queue is full") from exc
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise PeerGone(peer or b"") from exc
            if exc.errno in (zmq.ENOTSOCK, zmq.ETERM):
                raise Closed(f"port {self.name} is closed") from exc
            raise
        finally:
            if self.reactor.in_round:  # (a handler's send: the round looks again anyway)
                self.pending = True
                self.reactor.kick()
            elif not self.pending:
                self._recheck()

    def _recheck(self) -> None:
        """After a send outside the reactor's round (a task's): the send may have
        consumed the edge that announced an incoming message, so look now whether one
        waits (and have the reactor serve it). Looking here costs one read of
        ZMQ_EVENTS; waking the reactor after every such send to look cost a turn of the
        loop per send (an llm caller's one reply per call)."""
        try:
            events = self.sock.get(_EVENTS)
        except zmq.ZMQError:  # closed meanwhile: nothing to serve
            return
        if self.receives and events & _POLLIN:
            self.pending = True
            self.reactor.kick()

    def reply(self, env: Envelope, peer: bytes | None) -> bool:
        """Answer a request; False (counted in `undelivered`, never raised) when the
        requester has gone or stopped reading. A reply is the last thing a handler
        does for a request, so its failing must not undo or skip what it answers."""
        try:
            self.send(env, peer)
        except BadFrame as exc:  # e.g. a history too large for one frame: say so instead
            log.warning("%s: %s reply to %r cannot be sent: %s", self.name, env.kind, peer, exc)
            self.reply_error(peer, env.id, exc.reason, f"the reply cannot be sent: {exc.detail}")
            return False
        except (PeerGone, Backpressure, Closed) as exc:
            self.undelivered += 1
            log.info("%s: %s reply to %r not delivered: %s", self.name, env.kind, peer, exc)
            return False
        return True

    def reply_error(self, peer: bytes | None, req_id: str, code: str, message: str) -> None:
        """Answer a request with an `ErrorReply`, ignoring a peer that went away."""
        self.reply(Envelope(ErrorReply(code, message), id=req_id), peer)

    # -- receiving ---------------------------------------------------------------------

    def drain(self, limit: int) -> int:
        """Receive and dispatch up to `limit` waiting messages; returns how many.

        Leaves `pending` set when it stopped at `limit` with more waiting.
        """
        n = 0
        sock = self.sock
        self.pending = False
        try:
            while sock.get(_EVENTS) & _POLLIN:
                if n >= limit:
                    self.pending = True
                    break
                if self.identify:
                    frames = self._recv_identified()
                else:
                    frames = [sock.recv(_NOBLOCK)]
                    while sock.get(_RCVMORE):
                        frames.append(sock.recv(_NOBLOCK))
                n += 1
                self._dispatch(frames)
        except zmq.Again:
            pass
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.ENOTSOCK, zmq.ETERM):
                raise
        self.received += n
        return n

    def _recv_identified(self) -> list[bytes]:
        """One message, keeping the User-Id the ZAP handler gave its connection."""
        parts = [self.sock.recv(_NOBLOCK, copy=False)]
        while parts[-1].more:
            parts.append(self.sock.recv(_NOBLOCK, copy=False))
        try:
            self.user_id = parts[-1].get("User-Id")
        except zmq.ZMQError:  # no ZAP on that connection (ipc without CURVE)
            self.user_id = None
        try:
            self.peer_address = parts[-1].get("Peer-Address") or None
        except zmq.ZMQError:  # not a TCP connection (ipc)
            self.peer_address = None
        return [part.bytes for part in parts]

    def _dispatch(self, frames: list[bytes]) -> None:
        if self.raw_handler is not None:
            self.raw_handler(frames)
            return
        peer: bytes | None = None
        if self.routed or self.topical:
            if len(frames) != 2:
                self._reject(frames[0] if self.routed else None, "malformed", "bad framing")
                return
            peer, frame = frames
        elif len(frames) == 1:
            frame = frames[0]
        else:
            self._reject(None, "malformed", f"{len(frames)} frames, expected 1")
            return
        try:
            env = decode(frame)
        except BadFrame as exc:
            self._reject(peer, exc.reason, exc.detail, exc.kind)
            return
        if self.handler is None:
            return
        try:
            self.handler(peer, env, frame)
        except Exception:  # an RPC edge: a handler bug must not kill the actor
            self.rejected["handler_error"] += 1
            log.exception("%s: handler failed on %s from %r", self.name, env.kind, peer)

    def _reject(self, peer: bytes | None, reason: str, detail: str,
                kind: str | None = None) -> None:
        self.rejected[reason] += 1
        total = sum(self.rejected.values())
        if total <= 20 or total % 1000 == 0:  # log without letting a flood flood the log
            log.warning(
                "%s: rejected frame from %r (kind %s): %s: %s [%d rejected]",
                self.name, peer, kind or "?", reason, detail, total,
            )
        if self.reply_errors and self.routed and peer is not None:
            self.reply_error(peer, "", "bad_frame", f"{reason}: {detail}")

    def readable(self) -> bool:
        """Whether a message is waiting (also re-arms the edge-triggered fd).

        ZMQ_EVENTS is read even on send-only sockets: reading it is what clears
        the fd's signal, and an uncleared fd would wake the loop forever.
        """
        try:
            events = self.sock.get(_EVENTS)
        except zmq.ZMQError:
            return False
        return self.receives and bool(events & _POLLIN)

    def serve(self, limit: int) -> int:
        """Drain a pending port (re-arming a send-only one); how many messages it took."""
        if not self.pending or self.closed:
            return 0
        if self.receives:
            return self.drain(limit)
        self.pending = False
        self.readable()
        return 0

    def close(self) -> None:
        """Close the socket at once (linger 0): what is queued is dropped."""
        if not self.closed:
            self.closed = True
            self.sock.close(linger=0)

    def statistics(self) -> dict[str, Any]:
        """Counters of this port: messages received, frames rejected by reason,
        replies not delivered (and `revived`: connections made again, when any)."""
        out: dict[str, Any] = {"received": self.received, "rejected": dict(self.rejected),
                               "undelivered": self.undelivered}
        if self.revived:
            out["revived"] = self.revived
        return out


def _monitor(sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
    """A monitor of `sock`'s handshake and connection events (`watch_handshakes`)."""
    mon: zmq.Socket[bytes] = sock.get_monitor_socket(_HANDSHAKE_EVENTS | _CONNECTION_EVENTS)
    mon.setsockopt(zmq.LINGER, 0)
    return mon


class Reactor:
    """The sockets of one actor, served on the running asyncio loop.

    Handlers are plain functions called on the loop thread; they must not block
    (hand slow work to a task). `run()` serves until cancelled; `aclose()`
    closes every socket.
    """

    def __init__(self, ctx: zmq.Context[Any] | None = None, *, batch: int = 64) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.batch = batch
        self.ports: list[Port] = []
        self._wake: asyncio.Event | None = None
        #: Whether a round is serving the ports (a send from a handler, not a task).
        self.in_round = False

    def add(
        self,
        socket_type: int,
        name: str,
        handler: Handler | None = None,
        *,
        bind: str | Sequence[str] | None = None,
        connect: str | None = None,
        secure: Callable[[zmq.Socket[bytes]], None] | None = None,
        priority: bool = False,
        reply_errors: bool = False,
        routing_id: bytes | None = None,
        hwm: int = 10_000,
        subscribe: bytes | None = None,
        raw_handler: RawHandler | None = None,
        on_handshake: Callable[[str | None], None] | None = None,
    ) -> Port:
        """Create a socket, bind it (to one address or several) or connect it, and serve
        it with `handler`. `secure` sets security options (CURVE) before either;
        `on_handshake`: `watch_handshakes` from before the connect (a handshake refused
        at once is not missed)."""
        sock: zmq.Socket[bytes] = self.ctx.socket(socket_type)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
        if routing_id is not None:
            sock.setsockopt(zmq.ROUTING_ID, routing_id)
        if socket_type == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if socket_type in (zmq.DEALER, zmq.SUB):
            # Reconnect fast after a peer restarts; the default backs off to 100 ms.
            sock.setsockopt(zmq.RECONNECT_IVL, 20)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        if subscribe is not None:
            sock.setsockopt(zmq.SUBSCRIBE, subscribe)
        binds = [bind] if isinstance(bind, str) else list(bind or ())
        where = connect or ""
        if any(a.startswith("tcp://[") for a in [*binds, where]):
            sock.setsockopt(zmq.IPV6, 1)  # off by default: an IPv6 address would not bind
        monitor: zmq.Socket[bytes] | None = None
        try:
            if secure is not None:
                secure(sock)
            if binds:
                sock.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAXMSGSIZE)
            for where in binds:
                sock.bind(where)
                if where.startswith("ipc://"):
                    os.chmod(where[len("ipc://"):], 0o600)  # only this user may connect
            monitor = _monitor(sock) if on_handshake is not None and connect else None
            if connect:
                where = connect
                sock.connect(connect)
        except zmq.ZMQError as exc:
            if monitor is not None:
                monitor.close(linger=0)
            sock.close(linger=0)
            verb = "connect" if connect else "bind"
            raise OSError(f"{name}: cannot {verb} {where}: {exc}") from exc
        port = Port(
            self, sock, name, handler,
            priority=priority, reply_errors=reply_errors, raw_handler=raw_handler,
        )
        port.connect_to = connect
        self._serve(port)
        if monitor is not None and on_handshake is not None:
            self.watch_handshakes(port, on_handshake, monitor)
        return port

    def _serve(self, port: Port) -> None:
        self.ports.append(port)
        if self._wake is not None:
            asyncio.get_running_loop().add_reader(port.sock.getsockopt(zmq.FD), self._signal, port)
            self.kick()

    def watch_handshakes(self, port: Port, on_change: Callable[[str | None], None],
                         monitor: zmq.Socket[bytes] | None = None) -> None:
        """Tell `on_change` why the peer of a connecting `port` refuses its handshake
        (a CURVE key it does not admit, no CURVE on one side, another server key),
        and None once a handshake succeeds. A refused connection never delivers:
        without this, a request would only time out. A connection cut mid-handshake
        (a peer restarting) is no refusal: libzmq connects again by itself.

        It also mends what libzmq does not: when something other than a ZeroMQ peer
        answers at the address (an HTTP proxy or captive portal while the route to the
        host is gone, another program on the port while the host is away), a CURVE
        socket reads its bytes as a ZMTP 1.0 greeting, refuses it, and drops that
        endpoint for good, with no handshake event and no reconnect: every later send
        fails with EAGAIN, even once the host answers there again. So a disconnect
        that no reconnect follows within `REVIVE_AFTER_S` (and that no refusal above
        explains: a refused key is not retried) connects the endpoint again.

        Watched once connected, a handshake refused at once (before the monitor is
        attached: a thread descheduled on a busy machine) goes unseen: give
        `Reactor.add` `on_handshake` instead, or `monitor` made before the connect."""
        mon = monitor if monitor is not None else _monitor(port.sock)
        refused = [False]  # this connection's handshake was refused (no revival)

        def handle(frames: list[bytes]) -> None:
            try:
                message = parse_monitor_message(frames)
            except RuntimeError:
                return
            event, value = message["event"], int(message["value"])
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_CONNECT_DELAYED,
                         zmq.EVENT_CONNECT_RETRIED):
                port.abandoned = False  # libzmq is (still) at it
                if event == zmq.EVENT_CONNECTED:
                    refused[0] = False
            elif event == zmq.EVENT_DISCONNECTED:
                if not refused[0] and port.connect_to is not None:
                    port.abandoned = True
                    asyncio.get_running_loop().call_later(REVIVE_AFTER_S, self.revive, port)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                on_change(None)
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                refused[0] = True
                on_change("refused this key")
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value in _MISCONFIGURED:
                refused[0] = True
                on_change("failed the handshake (CURVE on one side only, or another "
                          "server key)")

        port.monitor = Port(self, mon, f"{port.name}.monitor", None, priority=False,
                            reply_errors=False, raw_handler=handle)
        self._serve(port.monitor)

    def revive(self, port: Port) -> None:
        """Connect `port` again if libzmq has given it up and still has not (see
        `watch_handshakes`); also called by a send that finds it so."""
        if not port.abandoned or port.closed or port not in self.ports:
            return
        address = port.connect_to
        assert address is not None
        port.abandoned = False
        port.revived += 1
        if port.revived <= 3 or port.revived % 100 == 0:
            log.warning("%s: libzmq dropped its connection to %s for good (what answered "
                        "there did not complete a ZMTP handshake: not a ZeroMQ peer?); "
                        "connecting again [%d]", port.name, address, port.revived)
        with contextlib.suppress(zmq.ZMQError):  # (the endpoint may be gone already)
            port.sock.disconnect(address)
        try:
            port.sock.connect(address)
        except zmq.ZMQError as exc:
            log.warning("%s: cannot connect %s again: %s", port.name, address, exc)
            return
        port.pending = True
        self.kick()

    def _signal(self, port: Port) -> None:
        """The fd of `port` fired: look at it in the next round."""
        port.pending = True
        if self._wake is not None:
            self._wake.set()

    def remove(self, port: Port) -> None:
        """Stop serving `port` and close it (and its monitor, if it has one)."""
        monitor, port.monitor = port.monitor, None
        if port in self.ports:
            self.ports.remove(port)
            if self._wake is not None and not port.closed:
                asyncio.get_running_loop().remove_reader(port.sock.getsockopt(zmq.FD))
        port.close()
        if monitor is not None:
            self.remove(monitor)

    def kick(self) -> None:
        """Make the serve loop re-check every socket (after a send, or a new port)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Serve every port until cancelled."""
        loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        for port in self.ports:
            port.pending = True
            loop.add_reader(port.sock.getsockopt(zmq.FD), self._signal, port)
        try:
            while True:
                busy = self._serve_round()
                if busy:
                    await asyncio.sleep(0)  # data keeps coming: let other tasks run
                    continue
                if any(p.pending for p in self.ports):
                    continue  # a handler sent on a port already looked at
                wake.clear()
                await wake.wait()
        finally:
            self._wake = None
            for port in self.ports:
                if not port.closed:
                    loop.remove_reader(port.sock.getsockopt(zmq.FD))

    def _serve_round(self) -> bool:
        """One round over the pending ports: all control, then a batch of each data
        port, control again after each batch. True if a data port has more waiting."""
        ports = list(self.ports)  # a handler may add or remove ports
        priority = [p for p in ports if p.priority]
        self.in_round = True
        try:
            for ctl in priority:
                ctl.serve(1_000_000)
            busy = False
            for port in ports:
                if port.priority or not port.pending:
                    continue
                if port.serve(self.batch):
                    for ctl in priority:
                        # Look actively: a cancel must not wait behind the next batch.
                        ctl.pending = True
                        ctl.serve(1_000_000)
                busy = busy or port.pending
        finally:
            self.in_round = False
        return busy

    def statistics(self) -> dict[str, Any]:
        """Per-port counters."""
        return {p.name: p.statistics() for p in self.ports}

    def close(self) -> None:
        """Close every port (linger 0)."""
        if self._wake is not None:
            loop = asyncio.get_running_loop()
            for port in self.ports:
                if not port.closed:
                    loop.remove_reader(port.sock.getsockopt(zmq.FD))
        for port in self.ports:
            port.close()
        self.ports.clear()
