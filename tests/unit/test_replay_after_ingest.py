"""A client told "started" finds the new run when it asks the broadcaster at once.

The supervisor publishes a run's first event, then answers the caller; the caller
asks the broadcaster for the session's events. Both messages can wait in the
broadcaster's sockets at the same reactor round, and the reactor serves `replay`
before `ingest`: answered from the log alone, the reply ended at the previous run's
DONE and a `stop_at=last` stream closed before the run it had just started (seen in
CI, `test_a_message_to_a_running_session_reaches_its_next_model_call`).

Real sockets, one reactor round run by hand: both messages are queued (observed
through ZMQ_EVENTS) before the broadcaster looks at either.
"""

from __future__ import annotations

import time
from pathlib import Path

import zmq

from actors.broadcaster.actor import Broadcaster
from actors.broadcaster.store import EventStore
from actors.supervisor.journal import Journal
from bus.codec import decode, encode
from bus.endpoints import Endpoints
from bus.messages import Envelope, Event, ReplayBatch, ReplayRequest

SID = "s1"


def _event(seq: int, type_: str) -> bytes:
    return encode(Envelope(Event(seq, type_, 1, 0.0, {}), sid=SID))


def _until_readable(sock: zmq.Socket[bytes], what: str) -> None:
    deadline = time.monotonic() + 10
    while not sock.get(zmq.EVENTS) & zmq.POLLIN:
        assert time.monotonic() < deadline, f"{what} never arrived"
        time.sleep(0.001)


def test_a_replay_answered_after_what_ingest_already_holds(short_home):
    home = Path(short_home)
    endpoints = Endpoints.for_home(home)
    endpoints.prepare()
    journal = Journal(home / "sessions.db", reserve_mb=0)
    broadcaster = Broadcaster(endpoints, EventStore(journal.path))
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    asker = ctx.socket(zmq.DEALER)
    try:
        push.connect(endpoints.address("ingest"))
        asker.connect(endpoints.binds("replay")[0])
        for seq, type_ in enumerate(["SESSION_START", "DONE"], 1):  # the first run
            broadcaster.handle_event(None, decode(_event(seq, type_)), _event(seq, type_))
        push.send(_event(3, "SESSION_START"))  # the next run, published before the reply
        _until_readable(broadcaster.ingest.sock, "the next run's first event")
        asker.send(encode(Envelope(ReplayRequest(1, 0), id="r", sid=SID)))
        _until_readable(broadcaster.replay.sock, "the replay request")

        broadcaster.reactor._serve_round()

        frames = asker.recv_multipart()
        reply = decode(frames[-1]).body
        assert isinstance(reply, ReplayBatch)
        assert reply.last_seq == 3
        assert [decode(f).body.type for f in reply.events] == [
            "SESSION_START", "DONE", "SESSION_START"]
    finally:
        push.close(linger=0)
        asker.close(linger=0)
        ctx.term()
        broadcaster.reactor.close()
        broadcaster.log.store.close()
        journal.close()
