"""The stall watchdog's bounds at their defaults, and the offline model's new faults."""

from __future__ import annotations

import asyncio

import pytest

from actors.llm_caller.stalls import StallWatch, StreamBounds
from actors.offline_model.plan import Event, Head, Stall, plan_response
from actors.offline_model.scenario import ScenarioError, parse_scenario


def at(watch: StallWatch) -> tuple[float, str]:
    """The watch's deadline, relative to its start, and the bound it is (to the
    microsecond: `start + 60.0 - start` is 59.99999999999272 when the loop's clock,
    the machine's uptime, is large enough)."""
    deadline, name = watch._deadline()
    return round(deadline - watch.start, 6), name


def with_watch(check) -> None:
    async def main():
        watch = StallWatch(StreamBounds())
        async with watch.timeout:  # entered, as the backend does, so it can be moved
            check(watch)

    asyncio.run(main())


def test_before_headers_only_the_first_content_bound_runs():
    def check(w):
        assert at(w) == (60.0, "first")

    with_watch(check)


def test_a_slow_start_pinging_every_second_lives_until_the_first_content_bound():
    def check(w):
        w.on_headers()
        w.on_event("message_start")
        for second in range(1, 11):  # 10 s of pings, one a second
            w.last_byte = w.start + second
            w._rearm()
            deadline, name = at(w)
            assert deadline == second + 2.0 and name == "idle"  # never before the next ping
        w.last_byte = w.start + 59.5
        w._rearm()
        assert at(w) == (60.0, "first")

    with_watch(check)


def test_a_pause_with_pings_lives_until_the_pause_bound_and_silence_until_idle():
    def check(w):
        w.on_headers()
        w.on_event("content_block_start")
        w.last_content = w.last_byte = w.start + 1.0
        w._rearm()
        assert at(w) == (3.0, "idle")  # silent: 2 s
        w.last_byte = w.start + 30.5  # pings kept coming
        w._rearm()
        assert at(w) == (31.0, "pause")

    with_watch(check)


def test_the_stall_error_names_bound_setting_and_phase():
    def check(w):
        w.on_headers()
        w.on_event("message_start")
        error = str(w.stalled())
        assert "after message_start" in error and "OPLOOP_STREAM_IDLE_S" in error

    with_watch(check)


def test_a_stall_before_headers_is_planned_before_the_head():
    scenario = parse_scenario([{"fault": "stall", "seconds": 5, "before_headers": True,
                                "reply": "hi"}])
    plan = plan_response({"model": "m", "stream": True, "messages": []}, scenario.next_turn(),
                         message_id="msg_1", request_id="req_1")
    assert isinstance(plan[0], Stall) and isinstance(plan[1], Head)


def test_an_orphan_delta_is_spliced_into_the_stream():
    scenario = parse_scenario([{"fault": "malformed", "what": "orphan_delta", "reply": "hi"}])
    plan = plan_response({"model": "m", "stream": True, "messages": []}, scenario.next_turn(),
                         message_id="msg_1", request_id="req_1")
    events = [a.data for a in plan if isinstance(a, Event)]
    assert any(e.get("index") == 99 for e in events)


@pytest.mark.parametrize("turn, field", [
    ({"fault": "stall", "seconds": 1, "before_headers": True, "ping_every_s": 1},
     "before_headers"),
    ({"fault": "malformed", "what": "nonsense"}, "what"),
])
def test_bad_fault_fields_are_named(turn, field):
    with pytest.raises(ScenarioError, match=field):
        parse_scenario([turn])


def test_a_stall_doubles_only_the_bound_and_phase_that_fired_up_to_30s():
    from actors.llm_caller.failures import StreamStalled
    from actors.llm_caller.stalls import StreamBounds

    def idle(phase):
        return StreamStalled(2.0, "idle", "OPLOOP_STREAM_IDLE_S", "", phase)

    b = StreamBounds()
    first = b.widened(idle("first event"))
    assert (first.seconds("idle", "first event"), first.seconds("idle", "between events"),
            first.seconds("idle", "inside a tool input")) == (4.0, 2.0, 2.0)
    between = b.widened(idle("between events"))
    assert (between.seconds("idle", "first event"), between.seconds("idle", "between events"),
            between.seconds("idle", "inside a tool input")) == (2.0, 4.0, 2.0)
    tool = b
    for _ in range(6):
        tool = tool.widened(idle("inside a tool input"))
    assert tool.seconds("idle", "inside a tool input") == 30.0  # 2, 4, 8, 16, 30
    assert StreamBounds(first_s=10).widened(StreamStalled(10, "first")).first_s == 20
    assert StreamBounds(first_s=60).widened(StreamStalled(60, "first")).first_s == 60
    assert StreamBounds(idle_s=0).widened(idle("between events")).idle_s == 0  # off stays
