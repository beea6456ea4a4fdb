"""The in-process scripted model: a scenario played from the request itself."""

from __future__ import annotations

import asyncio

import pytest

from actors.config import ConfigError
from actors.llm_caller.actor import backend_for
from actors.llm_caller.scripted import ScriptedBackend, run_position
from actors.llm_caller.stalls import StreamBounds
from actors.offline_model.scenario import ScenarioError, parse_scenario
from actors.settings import load_settings

CALL = {"type": "tool_use", "name": "read_file", "input": {"path": "/etc/hostname"}}
SCENARIO = parse_scenario([{"reply": [CALL]}, {"reply": [CALL]}, {"reply": "all done"}])


def request(messages, session="s1"):
    return {"model": "m", "max_tokens": 100, "messages": messages,
            "metadata": {"user_id": session}, "tools": [{"name": "read_file"}]}


def _collect(into: list[str]):
    """An `on_delta` that keeps each delta's text in `into`."""
    return lambda _channel, text: into.append(text)


def play(backend, messages, session="s1"):
    """Answer like the loop would: append each reply and a result, until no tool is asked."""
    replies = []
    for _ in range(10):
        got: list[str] = []
        reply = asyncio.run(backend.stream(request(messages, session), _collect(got),
                                           bounds=StreamBounds(), timeout_s=1))
        replies.append((reply, "".join(got)))
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if not uses:
            return replies
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "x"} for b in uses]})
    raise AssertionError("the scenario never ended")


def test_plays_the_scenario_turn_by_turn_and_streams_text():
    replies = play(ScriptedBackend(SCENARIO), [{"role": "user", "content": "go"}])
    assert [r["stop_reason"] for r, _ in replies] == ["tool_use", "tool_use", "end_turn"]
    assert replies[-1][1] == "all done"
    final = replies[-1][0]
    assert set(final) == {"role", "content", "stop_reason", "model", "usage"}
    assert final["content"] == [{"type": "text", "text": "all done"}]


def test_a_follow_up_run_starts_the_scenario_again_with_fresh_tool_ids():
    backend = ScriptedBackend(SCENARIO)
    history = [{"role": "user", "content": "go"}]
    first = play(backend, history)
    history.append({"role": "user", "content": [{"type": "text", "text": "again"}]})
    second = play(backend, history)
    assert len(second) == len(first) == 3
    ids = [b["id"] for r, _ in first + second for b in r["content"] if b["type"] == "tool_use"]
    assert len(ids) == len(set(ids)) == 4


def test_the_same_request_gets_the_same_reply_whichever_caller_serves_it():
    messages = [{"role": "user", "content": "go"}]
    a = asyncio.run(ScriptedBackend(SCENARIO).create(request(messages), timeout_s=1))
    b = asyncio.run(ScriptedBackend(SCENARIO).create(request(messages), timeout_s=1))
    assert a == b


def test_past_the_scenario_the_rule_engine_answers():
    reply = asyncio.run(ScriptedBackend().create(
        request([{"role": "user", "content": "read /etc/hostname"}]), timeout_s=1))
    assert reply["stop_reason"] == "tool_use"
    assert reply["content"][-1]["name"] == "read_file"


def test_run_position_counts_replies_since_the_prompt():
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": []},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
            {"role": "assistant", "content": []}]
    assert run_position(msgs) == 2
    assert run_position([*msgs, {"role": "user", "content": "more"}]) == 0


def test_faults_are_refused_at_load_and_bad_backends_named(tmp_path):
    with pytest.raises(ScenarioError, match="faults need the offline model"):
        ScriptedBackend(parse_scenario([{"fault": "status", "status": 529}]))
    env = {"OPLOOP_HOME": str(tmp_path), "OPLOOP_LLM_BACKEND": "nope"}
    with pytest.raises(ConfigError, match="OPLOOP_LLM_BACKEND: expected one of .*'nope'"):
        load_settings(env)
    scripted = load_settings({**env, "OPLOOP_LLM_BACKEND": "scripted"})
    assert isinstance(backend_for(scripted), ScriptedBackend)
