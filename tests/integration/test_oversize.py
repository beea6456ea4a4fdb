"""Oversize frames: the codec refuses (and counts) what is above its limit; the
socket drops a connection whose frame is above ZMQ_MAXMSGSIZE before anyone reads
it. Either way the actor goes on serving everyone else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
import zmq
from hostkit import run, running_host
from zmq.utils.monitor import recv_monitor_message

from bus.client import Client
from bus.codec import MAX_FRAME_BYTES, decode
from bus.endpoints import Endpoints
from bus.messages import ErrorReply
from bus.sockets import SOCKET_MAXMSGSIZE


@pytest.fixture
def host(short_home):
    with running_host(short_home) as home:
        yield home


def start_run(prompt_bytes: int) -> bytes:
    return msgpack.packb([1, "start_run", "big", "", "", 0.0,
                          {"prompt": "x" * prompt_bytes}])


def test_oversize_frames_are_refused_and_the_api_serves_on(host):
    api = Endpoints.for_home(Path(host)).address("api")
    ctx = zmq.Context()
    try:
        over_codec = ctx.socket(zmq.DEALER)
        over_codec.setsockopt(zmq.LINGER, 0)
        over_codec.setsockopt(zmq.RCVTIMEO, 30_000)
        over_codec.connect(api)
        over_codec.send(start_run(MAX_FRAME_BYTES + 1))
        reply = decode(over_codec.recv())  # the codec refuses it, and says so
        assert isinstance(reply.body, ErrorReply) and reply.body.code == "bad_frame"
        assert "oversize" in reply.body.message

        over_socket = ctx.socket(zmq.DEALER)
        over_socket.setsockopt(zmq.LINGER, 0)
        monitor = over_socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        monitor.setsockopt(zmq.RCVTIMEO, 30_000)
        over_socket.connect(api)
        over_socket.send(start_run(SOCKET_MAXMSGSIZE + 1))
        # libzmq drops the whole connection, unread: the sender sees it go.
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        for sock in (monitor, over_socket, over_codec):
            sock.close(linger=0)
    finally:
        ctx.term()

    async def counters():
        async with Client.connect(Path(host)) as client:
            return (await client.stats())["ports"]["api"]["rejected"], await client.sessions()

    rejected, sessions = asyncio.run(counters())
    assert rejected == {"oversize": 1} and sessions == []  # the dropped one never arrived
    assert run(host, "run `echo still serving`")[-1]["type"] == "DONE"
