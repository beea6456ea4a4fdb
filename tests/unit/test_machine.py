"""The run's pure state machine: random input sequences keep its invariants after every
step (the driver that carries out its actions is tested in test_driver.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.core.history import Message, append_blocks, is_valid
from actors.core.machine import (
    INTERRUPTED,
    TERMINAL,
    AbortJobs,
    Action,
    Begin,
    CallModel,
    Cancel,
    Decide,
    Delta,
    Emit,
    End,
    Failed,
    Input,
    ModelFailed,
    ModelReplied,
    Resume,
    Retry,
    Routed,
    RunState,
    RunToolCalls,
    Say,
    Start,
    ToolFinished,
    ToolStarted,
    WorkerLost,
    step,
)
from actors.core.turn import ToolOutcome
from actors.permissions import parse_rules
from actors.usage import ZERO

#: Every shell call needs approval.
ASK = parse_rules({"shell": "ask"})

SHELL = {"name": "shell", "description": "run", "input_schema": {"type": "object"},
         "tags": ["exec"], "core": False, "risky": True}


def tool_reply(n: int, turn: int, name: str = "shell") -> Message:
    return {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "text", "text": f"calling {n}"},
        *({"type": "tool_use", "id": f"t{turn}-{i}", "name": name, "input": {"c": i}}
          for i in range(n))]}


def text_reply(text: str, stop: str = "end_turn") -> Message:
    return {"role": "assistant", "stop_reason": stop, "content": [{"type": "text", "text": text}]}


@dataclass
class World:
    """A driver with no I/O: carries out actions on a history and an event list."""

    state: RunState = field(default_factory=RunState)
    history: list[Message] = field(default_factory=list)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    calling: CallModel | None = None
    jobs: list[Any] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    open_tools: set[str] = field(default_factory=set)
    terminals_this_run: int = 0
    #: Texts said while a run was open (each must arrive once, in order).
    said: list[str] = field(default_factory=list)


    deciding: bool = False
    requested: set[str] = field(default_factory=set)

    def feed(self, event: Input) -> list[Action]:
        was_running = self.state.running
        if isinstance(event, Say) and was_running:
            self.said.append(event.text)
        self.state, actions = step(self.state, event)
        self.deciding = isinstance(event, Decide)
        for action in actions:
            self.carry_out(action, was_running or isinstance(event, Start))
        if any(isinstance(a, Emit) and a.type == "TURN_START" for a in actions):
            assert not self.state.said, "a model call began with a message still queued"
        self.check()
        return actions

    def begin(self, event: Input) -> list[Action]:
        """Feed a `Start` or `Resume`, then the driver's `Begin`: both steps' actions."""
        return self.feed(event) + self.feed(Begin())

    def carry_out(self, action: Action, may_emit: bool) -> None:
        if isinstance(action, Emit):
            assert may_emit, f"{action.type} emitted outside a run"
            assert self.terminals_this_run == 0 or action.type == "SESSION_START", \
                f"{action.type} after the run's terminal event"
            if action.type == "SESSION_START":
                self.terminals_this_run = 0
            for role, added in action.added:
                append_blocks(self.history, role, list(added))
            self.events.append((action.type, action.turn, action.data))
            if action.type == "APPROVAL_REQUESTED":
                self.requested.add(action.data["call_id"])
            elif action.type == "APPROVAL_DECIDED":  # once per call, after its request
                self.requested.remove(action.data["call_id"])
            elif action.type == "TOOL_START":
                assert action.data["tool_use_id"] not in self.requested  # never before
                self.open_tools.add(action.data["tool_use_id"])
            elif action.type == "TOOL_END":
                self.open_tools.discard(action.data["tool_use_id"])
            elif action.type in TERMINAL:
                self.requested.clear()  # the run's end ends its waiting calls
                self.terminals_this_run += 1
                # Every TOOL_START has its TOOL_END, whatever ends the run.
                assert not self.open_tools, self.open_tools
        elif isinstance(action, CallModel):
            self.calling, self.jobs, self.started = action, [], []
        elif isinstance(action, RunToolCalls) and self.deciding:  # joins the jobs running
            self.jobs.extend(action.jobs)
        elif isinstance(action, RunToolCalls):  # (an adopted call started before)
            self.calling, self.jobs = None, list(action.jobs)
            self.started = [j.call.id for j in action.jobs if j.adopted]
        elif isinstance(action, AbortJobs):
            self.calling, self.jobs, self.started = None, [], []
        elif isinstance(action, End):
            assert self.events[-1][0] == action.type

    def check(self) -> None:
        """The invariants, after every step."""
        assert self.terminals_this_run <= 1
        assert not self.state.pending or self.state.running
        assert not self.state.asks or self.state.phase == "tools"
        assert {a[0] for a in self.state.asks} <= self.requested
        if not self.state.running:
            self.calling, self.jobs, self.started = None, [], []
            if self.history:
                assert is_valid(self.history), self.history
        last = self.history[-1] if self.history else None
        expected = self.state.last
        if not self.state.pending:
            assert last == expected


REPLIES = st.sampled_from(["text", "tools1", "tools2", "pause", "hidden", "max_tokens"])


def reply_for(kind: str, turn: int) -> Message:
    reply = {"text": text_reply("done"), "tools1": tool_reply(1, turn),
             "tools2": tool_reply(2, turn), "pause": text_reply("hm", "pause_turn"),
             "hidden": tool_reply(1, turn, "secret"),
             "max_tokens": text_reply("cut", "max_tokens")}[kind]
    # Usage as a priced reply carries it: both loops must count it alike.
    return {**reply, "usage": {"input_tokens": 100 * turn, "output_tokens": 7,
                               "cache_read_input_tokens": 50, "cost_usd": 0.001}}


def plausible(world: World, draw: Any) -> Input:
    """An input that could happen now (and, now and then, one that could not)."""
    s = world.state
    choices = ["cancel", "resume", "junk", "start", "say", "say"]
    if s.phase == "ready":
        choices += ["begin"] * 6
    if world.calling is not None:
        choices += ["reply"] * 6 + ["delta", "retry", "fail", "lost"]
    if world.jobs:
        choices += ["tool"] * 6 + ["lost"]
    if s.asks:
        choices += ["decide"] * 4
    kind = draw(st.sampled_from(choices))
    if kind == "decide":
        call_id = draw(st.sampled_from([a[0] for a in s.asks]))
        return Decide(call_id, draw(st.sampled_from(["approve", "deny"])), "t", "because",
                      always=draw(st.booleans()))
    if kind == "start":
        return Start("go", draw(st.integers(1, 5)), router=draw(st.booleans()),
                     offered=frozenset({"shell"}), rules=ASK if draw(st.booleans()) else (),
                     check=(lambda t: None if t != "cut" else "not JSON")
                     if draw(st.booleans()) else None)
    if kind == "begin":
        return Begin()
    if kind == "say":
        return Say(f"m{len(world.said)}", draw(st.sampled_from(["local", "control"])))
    if kind == "cancel":
        return Cancel(draw(st.sampled_from(["ui", "operation", "deadline"])))
    if kind == "resume":
        # A restart: what was in flight is gone (or, `adopt`, a tool call in flight may
        # be adopted); the state is the log's fold.
        world.calling, world.jobs, world.started = None, [], []
        return Resume("test", router=draw(st.booleans()), offered=frozenset({"shell"}),
                      rules=s.rules, adopt=draw(st.booleans()))
    if kind == "junk":
        return draw(st.sampled_from([ToolFinished("nope", ToolOutcome("x", False)),
                                     Decide("nope", "approve", "t"),
                                     ToolStarted("nope"), Routed("AGENT"), Retry(),
                                     ModelReplied(text_reply("stray"))]))
    if kind == "delta":
        return Delta(draw(st.sampled_from(["some ", "text", " "])))
    if kind == "retry":
        return Retry()
    if kind == "fail":
        return draw(st.sampled_from([ModelFailed("overloaded", "try later"),
                                     Failed("internal", "a bug")]))
    if kind == "lost":
        return WorkerLost()
    if kind == "reply":
        call = world.calling
        assert call is not None
        world.calling = None
        if call.route:
            return Routed(draw(st.sampled_from(["DIRECT", "AGENT", None])))
        return ModelReplied(reply_for(draw(REPLIES), s.turn))
    job = world.jobs[0]
    if job.call.id not in world.started:
        world.started.append(job.call.id)
        return ToolStarted(job.call.id)
    world.jobs.pop(0)
    return ToolFinished(job.call.id, job.refusal or ToolOutcome("out", False, 1.0))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_inputs_keep_the_invariants_after_every_step(data):
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"}),
                      rules=ASK if data.draw(st.booleans()) else ()))
    for _ in range(data.draw(st.integers(1, 60))):
        world.feed(plausible(world, data.draw))
    # However it went, a ui cancel ends an open run with a valid history.
    world.feed(Cancel("ui"))
    assert not world.state.running
    assert is_valid(world.history)
    kinds = [e[0] for e in world.events]
    assert sum(k in TERMINAL for k in kinds) == kinds.count("SESSION_START")
    assert kinds[-1] in TERMINAL
    assert kinds.count("TOOL_START") == kinds.count("TOOL_END")
    # Every message said into an open run arrived once, in order, as its own event,
    # and is in the history (which stayed valid: never between a call and its result).
    assert [e[2]["text"] for e in world.events if e[0] == "USER_MESSAGE"] == world.said
    texts = [b.get("text") for m in world.history if m["role"] == "user"
             for b in m["content"] if b.get("type") == "text"]
    assert [t for t in texts if t.startswith("m")] == world.said


def test_a_tool_in_flight_at_a_restart_is_never_run_again():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(2, 1)))
    world.feed(ToolStarted("t1-0"))
    world.feed(ToolFinished("t1-0", ToolOutcome("ok", False)))
    world.feed(ToolStarted("t1-1"))
    actions = world.begin(Resume("restart", offered=frozenset({"shell"})))
    kinds = [(a.type, a.data.get("tool_use_id")) for a in actions if isinstance(a, Emit)]
    assert kinds == [("RESUMED", None), ("TOOL_END", "t1-1"), ("TURN_END", None),
                     ("TURN_START", None)]
    assert not any(isinstance(a, RunToolCalls) for a in actions)
    assert CallModel(2) in actions
    results = world.history[-1]["content"]
    assert [(r["content"], r["is_error"]) for r in results] == [("ok", False),
                                                                 (INTERRUPTED, True)]


def test_a_tool_in_flight_at_a_restart_may_be_adopted_and_is_never_started_again():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(3, 1)))
    world.feed(ToolStarted("t1-0"))
    world.feed(ToolFinished("t1-0", ToolOutcome("ok", False)))
    world.feed(ToolStarted("t1-1"))  # in flight; t1-2 never started
    actions = world.begin(Resume("restart", offered=frozenset({"shell"}), adopt=True))
    assert [a.type for a in actions if isinstance(a, Emit)] == ["RESUMED"]
    (run,) = [a for a in actions if isinstance(a, RunToolCalls)]
    assert [(j.call.id, j.adopted) for j in run.jobs] == [("t1-1", True)]
    assert world.state.phase == "tools" and "t1-1" in world.state.started
    # Its executor reported it: its real outcome ends it; the one never started was
    # interrupted (never run late).
    actions = world.feed(ToolFinished("t1-1", ToolOutcome("real", False, 5.0)))
    kinds = [(a.type, a.data.get("tool_use_id")) for a in actions if isinstance(a, Emit)]
    assert kinds == [("TOOL_END", "t1-1"), ("TURN_END", None), ("TURN_START", None)]
    assert [e[0] for e in world.events].count("TOOL_START") == 2
    results = world.history[-1]["content"]
    assert [(r["content"], r["is_error"]) for r in results] == [
        ("ok", False), ("real", False), (INTERRUPTED, True)]


def test_a_resume_with_nothing_in_flight_adopts_nothing():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(1, 1)))
    world.feed(ToolStarted("t1-0"))
    world.feed(ToolFinished("t1-0", ToolOutcome("ok", False)))
    world.feed(Delta("half"))
    actions = world.begin(Resume("restart", adopt=True))
    assert [a.type for a in actions if isinstance(a, Emit)] == ["RESUMED", "TURN_START"]
    assert not any(isinstance(a, RunToolCalls) for a in actions)


def test_a_model_call_in_flight_at_a_restart_is_made_again():
    world = World()
    world.begin(Start("go", 4))
    world.feed(Delta("half"))
    actions = world.begin(Resume("restart"))
    assert [a.type for a in actions if isinstance(a, Emit)] == ["RESUMED", "TURN_START"]
    assert CallModel(1) in actions
    assert world.state.turns == 1  # the resumed turn is counted once


def test_an_operation_cancel_waits_for_the_boundary_a_ui_cancel_does_not():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    assert world.feed(Cancel("operation")) == []
    actions = world.feed(ModelReplied(tool_reply(1, 1)))
    assert [a.type for a in actions if isinstance(a, Emit)] == ["CANCELLED"]
    assert world.events[-1][2]["mode"] == "operation"
    assert is_valid(world.history)

    world.begin(Start("again", 4))
    world.feed(Delta("streamed"))
    actions = world.feed(Cancel("ui", "stop"))
    assert isinstance(actions[0], AbortJobs)
    assert world.events[-1][2] == {"mode": "ui", "reason": "stop", "usage": ZERO.to_dict()}
    assert world.history[-1]["content"][-1]["text"].startswith("streamed")
    assert world.feed(ModelReplied(text_reply("late"))) == []  # nothing after the end


def test_an_unknown_cancel_mode_is_a_clear_error():
    state, _ = step(RunState(), Start("go", 1))
    with pytest.raises(ValueError, match="unknown cancel mode"):
        step(state, Cancel("later"))


def test_a_cancel_mid_tool_ends_every_started_tool():
    for mode, why in (("ui", "cancelled by the user"), ("deadline", "cancelled: deadline")):
        world = World()
        world.begin(Start("go", 4, offered=frozenset({"shell"})))
        world.feed(ModelReplied(tool_reply(2, 1)))
        world.feed(ToolStarted("t1-0"))
        world.feed(ToolFinished("t1-0", ToolOutcome("ok", False)))
        world.feed(ToolStarted("t1-1"))
        actions = world.feed(Cancel(mode))
        emitted = [(a.type, a.data.get("output")) for a in actions if isinstance(a, Emit)]
        assert emitted == [("TOOL_END", why), ("CANCELLED", None)]
        assert is_valid(world.history)


def test_streamed_text_is_published_and_kept_on_a_cancel():
    world = World()
    world.begin(Start("go", 4))
    world.feed(Delta("one "))
    world.feed(Retry(2, "overloaded", 0.5))  # that attempt's text is void
    world.feed(Delta("two", "thinking"))
    world.feed(Delta("three"))
    world.feed(Cancel("ui"))
    assert [e[0] for e in world.events] == ["SESSION_START", "TURN_START", "TOKEN", "RETRY",
                                            "THINKING", "TOKEN", "CANCELLED"]
    assert world.history[-1]["content"][0]["text"] == \
        "three\n\n[reply interrupted: cancelled by the user]"


def test_a_failure_ends_the_run_with_one_error_and_a_valid_history():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(1, 1)))
    world.feed(ToolStarted("t1-0"))
    actions = world.feed(Failed("disk_full", "the disk is full"))
    assert isinstance(actions[0], AbortJobs)
    assert [e[0] for e in world.events][-2:] == ["TOOL_END", "ERROR"]
    assert world.events[-1][2] == {"error": "disk_full", "message": "the disk is full",
                                   "usage": ZERO.to_dict()}
    assert is_valid(world.history)


def test_messages_said_during_a_tool_call_arrive_together_after_its_result():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(1, 1)))
    world.feed(ToolStarted("t1-0"))
    assert world.feed(Say("first", "local")) == []  # queued: nothing happens yet
    world.feed(Say("second", "control"))
    actions = world.feed(ToolFinished("t1-0", ToolOutcome("out", False)))
    kinds = [a.type if isinstance(a, Emit) else type(a).__name__ for a in actions]
    assert kinds == ["TOOL_END", "TURN_END", "USER_MESSAGE", "USER_MESSAGE", "TURN_START",
                     "CallModel"]
    said = [a.data for a in actions if isinstance(a, Emit) and a.type == "USER_MESSAGE"]
    assert said == [{"text": "first", "by": "local"}, {"text": "second", "by": "control"}]
    # One user turn: the tool result, then the texts, before the next model call.
    last = world.history[-1]
    assert [b["type"] for b in last["content"]] == ["tool_result", "text", "text"]
    assert is_valid(world.history)


def test_a_message_said_while_the_model_answers_gets_a_turn_of_its_own():
    world = World()
    world.begin(Start("go", 4))
    world.feed(Say("and also this"))
    actions = world.feed(ModelReplied(text_reply("done")))
    kinds = [a.type for a in actions if isinstance(a, Emit)]
    assert kinds == ["TURN_END", "USER_MESSAGE", "TURN_START"]
    assert world.state.running and world.state.turn == 2
    world.feed(ModelReplied(text_reply("done too")))
    assert world.events[-1][0] == "DONE" and is_valid(world.history)


def test_a_message_pending_when_the_run_ends_still_joins_the_history():
    world = World()
    world.begin(Start("go", 1, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(1, 1)))
    world.feed(Say("late"))
    world.feed(Cancel("ui"))
    kinds = [e[0] for e in world.events]
    assert kinds[-2:] == ["USER_MESSAGE", "CANCELLED"]
    assert is_valid(world.history)
    assert step(world.state, Say("nobody listens")) == (world.state, [])  # idle: ignored


def test_messages_pending_at_a_restart_survive_the_resume():
    world = World()
    world.begin(Start("go", 4, offered=frozenset({"shell"})))
    world.feed(ModelReplied(tool_reply(1, 1)))
    world.feed(ToolStarted("t1-0"))
    world.feed(Say("still there?"))
    world.calling, world.jobs = None, []
    actions = world.begin(Resume("supervisor restarted"))
    kinds = [a.type for a in actions if isinstance(a, Emit)]
    assert kinds == ["RESUMED", "TOOL_END", "TURN_END", "USER_MESSAGE", "TURN_START"]


def _asking_world() -> World:
    """A run whose reply holds a call waiting for approval (t1-0) and one allowed (r)."""
    world = World()
    world.begin(Start("go", 3, offered=frozenset({"shell", "read_file"}),
                      rules=parse_rules({"shell": "ask"}), approval_timeout_s=60))
    reply = tool_reply(1, 1)
    reply["content"].append({"type": "tool_use", "id": "r", "name": "read_file",
                             "input": {"path": "/etc/hostname"}})
    world.feed(ModelReplied(reply, now=1000.0))
    return world


def test_an_ask_waits_while_the_allowed_calls_run_and_approve_runs_it():
    world = _asking_world()
    kinds = [e[0] for e in world.events]
    asked = next(e[2] for e in world.events if e[0] == "APPROVAL_REQUESTED")
    assert asked == {"call_id": "t1-0", "tool": "shell", "input": {"c": 0}, "rule": "shell",
                     "expires_at": 1060.0}
    assert [j.call.id for j in world.jobs] == ["r"]  # the allowed call runs meanwhile
    world.feed(ToolStarted("r"))
    world.feed(ToolFinished("r", ToolOutcome("host", False)))
    assert world.state.phase == "tools" and "TURN_END" not in kinds
    _, actions = world.state, world.feed(Decide("t1-0", "approve", "local"))
    assert ("APPROVAL_DECIDED", 1, {"call_id": "t1-0", "decision": "approve", "by": "local",
                                    "reason": "approved"}) in world.events
    run = next(a for a in actions if isinstance(a, RunToolCalls))
    assert run.jobs[0].call.id == "t1-0" and run.jobs[0].refusal is None
    world.feed(ToolStarted("t1-0"))
    world.feed(ToolFinished("t1-0", ToolOutcome("ran", False)))
    assert world.events[-1][0] == "TURN_START" and world.calling is not None
    assert world.state.decided == (("t1-0", "approve", "local"),)
    # A second decision on it changes nothing.
    assert world.feed(Decide("t1-0", "deny", "key")) == []


def test_a_denied_call_is_answered_with_the_reason_and_the_run_goes_on():
    world = _asking_world()
    world.feed(Decide("t1-0", "deny", "timeout", "approval timed out"))
    job = next(j for j in world.jobs if j.call.id == "t1-0")
    assert job.refusal.is_error and job.refusal.output.endswith("approval timed out")
    for call_id in ("r", "t1-0"):
        world.feed(ToolStarted(call_id))
        job = next(j for j in world.jobs if j.call.id == call_id)
        world.feed(ToolFinished(call_id, job.refusal or ToolOutcome("ok", False)))
    results = {b["tool_use_id"]: b for b in world.history[-1]["content"]}
    assert results["t1-0"]["is_error"] and "approval timed out" in str(results["t1-0"])
    assert world.state.phase == "model"


def test_a_ui_cancel_while_waiting_ends_the_run_at_once():
    world = _asking_world()
    world.feed(Cancel("ui"))
    assert world.events[-1][0] == "CANCELLED" and world.state.asks == ()
    assert is_valid(world.history)


def test_a_pending_approval_is_still_pending_after_a_restart():
    world = _asking_world()
    world.feed(ToolStarted("r"))  # in flight at the restart: interrupted, never rerun
    world.jobs = []
    world.feed(Resume("restart", offered=frozenset({"shell", "read_file"}),
                      rules=parse_rules({"shell": "ask"})))
    assert world.state.phase == "tools" and world.state.asks == (("t1-0", 1060.0),)
    ends = [e for e in world.events if e[0] == "TOOL_END"]
    assert ends[-1][2]["tool_use_id"] == "r" and ends[-1][2]["output"] == INTERRUPTED
    world.feed(Decide("t1-0", "approve", "local"))
    world.feed(ToolStarted("t1-0"))
    world.feed(ToolFinished("t1-0", ToolOutcome("ran", False)))
    assert world.state.phase == "model" and is_valid(world.history + [text_reply("x")])


def test_always_approves_the_tools_other_calls_now_and_for_the_rest_of_the_session():
    world = World()
    rules = parse_rules({"shell": "ask"})
    world.begin(Start("go", 3, offered=frozenset({"shell"}), rules=rules))
    world.feed(ModelReplied(tool_reply(2, 1)))
    world.feed(Decide("t1-0", "approve", "local", always=True))
    decided = [e[2] for e in world.events if e[0] == "APPROVAL_DECIDED"]
    assert [(d["call_id"], d.get("always")) for d in decided] == [("t1-0", "shell"),
                                                                  ("t1-1", None)]
    assert world.state.asks == () and world.state.always == ("shell",)
    for call_id in ("t1-0", "t1-1"):
        world.feed(ToolStarted(call_id))
        world.feed(ToolFinished(call_id, ToolOutcome("ok", False)))
    world.feed(ModelReplied(tool_reply(1, 2)))  # the next reply's shell call: unasked
    assert [j.call.id for j in world.jobs] == ["t2-0"]
    assert sum(e[0] == "APPROVAL_REQUESTED" for e in world.events) == 2


def test_an_operation_cancel_denies_the_waiting_calls_and_stops_after_the_running_ones():
    world = _asking_world()
    world.feed(ToolStarted("r"))
    world.feed(Cancel("operation"))
    decided = next(e[2] for e in world.events if e[0] == "APPROVAL_DECIDED")
    assert (decided["decision"], decided["by"]) == ("deny", "cancel")
    world.feed(ToolFinished("r", ToolOutcome("host", False)))
    world.feed(ToolStarted("t1-0"))
    job = next(j for j in world.jobs if j.call.id == "t1-0")
    world.feed(ToolFinished("t1-0", job.refusal))
    assert world.events[-1][0] == "CANCELLED" and world.events[-1][2]["mode"] == "operation"
    assert is_valid(world.history)


def test_nan_in_a_tool_input_is_refused_and_kept_out_of_the_history():
    import json

    s, _ = step(RunState(), Start("go", 3, offered=frozenset({"shell"})))
    s, _ = step(s, Begin())
    reply = {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "a", "name": "shell",
         "input": {"command": "x", "timeout_s": float("-inf")}},
        {"type": "tool_use", "id": "b", "name": "shell", "input": {"command": "y"}}]}
    s, actions = step(s, ModelReplied(reply))
    run = next(a for a in actions if isinstance(a, RunToolCalls))
    refusals = {j.call.id: j.refusal for j in run.jobs}
    assert refusals["b"] is None
    assert refusals["a"].is_error and "timeout_s = -Infinity" in refusals["a"].output
    assert next(j for j in run.jobs if j.call.id == "a").call.input["timeout_s"] == "-Infinity"
    json.dumps(s.last, allow_nan=False)
