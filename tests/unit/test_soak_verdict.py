"""The soak's verdict on tool errors: a failed tool call fails the soak unless a kill or
the driver's own cancel explains it (`bench.soak_verdict`)."""

from __future__ import annotations

from actors.core.machine import INTERRUPTED, WORKER_LOST
from bench.soak_verdict import Kill, SessionRun, SoakConfig, report, tool_error_problems

T0 = 1000.0  # the kills' clock: a session from 2 s to 4 s after the first started


def run_with(output: str, kind: str = "read", *, is_error: bool = True) -> SessionRun:
    events = [
        {"seq": 1, "type": "SESSION_START", "turn": 0, "ts": 0.0, "data": {}},
        {"seq": 2, "type": "TOOL_START", "turn": 1, "ts": 0.0,
         "data": {"tool_use_id": "t", "name": "read_file", "input": {}}},
        {"seq": 3, "type": "TOOL_END", "turn": 1, "ts": 0.0,
         "data": {"tool_use_id": "t", "name": "read_file", "is_error": is_error,
                  "output": output, "duration_ms": 1.0}},
        {"seq": 4, "type": "DONE", "turn": 2, "ts": 0.0, "data": {"text": "", "turns": 2}},
    ]
    return SessionRun(0, kind, "p", started_at=T0 + 2.0, ended_at=T0 + 4.0, session="s",
                      from_seq=1, views=[events, list(events)], stored=list(events))


def test_an_unreadable_file_fails_the_soak():
    runs = [run_with("read_file: data/notes.txt: No such file or directory")]
    (problem,) = tool_error_problems(runs, [], T0)
    assert "failed unexplained" in problem and "No such file" in problem
    got = {"runs": runs, "kills": [], "kill_problems": [], "actors": [], "warmup": [],
           "rss_before": {"host": 1, "total": 1}, "rss_after": {"host": 1, "total": 1},
           "disk": {"files": {}, "pages": {}}, "stats": {}, "sessions_s": 1.0, "run_s": 1.0,
           "t0": T0}
    rep = report(SoakConfig(retention_max_sessions=None, rss_tolerance=None), got, [])
    assert not rep["ok"] and problem in rep["problems"]
    assert rep["events"]["tool_errors_unexplained"] == 1
    # A successful call is no finding.
    assert tool_error_problems([run_with("fine", is_error=False)], [], T0) == []


def test_the_drivers_cancel_explains_its_cancel_sessions_only():
    assert tool_error_problems([run_with("cancelled by the user", "cancel")], [], T0) == []
    assert tool_error_problems([run_with("cancelled by the user", "shell")], [], T0)


def test_a_kill_explains_a_failure_only_of_its_actor_while_the_session_ran():
    supervisor = Kill(3.0, "supervisor", 1)
    executor = Kill(3.0, "executor-2", 2)
    assert tool_error_problems([run_with(INTERRUPTED)], [supervisor], T0) == []
    assert tool_error_problems([run_with(INTERRUPTED)], [executor], T0)  # not that actor
    assert tool_error_problems([run_with(INTERRUPTED)], [Kill(30.0, "supervisor", 1)], T0)
    for lost in (WORKER_LOST, "shell failed: executor died", "shell failed: executor unreachable"):
        assert tool_error_problems([run_with(lost)], [executor], T0) == []
        assert tool_error_problems([run_with(lost)], [supervisor], T0)
