"""`Runner[Deps, Output]`: the loop embedded in a program, against the offline model
over real HTTP through the real SDK."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from actors.config import Config
from actors.core.history import is_valid
from actors.llm_caller.backend import AnthropicBackend
from actors.llm_caller.policy import RetryPolicy
from actors.offline_model import start_server
from actors.runner import RunFailed, Runner
from actors.tools import ToolContext, tool


@dataclass
class Weather:
    city: str
    temp_c: float


class Pair(TypedDict):
    a: int
    b: int


@dataclass
class Db:
    rows: dict[str, str]


@tool(risky=False, tags=("data",))
async def lookup(ctx: ToolContext[Db], key: str) -> str:
    """Look a key up in the program's database."""
    return ctx.deps.rows.get(key, "no such key")


def reply(text: str) -> dict:
    return {"reply": text, "stop_reason": "end_turn"}


async def run_with(scenario, prompt, **kw):
    server = await start_server(scenario=scenario)
    backend = AnthropicBackend(api_key="offline", base_url=f"http://127.0.0.1:{server.port}")
    deps = kw.pop("deps", None)
    try:
        async with Runner(backend=backend, config=Config(),
                          policy=RetryPolicy(base_s=0.01), **kw) as runner:
            return await runner.run(prompt, deps=deps)
    finally:
        await server.aclose()


def test_output_is_parsed_into_a_dataclass_after_one_repair():
    scenario = [reply("It is mild in Oslo."),
                reply('```json\n{"city": "Oslo", "temp_c": 3.5}\n```')]
    result = asyncio.run(run_with(scenario, "weather?", output_type=Weather))
    assert result.output == Weather("Oslo", 3.5)
    ends = [e["data"]["stop"] for e in result.events if e["type"] == "TURN_END"]
    assert ends == ["output_invalid", "end_turn"]
    assert is_valid(result.session.history)


def test_typed_dict_output_and_a_second_failure_is_an_error():
    ok = asyncio.run(run_with([reply('{"a": 1, "b": 2}')], "pair?", output_type=Pair))
    assert ok.output == {"a": 1, "b": 2}
    with pytest.raises(RunFailed) as failed:
        asyncio.run(run_with([reply('{"a": 1}'), reply('{"a": "x"}')], "pair?", output_type=Pair))
    assert failed.value.error == "output_invalid" and "b" in failed.value.message
    assert failed.value.events[-1]["type"] == "ERROR"


def test_deps_reach_python_tools():
    scenario = [{"reply": [{"type": "tool_use", "name": "lookup", "input": {"key": "k1"}}]}]
    result = asyncio.run(run_with(scenario, "look k1 up", tools=[lookup],
                                  deps=Db({"k1": "the value of k1"})))
    (end,) = [e for e in result.events if e["type"] == "TOOL_END"]
    assert end["data"]["output"] == "the value of k1" and not end["data"]["is_error"]
    assert result.stop == "end_turn" and "the value of k1" in result.text


def test_retries_and_plain_text_output():
    scenario = [{"fault": "status", "status": 529}, reply("fine")]
    result = asyncio.run(run_with(scenario, "hi"))
    assert result.output == "fine"
    assert [e["type"] for e in result.events].count("RETRY") == 1


def test_on_approval_decides_asked_calls_and_without_one_they_are_denied():
    from actors.config import Agent
    from actors.permissions import parse_rules

    agent = Agent(permissions=parse_rules({"lookup": "ask"}))
    calls = [{"type": "tool_use", "name": "lookup", "input": {"key": k}} for k in ("k1", "k2")]
    scenario = [{"reply": calls}, reply("done")]
    asked = []

    async def approve(request):
        asked.append(request)
        return True if request["input"]["key"] == "k2" else "not k1"

    db = Db({"k1": "v1", "k2": "v2"})
    result = asyncio.run(run_with(scenario, "look up", tools=[lookup], deps=db, agent=agent,
                                  on_approval=approve))
    assert sorted((a["tool"], a["input"]["key"], a["rule"]) for a in asked) == \
        [("lookup", "k1", "lookup"), ("lookup", "k2", "lookup")]
    ends = {e["data"]["tool_use_id"]: e["data"] for e in result.events
            if e["type"] == "TOOL_END"}
    assert sorted(e["output"] for e in ends.values()) == [
        "lookup: not run: denied by on_approval: not k1", "v2"]
    denied = asyncio.run(run_with(scenario, "look up", tools=[lookup], deps=db, agent=agent))
    outputs = [e["data"]["output"] for e in denied.events if e["type"] == "TOOL_END"]
    assert len(outputs) == 2 and all("no on_approval callback" in o for o in outputs)
    assert denied.stop == "end_turn"  # the model was told, and went on
    approved = asyncio.run(run_with(scenario, "look up", tools=[lookup], deps=db, agent=agent,
                                    on_approval=lambda r: True))
    assert sorted(e["data"]["output"] for e in approved.events if e["type"] == "TOOL_END") \
        == ["v1", "v2"]
