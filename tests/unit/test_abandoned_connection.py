"""A connection libzmq gives up is made again.

When something other than a ZeroMQ peer answers at a CURVE client's address (an HTTP
proxy, a captive portal, another program that took the port while the host was
away), libzmq reads its answer as a ZMTP 1.0 greeting, refuses it, and drops that
endpoint for good: no handshake-failure event, no reconnect, and every later send
on the DEALER fails with EAGAIN ("send queue is full"), even once the real host
answers there again. The reactor notices (a disconnect that no reconnect follows)
and connects the endpoint again itself.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import zmq

from bus.errors import Backpressure, RequestTimeout
from bus.messages import Envelope, Stats, StatsReply
from bus.rpc import Requester
from bus.sockets import Reactor

HTTP_400 = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


class NotZmtp:
    """A TCP listener on `port` that answers every connection like an HTTP proxy."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    conn.recv(64)  # (the ZMTP greeting)
                    conn.sendall(HTTP_400)
                except OSError:
                    pass
            self.answered += 1

    def close(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.sock.close()


def _curve_client(server_public: bytes) -> Callable[[zmq.Socket[bytes]], None]:
    public, secret = zmq.curve_keypair()

    def apply(sock: zmq.Socket[bytes]) -> None:
        sock.curve_serverkey = server_public
        sock.curve_publickey = public
        sock.curve_secretkey = secret

    return apply


async def _scenario() -> None:
    ctx = zmq.Context()
    server_public, server_secret = zmq.curve_keypair()
    client = Reactor(ctx)
    server = Reactor(ctx)
    tasks = []
    fake = NotZmtp()
    address = f"tcp://127.0.0.1:{fake.port}"
    try:
        requester = Requester(client, "client.control", address, _curve_client(server_public))
        tasks.append(asyncio.create_task(client.run()))
        # Something else answers at the host's address: no reply, of course.
        try:
            await requester.request(Stats(), timeout=0.5)
        except (RequestTimeout, Backpressure):
            pass
        else:
            raise AssertionError("a reply from an HTTP server?")
        assert fake.answered >= 1
        fake.close()

        # The host is back at that address.
        def secure(sock: zmq.Socket[bytes]) -> None:
            sock.curve_server = True
            sock.curve_secretkey = server_secret

        def answer(peer: bytes | None, env: Envelope, frame: bytes) -> None:
            api.reply(Envelope(StatsReply({"up": 1}), id=env.id), peer)

        api = server.add(zmq.ROUTER, "api", answer, bind=address, secure=secure)
        tasks.append(asyncio.create_task(server.run()))
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        errors: list[str] = []
        while True:
            try:
                reply = await requester.request(Stats(), timeout=0.5)
                break
            except (RequestTimeout, Backpressure) as exc:
                errors.append(str(exc))
                assert loop.time() < end, f"never answered again: {errors[-3:]}"
                await asyncio.sleep(0.1)
        assert isinstance(reply.body, StatsReply) and reply.body.counters == {"up": 1}
    finally:
        fake.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client.close()
        server.close()
        ctx.term()


def test_a_connection_refused_as_not_zmtp_is_made_again():
    asyncio.run(_scenario())
