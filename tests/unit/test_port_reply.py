"""A reply never raises: a vanished requester is counted, an unsendable reply
becomes an error reply the requester can read."""

from __future__ import annotations

import zmq

from bus.codec import MAX_FRAME_BYTES, decode, encode
from bus.messages import Envelope, ErrorReply, ListSessions, SessionList
from bus.sockets import Reactor


def test_replies_that_cannot_go_are_told_or_counted():
    ctx = zmq.Context()
    reactor = Reactor(ctx)
    try:
        server = reactor.add(zmq.ROUTER, "api", bind="inproc://reply-test")
        client = ctx.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.setsockopt(zmq.RCVTIMEO, 5000)
        client.connect("inproc://reply-test")
        client.send(encode(Envelope(ListSessions(), id="r1")))
        peer, _ = server.sock.recv_multipart()

        huge = SessionList([{"blob": "x" * (MAX_FRAME_BYTES + 1)}])
        assert not server.reply(Envelope(huge, id="r1"), peer)
        answer = decode(client.recv())
        assert answer.id == "r1" and isinstance(answer.body, ErrorReply)
        assert answer.body.code == "oversize" and "cannot be sent" in answer.body.message

        assert not server.reply(Envelope(SessionList([]), id="r2"), b"gone")
        assert server.undelivered == 1
        client.close()
    finally:
        reactor.close()
        ctx.term()
