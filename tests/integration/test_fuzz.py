"""Random and mutated frames on every bound socket while a normal session runs beside:
no actor dies, the session completes with the right result, counters show the rejects."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
import zmq
from homes import make_home
from hostkit import assert_one_run, running_host
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.sandbox.workspaces import remove_home
from bus.client import Client
from bus.codec import encode
from bus.endpoints import Endpoints
from bus.messages import BY_KIND, Envelope, Event, Ready, StartRun

STEPS = 8
SCRIPTS = {"steady": [
    *({"reply": [{"type": "tool_use", "name": "shell",
                  "input": {"command": f"sleep 0.2; echo step {i}"}}]} for i in range(STEPS)),
    {"reply": "all steps done", "stop_reason": "end_turn"},
]}

#: Valid frames to mutate: what each socket normally receives.
SEEDS = [
    encode(Envelope(StartRun("hello"), id="r1")),
    encode(Envelope(Event(1, "TOKEN", 1, 0.0, {"text": "x"}), sid="s")),
    encode(Envelope(Ready("tool", 4, []), id="w")),
]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                    st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@st.composite
def envelopes(draw):
    """Well-formed msgpack envelopes with a real or random kind and random fields."""
    import msgpack

    kind = draw(st.sampled_from(sorted(BY_KIND)) | st.text(max_size=12))
    body = draw(st.dictionaries(st.text(max_size=12), values, max_size=5))
    version = draw(st.sampled_from([1, 1, 1, 0, 2, "1", None]))
    deadline = draw(st.one_of(st.just(0), st.floats(), st.integers(-2**63, 2**64 - 1)))
    return msgpack.packb([version, kind, draw(st.text(max_size=8)), "", "", deadline, body])


@st.composite
def mutated(draw):
    """A valid frame with bytes flipped, cut or inserted."""
    frame = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(0, len(frame) - 1)))
        if op == "flip" and frame:
            frame[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del frame[at:]
        else:
            frame[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(frame)


frames = st.one_of(st.binary(max_size=200), envelopes(), mutated())
multipart = st.lists(frames, min_size=1, max_size=3)
SOCKETS = [("api", zmq.DEALER), ("control", zmq.DEALER), ("work", zmq.DEALER),
           ("replay", zmq.DEALER), ("ingest", zmq.PUSH)]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opf-")
    scenario = tmp_path_factory.mktemp("fuzz") / "scenario.json"
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as running:
            yield running
    finally:
        remove_home(Path(home))


def test_fuzzed_frames_on_every_socket_while_a_session_runs(host, tmp_path):
    result: dict = {}

    def normal_session():
        async def go():
            async with Client.connect(Path(host)) as client:
                started = await client.start("#steady go", cwd=str(tmp_path))
                result["events"] = [e async for e in client.events(
                    started.session, started.from_seq, stop_at="first")]
        asyncio.run(go())

    beside = threading.Thread(target=normal_session)
    beside.start()
    ends = Endpoints.for_home(Path(host))
    ctx = zmq.Context()
    socks = {}
    for name, kind in SOCKETS:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(ends.address(name))
        socks[name] = sock

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target=st.sampled_from([name for name, _ in SOCKETS]), parts=multipart)
    def blast(target, parts):
        # Valid Ready frames on `work` would register a (silent) worker: real
        # workers own that socket; the frames here are everything else.
        socks[target].send_multipart(parts)

    try:
        blast()
    finally:
        for sock in socks.values():
            sock.close()
        ctx.term()
    beside.join(timeout=60)
    assert not beside.is_alive()

    events = result["events"]
    assert_one_run(events)
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "all steps done"
    outputs = [e["data"]["output"].strip() for e in events if e["type"] == "TOOL_END"]
    assert outputs == [f"step {i}" for i in range(STEPS)]

    async def counters():
        async with Client.connect(Path(host)) as client:
            return await client.stats()

    stats = asyncio.run(counters())
    rejected = sum(sum(p["rejected"].values()) for p in stats["ports"].values())
    assert rejected > 0
    state = json.loads((Path(host) / "run" / "host.json").read_text())
    assert all(a["restarts"] == 0 for a in state["actors"]), state["actors"]
