"""Tokens and cost (issue 14 item 5), end to end: the offline model reports usage over
HTTP as the API does (input estimated from the request, prompt-cache writes and
reads), the real SDK reads it, the llm caller carries it, the supervisor prices it
and puts it in TURN_END, the run's totals in DONE, the session's in `oploop
sessions`, `status --json` and `inspect`; and the in-process `Runner` alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from homes import make_home
from hostkit import of_type, oploop, run, running_host

from actors.config import Config, RouterConfig
from actors.llm_caller.backend import AnthropicBackend
from actors.llm_caller.policy import RetryPolicy
from actors.offline_model import start_server
from actors.runner import Runner
from actors.sandbox.workspaces import remove_home
from actors.usage import DEFAULT_PRICES, Price, Usage, money, short_count
from bus.client import Client

HOUSE = Price(1.0, 2.0, 3.0, 4.0)
CONFIG = f"""
[prices."house-model"]
input = {HOUSE.input}
output = {HOUSE.output}
cache_write = {HOUSE.cache_write}
cache_read = {HOUSE.cache_read}

[agents.house]
model = "house-model"

[agents.unpriced]
model = "local-llama"
"""

OK = {"reply": "all good", "stop_reason": "end_turn"}
LIST = {"reply": [{"type": "tool_use", "name": "list_dir", "input": {"path": "."}}]}
SCRIPTS = {
    "tools": [LIST, OK],
    "fails": [LIST, {"fault": "status", "status": 400}],
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opu-")
    files = tmp_path_factory.mktemp("usage")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    (files / "oploop.toml").write_text(CONFIG)
    env = {"OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json"),
           "OPLOOP_CONFIG": str(files / "oploop.toml")}
    try:
        with running_host(home, env) as running:
            yield running
    finally:
        remove_home(Path(home))


def usages(events: list[dict[str, Any]], kind: str) -> list[Usage]:
    return [Usage.from_dict(e["data"]["usage"]) for e in of_type(events, kind)]


def cost_at(u: Usage, price: Price) -> float:
    return (u.input * price.input + u.output * price.output + u.cache_write * price.cache_write
            + u.cache_read * price.cache_read) / 1e6


def test_each_turn_end_has_its_calls_usage_and_done_the_runs_totals(host):
    events = run(host, "#tools go")
    assert events[-1]["type"] == "DONE"
    first, second = usages(events, "TURN_END")
    for u in (first, second):  # all four fields, as the API reported them
        assert u.input + u.cache_write + u.cache_read > 0 and u.output > 0
    # The request builder marks the static prefix and the history for caching: the
    # first call writes (or, after another run, reads) it, the second reads it.
    assert first.cache_write + first.cache_read > 0
    assert second.cache_read >= first.cache_write + first.cache_read
    (done,) = usages(events, "DONE")
    assert done == Usage(first.input + second.input, first.output + second.output,
                         first.cache_write + second.cache_write,
                         first.cache_read + second.cache_read, done.cost)
    # The default agent's model has a shipped price.
    sonnet = DEFAULT_PRICES["claude-sonnet-4-5"]
    assert done.cost == pytest.approx(cost_at(done, sonnet), abs=2e-6)
    assert done.cost == pytest.approx(first.cost + second.cost, abs=2e-6)


def test_an_error_reports_what_the_run_used_until_then(host):
    events = run(host, "#fails go")
    assert events[-1]["type"] == "ERROR"
    (turn,) = usages(events, "TURN_END")
    assert usages(events, "ERROR") == [turn] and turn.tokens > 0


def test_a_model_priced_in_oploop_toml_is_costed_at_that_price(host):
    events = run(host, "#tools go", agent="house")
    (done,) = usages(events, "DONE")
    assert done.tokens > 0
    assert done.cost == pytest.approx(cost_at(done, HOUSE), abs=2e-6)


def test_an_unknown_model_reports_tokens_and_no_price(host):
    events = run(host, "#tools go", agent="unpriced")
    assert all(u.cost is None and u.tokens > 0 for u in usages(events, "TURN_END"))
    (done,) = usages(events, "DONE")
    assert done.cost is None and done.output > 0
    assert events[-1]["data"]["usage"]["cost_usd"] is None

    # (A scripted turn plays the agent's model; the rules answer as `offline`, at $0.00.)
    plain = oploop(host, "run", "--agent", "unpriced", "#tools go")
    assert plain.returncode == 0, plain.stderr
    last = plain.stdout.strip().splitlines()[-1]
    assert last.startswith("  tokens: ") and " in · " in last and "$" not in last


def test_plain_run_ends_with_the_runs_tokens_and_cost(host):
    plain = oploop(host, "run", "hello there")
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.strip().splitlines()
    assert lines[-2].startswith("— done")
    assert lines[-1].startswith("  tokens: ") and " out · " in lines[-1] and "$" in lines[-1]
    # The rules answered: the offline model, which says so and costs nothing.
    assert lines[-1].endswith("· $0.00"), lines[-1]
    assert "I'm `offline`" in run(host, "hello there")[-1]["data"]["text"]


async def _follow_up(home: str, session: str) -> list[dict[str, Any]]:
    async with Client.connect(Path(home)) as client:
        started = await client.start("and now?", session=session)
        return [e async for e in client.events(session, started.from_seq, stop_at="first")]


def test_session_totals_in_sessions_status_and_inspect(host):
    events = run(host, "#tools go")
    sid = events[0]["session"]
    more = asyncio.run(_follow_up(host, sid))
    assert more[-1]["type"] == "DONE"
    total = usages(events, "DONE")[0] + usages(more, "DONE")[0]

    listed = oploop(host, "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    mine = [json.loads(line) for line in listed.stdout.splitlines()
            if json.loads(line)["session"] == sid]
    assert Usage.from_dict(mine[0]["usage"]) == Usage.from_dict(total.to_dict())

    status = oploop(host, "status", "--json")
    assert status.returncode == 0, status.stderr
    (entry,) = [s for s in json.loads(status.stdout)["sessions"] if s["session"] == sid]
    assert entry["usage"] == mine[0]["usage"]

    async def inspect() -> dict[str, Any]:
        async with Client.connect(Path(host)) as client:
            return (await client.inspect(sid)).summary
    assert (asyncio.run(inspect()))["usage"] == mine[0]["usage"]

    table = oploop(host, "sessions")
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(sid)]
    shown = Usage.from_dict(mine[0]["usage"])  # the web list's tokens and cost columns
    assert f" {short_count(shown.tokens)} " in row and f" {money(shown.cost)}" in row


# -- the in-process Runner, router included ---------------------------------------------


def test_the_runner_counts_the_router_and_every_turn():
    async def go():
        server = await start_server()
        backend = AnthropicBackend(api_key="offline",
                                   base_url=f"http://127.0.0.1:{server.port}")
        config = Config(router=RouterConfig(enabled=True))
        try:
            async with Runner(backend=backend, config=config,
                              policy=RetryPolicy(base_s=0.01)) as runner:
                return await runner.run("hello, how are you?", deps=None)
        finally:
            await server.aclose()

    out = asyncio.run(go())
    (route,) = usages(out.events, "ROUTE")
    # The router's model (haiku) has a shipped price.
    assert route.tokens > route.output > 0 and route.cost is not None
    turns = usages(out.events, "TURN_END")
    total = route
    for u in turns:
        total = total + u
    assert out.usage == Usage.from_dict(total.to_dict())
    assert out.usage == usages(out.events, "DONE")[0]


def test_session_totals_survive_a_host_restart():
    home = make_home("opu-")
    try:
        with running_host(home) as running:
            events = run(running, "hello there")
            sid = events[0]["session"]
            before = json.loads(oploop(running, "sessions", "--json").stdout)
        with running_host(home) as running:  # a new supervisor: the totals are the log's fold
            after = json.loads(oploop(running, "sessions", "--json").stdout)
            more = asyncio.run(_follow_up(running, sid))
            listed = json.loads(oploop(running, "sessions", "--json").stdout)
        assert before["session"] == after["session"] == sid
        assert after["usage"] == before["usage"] == events[-1]["data"]["usage"]
        total = Usage.from_dict(before["usage"]) + usages(more, "DONE")[0]
        assert Usage.from_dict(listed["usage"]) == Usage.from_dict(total.to_dict())
        # The list's title and times too (the fold of the events' `ts`).
        times = ("title", "started", "run_started", "ended", "duration_s")
        assert {k: after[k] for k in times} == {k: before[k] for k in times}
        assert before["title"] == "hello there"
        assert before["ended"] == events[-1]["ts"]
        assert before["duration_s"] == round(events[-1]["ts"] - events[0]["ts"], 3)
        assert listed["title"] == "hello there" and listed["ended"] == more[-1]["ts"]
        assert listed["duration_s"] > before["duration_s"]
    finally:
        remove_home(Path(home))


def test_a_failed_runner_run_reports_what_it_used_including_the_unended_turn():
    from typing_extensions import TypedDict

    from actors.runner import RunFailed

    class Pair(TypedDict):
        a: int
        b: int

    async def go():
        scenario = [{"reply": '{"a": 1}', "stop_reason": "end_turn"},
                    {"reply": '{"a": "x"}', "stop_reason": "end_turn"}]
        server = await start_server(scenario=scenario)
        backend = AnthropicBackend(api_key="offline",
                                   base_url=f"http://127.0.0.1:{server.port}")
        try:
            async with Runner(backend=backend, config=Config(), output_type=Pair,
                              policy=RetryPolicy(base_s=0.01)) as runner:
                await runner.run("pair?", deps=None)
        finally:
            await server.aclose()

    with pytest.raises(RunFailed) as failed:
        asyncio.run(go())
    (repair,) = usages(failed.value.events, "TURN_END")  # the answer that did not parse
    # The second answer failed too: the run ended with no TURN_END for it, and its
    # ERROR counts it with the first.
    assert failed.value.usage == usages(failed.value.events, "ERROR")[0]
    assert failed.value.usage.output > repair.output > 0
    assert failed.value.usage.cost is not None
