"""The events of one commit travel supervisor -> broadcaster as one `EventBatch`, and
the broadcaster takes them exactly as if each had come alone: stored in order,
counted, and published one event per message on the session's topic.

Real sockets (the supervisor's PUSH, the broadcaster's PULL and XPUB, a viewer's
SUB), reactor rounds run by hand once what they serve is observably queued.
"""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
import zmq
from supervisorkit import add_session, supervisor_on_disk

import actors.supervisor.eventpush as eventpush
from actors.broadcaster.actor import Broadcaster
from actors.broadcaster.store import EventStore
from actors.core.session import Session
from bus.codec import decode, encode
from bus.messages import PROTOCOL_VERSION, Envelope, Event, EventBatch


def _until_readable(sock: zmq.Socket[bytes], what: str) -> None:
    deadline = time.monotonic() + 10
    while not sock.get(zmq.EVENTS) & zmq.POLLIN:
        assert time.monotonic() < deadline, f"{what} never arrived"
        time.sleep(0.001)


def _event(sid: str, seq: int, type_: str = "TOKEN", data: dict | None = None) -> bytes:
    return encode(Envelope(Event(seq, type_, 1, 0.0, data or {}), sid=sid))


class Pair:
    """A supervisor with a session log and a broadcaster, wired by their real sockets,
    and a viewer subscribed to every session."""

    def __init__(self, home: str) -> None:
        endpoints, self.journal, self.supervisor = supervisor_on_disk(home)
        self.broadcaster = Broadcaster(endpoints, EventStore(self.journal.path))
        self.ctx = zmq.Context()
        self.viewer = self.ctx.socket(zmq.SUB)
        self.viewer.setsockopt(zmq.SUBSCRIBE, b"")
        self.viewer.connect(endpoints.binds("events")[0])
        _until_readable(self.broadcaster.events.sock, "the viewer's subscription")
        self.broadcaster.events.pending = True
        self.broadcaster.reactor._serve_round()  # (answered with `Subscribed`)
        _until_readable(self.viewer, "Subscribed")
        self.viewer.recv_multipart()

    def session(self, sid: str) -> Session:
        return add_session(self.supervisor, sid)

    def take_ingest(self) -> int:
        """Let the broadcaster serve what ingest holds; how many messages it took."""
        _until_readable(self.broadcaster.ingest.sock, "the events")
        before = self.broadcaster.ingest.received
        self.broadcaster.ingest.pending = True  # (what its fd firing says in the loop)
        self.broadcaster.reactor._serve_round()
        return self.broadcaster.ingest.received - before

    def viewed(self, n: int) -> list[tuple[bytes, str, int, str]]:
        """The next `n` messages a viewer gets: (topic, sid, seq, type) each."""
        out = []
        for _ in range(n):
            _until_readable(self.viewer, "a published event")
            topic, frame = self.viewer.recv_multipart()
            env = decode(frame)
            assert isinstance(env.body, Event)
            out.append((topic, env.sid, env.body.seq, env.body.type))
        assert not self.viewer.get(zmq.EVENTS) & zmq.POLLIN, "more than one message an event"
        return out

    def close(self) -> None:
        self.viewer.close(linger=0)
        self.ctx.term()
        self.broadcaster.reactor.close()
        self.broadcaster.log.store.close()
        self.supervisor.reactor.close()
        self.journal.close()


@pytest.fixture
def pair(short_home):
    made = Pair(short_home)
    yield made
    made.close()


def test_a_commit_is_one_message_and_viewers_see_each_event_alone(pair):
    a, b = pair.session("sa"), pair.session("sb")

    async def commit() -> None:
        for session, type_ in [(a, "SESSION_START"), (b, "SESSION_START"), (a, "TURN_START"),
                               (b, "TURN_START"), (a, "TURN_END")]:
            pair.supervisor.emit(session, type_, 1, {})
        await asyncio.sleep(0)  # committed (and pushed) at the end of the iteration

    asyncio.run(commit())
    assert pair.take_ingest() == 1  # five events, one message
    assert pair.viewed(5) == [
        (b"sa", "sa", 1, "SESSION_START"), (b"sb", "sb", 1, "SESSION_START"),
        (b"sa", "sa", 2, "TURN_START"), (b"sb", "sb", 2, "TURN_START"),
        (b"sa", "sa", 3, "TURN_END"),
    ]
    frames, _ = pair.broadcaster.log.range("sa", 1, 10, 1 << 20)
    assert [decode(f).body.seq for f in frames] == [1, 2, 3]
    assert pair.broadcaster.counts.events == {"SESSION_START": 2, "TURN_START": 2,
                                              "TURN_END": 1}
    assert pair.broadcaster.refused == {}


def test_a_large_commit_goes_in_several_batches_in_order(pair, monkeypatch):
    monkeypatch.setattr(eventpush, "BATCH_BYTES", 1_000)
    s = pair.session("sa")

    async def commit() -> None:
        pair.supervisor.emit(s, "SESSION_START", 1, {})
        for _ in range(9):  # ~300 bytes each: three to a batch
            pair.supervisor.emit(s, "TURN_END", 1, {"text": "x" * 250})
        await asyncio.sleep(0)

    asyncio.run(commit())
    taken = 0
    while len(pair.broadcaster.log.range("sa", 1, 100, 1 << 20)[0]) < 10:
        taken += pair.take_ingest()
    assert taken >= 3
    assert [seq for _, _, seq, _ in pair.viewed(10)] == list(range(1, 11))


def test_one_event_goes_alone_as_before(pair):
    s = pair.session("sa")

    async def commit() -> None:
        pair.supervisor.emit(s, "SESSION_START", 1, {})
        await asyncio.sleep(0)

    asyncio.run(commit())
    _until_readable(pair.broadcaster.ingest.sock, "the event")
    frame = pair.broadcaster.ingest.sock.recv()
    assert isinstance(decode(frame).body, Event)  # no batch around a single event


def test_a_malformed_batch_is_dropped_and_the_broadcaster_goes_on(pair):
    push = pair.ctx.socket(zmq.PUSH)
    try:
        push.connect(pair.broadcaster.ingest.sock.getsockopt_string(zmq.LAST_ENDPOINT))
        not_frames = msgpack.packb([PROTOCOL_VERSION, EventBatch.KIND, "", "", "", 0,
                                    {"frames": [1, 2]}], use_bin_type=True)
        nested = encode(Envelope(EventBatch([_event("sa", 2), _event("sa", 3)])))
        push.send(not_frames)  # the whole message: refused by the codec
        push.send(encode(Envelope(EventBatch([
            _event("sa", 1, "SESSION_START"),
            b"\x93not an envelope",  # one event that does not decode: that one only
            nested,  # a batch in a batch: refused
            msgpack.packb([PROTOCOL_VERSION, "event", "", "sa", "", 0.0, {  # a bad field
                "seq": 2, "type": "TURN_START", "turn": 1, "ts": "now", "data": {}}]),
            _event("sa", 2, "TURN_START"),
        ]))))
        push.send(_event("sa", 3, "TURN_END"))  # a single event after them, as before
        taken = 0
        while taken < 3:
            taken += pair.take_ingest()
    finally:
        push.close(linger=0)
    assert pair.broadcaster.ingest.rejected == {"field_type": 1}
    assert pair.broadcaster.refused == {"batch:malformed": 1, "batch:nested": 1,
                                        "batch:field_type": 1}
    assert [seq for _, _, seq, _ in pair.viewed(3)] == [1, 2, 3]


def test_an_event_whose_handling_fails_costs_that_event_only(pair, monkeypatch):
    """An error while one event of a batch is taken (here its count) is counted and
    logged; the batch's other events are taken as usual."""
    observe = pair.broadcaster.counts.observe

    def failing(kind, data):
        if kind == "TURN_START":
            raise RuntimeError("a bug")
        observe(kind, data)

    monkeypatch.setattr(pair.broadcaster.counts, "observe", failing)
    push = pair.ctx.socket(zmq.PUSH)
    try:
        push.connect(pair.broadcaster.ingest.sock.getsockopt_string(zmq.LAST_ENDPOINT))
        push.send(encode(Envelope(EventBatch([
            _event("sa", 1, "SESSION_START"), _event("sa", 2, "TURN_START"),
            _event("sa", 3, "TURN_END")]))))
        pair.take_ingest()
    finally:
        push.close(linger=0)
    assert pair.broadcaster.refused == {"batch:handler_error": 1}
    assert [seq for _, _, seq, _ in pair.viewed(2)] == [1, 3]
