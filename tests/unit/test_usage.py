"""Tokens and cost (issue 14 item 5): the numbers, the price table, the run's and the
session's totals (live, and folded from the log across a restart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_session_log import AGENT, LoggedIO, one_run

from actors.config import ConfigError, load_config, parse_config
from actors.core.machine import Begin, ModelReplied, Routed, Start, step
from actors.core.session import Session
from actors.supervisor.fold import apply_record, decode_record, from_row, load_session
from actors.supervisor.journal import Journal
from actors.usage import (
    DEFAULT_PRICES,
    ZERO,
    Meter,
    Price,
    Usage,
    describe,
    money,
    of_reply,
    price_for,
    priced,
    short_count,
)

SONNET = DEFAULT_PRICES["claude-sonnet-4-5"]


# -- the numbers ----------------------------------------------------------------------


def test_usage_adds_up_and_prices_per_million_tokens():
    a = Usage(1_000_000, 0, 0, 0).priced(SONNET)
    b = Usage(0, 100_000, 200_000, 1_000_000).priced(SONNET)
    assert a.cost == pytest.approx(3.0)
    assert b.cost == pytest.approx(1.5 + 0.75 + 0.30)
    total = a + b
    assert (total.input, total.output, total.cache_write, total.cache_read) == \
        (1_000_000, 100_000, 200_000, 1_000_000)
    assert total.cost == pytest.approx(5.55)
    assert total.tokens == 2_300_000


def test_an_unknown_price_makes_the_total_unknown_but_no_tokens_cost_nothing():
    unknown = Usage(10, 5).priced(None)
    assert unknown.cost is None
    assert (unknown + Usage(1, 1).priced(SONNET)).cost is None  # never a partial sum
    assert Usage().priced(None).cost == 0.0  # nothing used: nothing to guess
    assert (Usage().priced(None) + Usage(1, 1).priced(SONNET)).cost is not None


def test_the_wire_form_round_trips_and_bad_values_count_as_nothing():
    u = Usage(12, 3, 4, 5, 0.0123456789)
    assert Usage.from_dict(u.to_dict()) == Usage(12, 3, 4, 5, 0.012346)
    assert Usage.from_dict({"input_tokens": "x", "output_tokens": -3, "cost_usd": True}) == ZERO
    assert Usage.from_dict({"input_tokens": 7}).cost is None  # tokens, no price given
    assert Usage.from_dict(None) == ZERO and Usage.from_dict([1, 2]) == ZERO


def test_a_model_is_priced_by_its_id_or_its_id_without_a_snapshot_date():
    assert price_for("claude-sonnet-4-5", DEFAULT_PRICES) is SONNET
    assert price_for("claude-sonnet-4-5-20250929", DEFAULT_PRICES) is SONNET
    haiku = DEFAULT_PRICES["claude-3-5-haiku"]
    assert price_for("claude-3-5-haiku-latest", DEFAULT_PRICES) == haiku
    # No guess from a near name: opus 4 and opus 4.5 cost very different amounts.
    assert price_for("claude-opus-4", DEFAULT_PRICES) is None
    assert price_for("llama3", DEFAULT_PRICES) is None


def test_a_reply_is_priced_by_the_model_that_served_it():
    reply = {"role": "assistant", "model": "claude-haiku-4-5-20251001", "content": [],
             "usage": {"input_tokens": 2_000_000, "output_tokens": 0}}
    out = priced(reply, DEFAULT_PRICES)
    assert out["usage"]["cost_usd"] == pytest.approx(2.0)
    assert out["usage"]["cache_read_input_tokens"] == 0
    assert "cost_usd" not in reply["usage"]  # the reply itself is left alone
    unknown = priced({**reply, "model": "my-local-model"}, DEFAULT_PRICES)
    assert unknown["usage"]["cost_usd"] is None
    assert unknown["usage"]["input_tokens"] == 2_000_000


def test_usage_reads_for_people():
    assert short_count(950) == "950"
    assert short_count(12_345) == "12.3k"
    assert short_count(12_000) == "12k"
    assert short_count(4_100_000) == "4.1M"
    assert money(0.04) == "$0.04" and money(0.0012) == "$0.0012" and money(None) == ""
    line = describe({"input_tokens": 12_345, "output_tokens": 1_234, "cost_usd": 0.04})
    assert line == "12.3k in · 1.2k out · $0.04"
    line = describe(Usage(10, 2, 3000, 40_000, None))
    assert line == "10 in · 2 out · 3k cache write · 40k cache read"
    assert describe(None) == ""


# -- the price table in oploop.toml -------------------------------------------------


def test_prices_override_the_shipped_ones_and_add_models(tmp_path):
    path = tmp_path / "oploop.toml"
    path.write_text('[prices."claude-sonnet-4-5"]\ninput = 2.5\n\n'
                    '[prices."my-model"]\ninput = 1\noutput = 2\ncache_write = 0\n'
                    'cache_read = 0.5\n')
    config = load_config(path)
    assert config.prices["claude-sonnet-4-5"] == Price(2.5, 15.0, 3.75, 0.30)
    assert config.prices["my-model"] == Price(1.0, 2.0, 0.0, 0.5)
    assert config.prices["claude-haiku-4-5"] == DEFAULT_PRICES["claude-haiku-4-5"]


@pytest.mark.parametrize(("table", "message"), [
    ({"my-model": {"input": 1.0}},
     'prices."my-model".output: required for a model with no shipped price'),
    ({"claude-haiku-4-5": {"input": "1"}},
     'prices."claude-haiku-4-5".input: expected float, got str \'1\''),
    ({"claude-haiku-4-5": {"output": -1}},
     'prices."claude-haiku-4-5".output: must be a number >= 0, got -1.0'),
    ({"claude-haiku-4-5": {"output": float("nan")}},
     'prices."claude-haiku-4-5".output: must be a number >= 0'),
    ({"claude-haiku-4-5": {"inptu": 1}},
     'prices."claude-haiku-4-5".inptu: unknown key (known: cache_read, cache_write, '
     'input, output)'),
    ({"claude-haiku-4-5": 3}, 'prices."claude-haiku-4-5": expected a table, got int'),
])
def test_a_bad_price_is_a_config_error_naming_the_key(table, message):
    with pytest.raises(ConfigError) as caught:
        parse_config({"prices": table}, "oploop.toml")
    assert str(caught.value).startswith(f"oploop.toml: {message}")


# -- the run's totals (the state machine) ---------------------------------------------


def reply(stop: str, usage: dict[str, Any], *tools: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "ok"}]
    content += [{"type": "tool_use", "id": t, "name": "shell", "input": {}} for t in tools]
    return {"role": "assistant", "stop_reason": stop, "content": content, "usage": usage}


def test_each_turn_end_carries_its_call_and_the_terminal_event_the_runs_totals():
    from actors.core.machine import RunState, ToolFinished, ToolStarted
    from actors.core.turn import ToolOutcome

    first = Usage(100, 10, 1000, 0, 0.01).to_dict()
    second = Usage(200, 20, 0, 1000, 0.02).to_dict()
    routed = Usage(30, 1, 0, 0, 0.001)
    state = RunState()
    events = []
    for event in [Start("go", 4, router=True, offered=frozenset({"shell"})), Begin(),
                  Routed("AGENT", routed), ModelReplied(reply("tool_use", first, "t1")),
                  ToolStarted("t1"), ToolFinished("t1", ToolOutcome("fine", False)),
                  ModelReplied(reply("end_turn", second))]:
        state, actions = step(state, event)
        events += [(a.type, a.data) for a in actions if hasattr(a, "data")]
    by_type = {t: d for t, d in events if t in ("ROUTE", "DONE")}
    turn_ends = [d["usage"] for t, d in events if t == "TURN_END"]
    assert by_type["ROUTE"]["usage"] == routed.to_dict()
    assert turn_ends == [first, second]
    done = Usage.from_dict(by_type["DONE"]["usage"])
    assert done == routed + Usage.from_dict(first) + Usage.from_dict(second)
    assert done.cost == pytest.approx(0.031)
    assert state.usage == ZERO and state.unreported == ZERO  # the next run starts at 0


# -- the session's totals: live, and folded from the log --------------------------------


class UsageIO(LoggedIO):
    """`LoggedIO` whose replies report usage (as priced by the supervisor), and whose
    `emit` folds each event into the session's meter as `Supervisor.emit` does."""

    PER_CALL = Usage(1000, 50, 200, 3000, 0.005)

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        session.meter.apply(type_, data)
        super().emit(session, type_, turn, data)

    async def call_model(self, session: Session, request: dict[str, Any],
                         **kw: Any) -> dict[str, Any]:
        reply = await super().call_model(session, request, **kw)
        return {**reply, "usage": self.PER_CALL.to_dict()}


def fold_prefix(journal: Journal, sid: str, upto: int) -> Session:
    """The session as a supervisor killed after record `upto` would load it."""
    row = journal.log.row(sid)
    assert row is not None
    session = from_row(row, {})
    for record in journal.log.records(sid, after=0):
        if record.seq > upto:
            break
        event, delta = decode_record(record)
        apply_record(session, record.seq, event, delta)
    return session


def test_session_totals_are_the_fold_of_its_log_and_survive_a_restart(tmp_path: Path):
    journal = Journal(tmp_path / "sessions.db", reserve_mb=0)
    try:
        session = Session("s1", AGENT, "/tmp")
        io = UsageIO(journal, ["tools", "fine"])
        one_run(session, io)
        two = UsageIO.PER_CALL + UsageIO.PER_CALL
        assert Usage.from_dict(session.summary()["usage"]) == two
        loaded = load_session(journal.log, "s1", {})  # from the run's compaction
        assert loaded is not None and loaded.meter.total() == two

        io = UsageIO(journal, ["tools", "tools", "fine"])  # a follow-up run, on the fold
        one_run(loaded, io)
        five = two + UsageIO.PER_CALL + UsageIO.PER_CALL + UsageIO.PER_CALL
        assert loaded.meter.total() == five
        reloaded = load_session(journal.log, "s1", {})
        assert reloaded is not None and reloaded.meter.total() == five
        assert reloaded.summary()["usage"] == five.to_dict()

        # A supervisor killed mid-run: what the log has said so far, no more.
        seqs = [(r.seq, decode_record(r)[0].type) for r in journal.log.records("s1", after=0)]
        second_start = [s for s, t in seqs if t == "SESSION_START"][1]
        first_turn_end = next(s for s, t in seqs if t == "TURN_END" and s > second_start)
        mid = fold_prefix(journal, "s1", first_turn_end)
        assert not mid.run_over
        assert mid.meter.total() == two + UsageIO.PER_CALL
        assert mid.meter.run == UsageIO.PER_CALL
    finally:
        journal.close()


def test_a_meter_is_the_fold_of_the_events_and_the_terminal_total_is_authoritative():
    meter = Meter()
    one = Usage(10, 1, cost=0.5)
    for type_, data in [("SESSION_START", {}), ("TURN_START", {}),
                        ("TURN_END", {"usage": one.to_dict()}), ("TOKEN", {"text": "x"})]:
        meter.apply(type_, data)
    assert meter.run == one and meter.total() == one
    # The run ends with a reply whose TURN_END never went out (a cancel mid-tools):
    # its terminal total has it, and replaces the run's partial count.
    meter.apply("CANCELLED", {"mode": "ui", "usage": Usage(15, 3, cost=0.75).to_dict()})
    assert meter.total() == Usage(15, 3, cost=0.75) and meter.run == ZERO
    assert Meter.from_state(meter.to_state()).total() == meter.total()
    assert of_reply({}) == ZERO


# -- the offline model's usage: prompt caching as the API counts it ---------------------


def test_the_offline_model_counts_cache_writes_then_reads_as_the_api_does():
    from actors.offline_model.cache import PromptCache
    from actors.offline_model.wire import Reply, message_json, stream_events

    marked = {"type": "text", "text": "static system prompt " * 20,
              "cache_control": {"type": "ephemeral"}}
    first = {"system": [marked], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hello there",
                                      "cache_control": {"type": "ephemeral"}}]}]}
    cache = PromptCache()
    fresh, written, read = cache.usage(first)
    assert (fresh, read) == (0, 0) and written > 20  # all of it up to the last breakpoint
    # The next turn: the breakpoint moved to the newest message; the old prefix is read.
    second = {"system": [marked], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "text", "text": "more", "cache_control":
                                      {"type": "ephemeral"}}]}]}
    fresh2, written2, read2 = cache.usage(second)
    assert read2 == written and written2 > 0 and fresh2 == 0
    # (a token per four characters of a block's JSON: '"no marks"' is 10)
    assert cache.usage({"messages": [{"role": "user", "content": "no marks"}]}) == (3, 0, 0)

    message = message_json(Reply(({"type": "text", "text": "ok"},), "end_turn", 1),
                           model="m", message_id="msg_1", in_tokens=5, cache_write=7,
                           cache_read=9)
    events = dict(stream_events(message))
    start = events["message_start"]["message"]["usage"]
    assert start == {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": 7,
                     "cache_read_input_tokens": 9}
    assert events["message_delta"]["usage"] == {"output_tokens": 1}


def test_a_bounded_prompt_cache_forgets_the_oldest_prefixes():
    from actors.offline_model.cache import PromptCache

    cache = PromptCache(max_entries=2)
    requests = [{"messages": [{"role": "user", "content": [
        {"type": "text", "text": f"prompt {i}", "cache_control": {"type": "ephemeral"}}]}]}
        for i in range(3)]
    for r in requests:
        cache.usage(r)
    assert cache.usage(requests[0])[2] == 0  # pushed out
    assert cache.usage(requests[2])[2] > 0
