"""Live tool output in parts: the executor's batching and bound (`LiveOutput`), the
host's own bound (`HostBound`), and how the CLI shows `TOOL_OUTPUT`."""

from __future__ import annotations

import asyncio
import io

from actors.render import Renderer
from actors.tools.live import HostBound, LiveOutput, cut_note


def batches_of(feed, **bounds):
    """What a `LiveOutput` emits for `feed(live)`, closed, without time-based flushes."""
    sent = []

    async def main():
        live = LiveOutput(lambda *batch: sent.append(batch), interval_s=60.0, **bounds)
        feed(live)
        live.close()

    asyncio.run(main())
    return sent


def test_streams_keep_their_order_and_a_split_character_stays_whole():
    euro = "€".encode()

    def feed(live):
        live.feed("stdout", b"a" + euro[:1])
        live.feed("stdout", euro[1:] + b"b\n")
        live.feed("stderr", b"oops\n")
        live.feed("stdout", b"c\n")

    assert batches_of(feed) == [("stdout", "a€b\n", False), ("stderr", "oops\n", False),
                                ("stdout", "c\n", False)]


def test_batches_by_size_and_by_time():
    sent = []

    async def main():
        live = LiveOutput(lambda *batch: sent.append(batch), interval_s=0.01)
        live.feed("stdout", b"x" * 600)  # over the batcher's 512 characters: at once
        assert sent == [("stdout", "x" * 600, False)]
        live.feed("stdout", b"y")
        assert len(sent) == 1
        while len(sent) < 2:  # the interval's flush, on the loop's timer
            await asyncio.sleep(0.005)
        live.close()

    asyncio.run(main())
    assert sent[1] == ("stdout", "y", False)


def test_past_the_character_bound_one_marker_and_nothing_more():
    def feed(live):
        live.feed("stdout", b"0123456789")
        live.feed("stderr", b"abcdefghij")  # crosses 15
        live.feed("stdout", b"more")

    sent = batches_of(feed, max_chars=15)
    assert sent == [("stdout", "0123456789", False), ("stderr", "abcde", False),
                    ("stderr", cut_note(15, 1000), True)]


def test_past_the_batch_bound_one_marker_and_nothing_more():
    def feed(live):
        for i in range(5):
            live.feed("stdout" if i % 2 else "stderr", b"%d" % i)  # each change flushes

    sent = batches_of(feed, max_batches=3)
    assert [b[1] for b in sent] == ["0", "1", "2", cut_note(32 * 1024, 3)]
    assert [b[2] for b in sent] == [False, False, False, True]


def test_the_host_bounds_a_worker_that_does_not():
    bound = HostBound(max_chars=10, max_batches=100)
    assert bound.admit("stdout", "12345", False) == ("12345", False)
    assert bound.admit("nonsense", "x", False) is None  # not a stream
    assert bound.admit("stdout", "678901", False) == (cut_note(10, 100), True)
    assert bound.admit("stdout", "more", False) is None
    # A worker's own marker passes (short); nothing after it.
    bound = HostBound()
    assert bound.admit("stderr", "[stops]", True) == ("[stops]", True)
    assert bound.admit("stderr", "x", False) is None


def event(kind: str, data: dict) -> dict:
    return {"seq": 1, "type": kind, "turn": 1, "ts": 0.0, "data": data, "session": "s"}


def test_the_cli_shows_whole_lines_under_the_tool_and_hides_them_on_request():
    evs = [event("TOOL_START", {"tool_use_id": "t1", "name": "shell", "input": {}}),
           event("TOOL_OUTPUT", {"call_id": "t1", "stream": "stdout", "text": "one\ntw"}),
           event("TOOL_OUTPUT", {"call_id": "t1", "stream": "stderr", "text": "bad\n"}),
           event("TOOL_OUTPUT", {"call_id": "t1", "stream": "stdout", "text": "o\nthree"}),
           event("TOOL_END", {"tool_use_id": "t1", "name": "shell", "is_error": False,
                              "output": "", "duration_ms": 5})]
    out = io.StringIO()
    render = Renderer(out=out)
    for ev in evs:
        render.event(ev)
    assert out.getvalue() == ("→ shell {}\n  │ one\n  ! bad\n  │ two\n  │ three\n"
                              "  ✓ shell (5 ms)\n")
    quiet = io.StringIO()
    render = Renderer(out=quiet, tool_output=False)
    for ev in evs:
        render.event(ev)
    assert quiet.getvalue() == "→ shell {}\n  ✓ shell (5 ms)\n"
    lines = io.StringIO()
    render = Renderer(json_lines=True, out=lines, tool_output=False)
    for ev in evs:
        render.event(ev)
    assert "TOOL_OUTPUT" not in lines.getvalue() and lines.getvalue().count("\n") == 2
