"""The codec: round trips, and every kind of bad frame is a BadFrame."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from bus.codec import MAX_FRAME_BYTES, decode, encode, encode_event, event_head
from bus.errors import BadFrame
from bus.messages import MESSAGE_TYPES, Envelope, Event, StartRun, ToolJob


def test_round_trip_keeps_every_field():
    env = Envelope(Event(3, "TOKEN", 1, 1.5, {"text": "hi"}), id="m1", sid="s1", job="j",
                   deadline=9.0)
    assert decode(encode(env)) == env


def test_every_kind_is_registered_once():
    kinds = [t.KIND for t in MESSAGE_TYPES]
    assert len(kinds) == len(set(kinds)) and all(kinds)


@pytest.mark.parametrize(
    "frame, reason",
    [
        (b"\xc1garbage", "malformed"),
        (msgpack.packb({"a": 1}), "malformed"),
        (msgpack.packb([2, "start_run", "", "", "", 0, {"prompt": "x"}]), "version"),
        (msgpack.packb([1, "nope", "", "", "", 0, {}]), "unknown_kind"),
        (msgpack.packb([1, "start_run", "", "", "", 0, {"prompt": 5}]), "field_type"),
        (msgpack.packb([1, "start_run", "", "", "", 0, {}]), "field_type"),
        (msgpack.packb([1, "start_run", "", "", "", 0, {"prompt": "x", "bogus": 1}]), "field_type"),
        (msgpack.packb([1, "start_run", 7, "", "", 0, {"prompt": "x"}]), "field_type"),
        (msgpack.packb([1, "tool_job", "", "", "", 0, {"name": "x", "input": [1]}]), "field_type"),
    ],
)
def test_bad_frames_are_refused_with_a_reason(frame, reason):
    with pytest.raises(BadFrame) as exc:
        decode(frame)
    assert exc.value.reason == reason


def test_oversize_frames_are_refused_both_ways():
    with pytest.raises(BadFrame, match="oversize"):
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    with pytest.raises(BadFrame, match="oversize"):
        encode(Envelope(StartRun("x" * (MAX_FRAME_BYTES + 1))))


def test_bool_is_not_an_int():
    frame = msgpack.packb([1, "start_run", "", "", "", 0, {"prompt": "x", "max_turns": True}])
    with pytest.raises(BadFrame):
        decode(frame)
    job = Envelope(ToolJob("shell", {"command": "ls"}))
    assert decode(encode(job)).body.input == {"command": "ls"}


def test_encode_event_is_encode_of_the_event_envelope():
    from bus.vocab import EventType
    data = {"tool_use_id": "t1", "output": "é" * 3, "usage": {"cost_usd": 1.5e-05}}
    for type_ in (EventType.TOOL_END, "TURN_START"):
        env = Envelope(Event(7, type_, 2, 1733500000.25, data), sid="s1")
        frame = encode_event("s1", 7, type_, 2, 1733500000.25, data)
        assert frame == encode(env)
        assert decode(frame) == env
    with pytest.raises(BadFrame) as bad:
        encode_event("s1", 1, "TOKEN", 1, 0.0, {"text": "x" * MAX_FRAME_BYTES})
    assert bad.value.reason == "oversize"
    with pytest.raises(BadFrame) as bad:
        encode_event("s1", 1, "TOKEN", 1, 0.0, {"text": object()})
    assert bad.value.reason == "unencodable"


def test_with_body_is_replace_of_the_body():
    env = Envelope(ToolJob("shell", {"command": "ls"}), id="j1", sid="s", job="j1",
                   deadline=5.0, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    other = ToolJob("read_file", {"path": "x"})
    assert env.with_body(other) == dataclasses.replace(env, body=other)



def _event_frame(**fields: object) -> bytes:
    body = {"seq": 3, "type": "TOOL_END", "turn": 1, "ts": 1.5, "data": {"output": "x"},
            **fields}
    return msgpack.packb([1, "event", "", "s1", "", 0.0, body])


@pytest.mark.parametrize("frame", [
    _event_frame(),
    _event_frame(ts=2),  # (an int time: a number, as decode takes it)
    encode_event("s1", 7, "TURN_END", 2, 1733500000.25, {"usage": {"cost_usd": 1.5e-05}}),
])
def test_event_head_reads_what_decode_reads(frame):
    env = decode(frame)
    assert event_head(frame) == (env.sid, env.body.seq, env.body.type, env.body.data)


@pytest.mark.parametrize("frame", [
    _event_frame(seq=True),  # (a bool is not an int)
    _event_frame(seq="3"),
    _event_frame(type=5),
    _event_frame(turn=1.5),
    _event_frame(ts="now"),
    _event_frame(data=[1]),
    _event_frame(extra=1),
    msgpack.packb([1, "event", "", 5, "", 0.0, {"seq": 3, "type": "T", "turn": 1, "ts": 1.5,
                                                "data": {}}]),
    msgpack.packb([2, "event", "", "s1", "", 0.0, {"seq": 3, "type": "T", "turn": 1,
                                                   "ts": 1.5, "data": {}}]),
    msgpack.packb([1, "event", "", "s1", "", 0.0, {"seq": 3}]),
])
def test_event_head_leaves_every_odd_event_to_decode_which_refuses_it(frame):
    """Whatever `decode` refuses, `event_head` does not read: it answers None (the
    caller decodes it and refuses it with decode's reason)."""
    assert event_head(frame) is None
    with pytest.raises(BadFrame):
        decode(frame)


def test_event_head_leaves_other_kinds_and_traced_events_to_decode():
    assert event_head(encode(Envelope(StartRun("x")))) is None
    traced = encode(Envelope(Event(1, "TURN_START", 1, 1.0, {}), sid="s1",
                             traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    assert event_head(traced) is None and decode(traced).body.seq == 1


def test_event_head_refuses_what_is_no_frame():
    with pytest.raises(BadFrame) as bad:
        event_head(b"\xc1garbage")
    assert bad.value.reason == "malformed"
    with pytest.raises(BadFrame) as bad:
        event_head(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert bad.value.reason == "oversize"
