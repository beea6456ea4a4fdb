"""The context budget and compaction (issue 29): the pure functions of
`actors/core/context.py`, the machine's `Compacted`, its fold, the driver compacting
at the budget and recovering from a 400, and the offline model's window, token
counting and summaries through the real SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import pytest

from actors.config import Agent, Config, ConfigError
from actors.configparts.agents import parse_agent
from actors.core.context import (
    EMPTY,
    SUMMARY_HEADER,
    ContextMemo,
    ContextView,
    clear_point,
    count_results,
    is_summary_request,
    message_tokens,
    request_tokens,
    result_cap,
    summary_point,
    summary_request,
    too_long,
    transcript,
    view_messages,
)
from actors.core.driver import RunDriver
from actors.core.fold import fold_event
from actors.core.history import Message, is_valid
from actors.core.inputs import Compacted, Start
from actors.core.loopio import ModelError
from actors.core.machine import Emit, step
from actors.core.session import Session
from actors.core.state import RunState
from actors.core.turn import ToolCall, ToolOutcome
from actors.offline_model import rules
from actors.offline_model.server import start_server
from actors.supervisor.fold import compaction, mark_logged, restore
from actors.usage import Usage
from bus.vocab import EventType


def turn_pair(i: int, size: int = 400) -> list[Message]:
    """An assistant call of `shell` and its result."""
    return [
        {"role": "assistant", "content": [
            {"type": "text", "text": f"step {i}"},
            {"type": "tool_use", "id": f"t{i}", "name": "shell", "input": {"command": f"c{i}"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{i}", "content": "x" * size}]},
    ]


def history(turns: int, size: int = 400) -> list[Message]:
    out: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    for i in range(turns):
        out += turn_pair(i, size)
    return out


# -- the view ---------------------------------------------------------------------------


def test_clearing_keeps_the_latest_results_whole_and_names_the_call_in_the_marker():
    h = history(5)
    view = EMPTY._replace(cleared=clear_point(h, EMPTY))
    assert view.cleared == 7  # before the last two result messages (8 and 10)
    shown = view_messages(h, view)
    assert is_valid(shown) and len(shown) == len(h)
    marker = shown[2]["content"][0]
    assert marker["tool_use_id"] == "t0" and marker["type"] == "tool_result"
    assert 'shell {"command": "c0"}' in marker["content"]
    assert "400 characters" in marker["content"] and "again" in marker["content"]
    assert shown[8] is h[8] and shown[10] is h[10]  # the latest kept, the same objects
    assert count_results(h, 0, view.cleared) == 3
    assert clear_point(h, EMPTY, keep=0) == len(h)


def test_a_summary_replaces_whole_turns_up_to_an_assistant_message():
    h = history(5)
    upto = summary_point(h, EMPTY)
    assert upto == len(h) - 2 and h[upto]["role"] == "assistant"
    view = ContextView("they ran c0..c3", upto, upto)
    shown = view_messages(h, view)
    assert shown[0]["content"][0]["text"] == f"{SUMMARY_HEADER}\n\nthey ran c0..c3"
    assert shown[1:] == h[upto:] and is_valid(shown)
    assert summary_point(h, view) == 0  # nothing after it to summarise yet


def test_the_memo_keeps_the_views_prefix_as_the_same_objects():
    h = history(6)
    memo = ContextMemo()
    view = ContextView("s", 3, 9)
    first = memo.messages(list(h), view)
    h += turn_pair(6)
    second = memo.messages(list(h), view)
    assert all(a is b for a, b in zip(first, second, strict=False))
    assert second == view_messages(h, view)
    assert memo.messages(h, EMPTY) is h


def test_measure_counts_from_the_last_usage_and_what_was_added():
    h = history(2)
    memo = ContextMemo()
    request = {"messages": h}
    assert memo.measure(h, EMPTY, request) == request_tokens(request)
    memo.sent(h, EMPTY, 5_000)
    memo.replied({"input_tokens": 10, "cache_read_input_tokens": 6_000,
                  "cache_creation_input_tokens": 90})
    h2 = h + turn_pair(2)
    assert memo.measure(h2, EMPTY, {"messages": h2}) == \
        6_100 + message_tokens(h2[-2]) + message_tokens(h2[-1])
    # another view: a full estimate again
    assert memo.measure(h2, ContextView("", 0, 3), {"messages": h2}) == \
        request_tokens({"messages": h2})


def test_transcript_keeps_the_summary_it_starts_from_and_the_newest_lines():
    h = view_messages(history(40), ContextView("EARLIER", 0, 0))
    text = transcript(h, 3_000)
    assert text.startswith(f"[user] {SUMMARY_HEADER}") and "EARLIER" in text
    assert "[... earlier messages left out ...]" in text
    assert "c39" in text and "c0\"" not in text
    assert len(text) < 3_500


def test_too_long_is_the_apis_400_a_413_or_the_frame_limit():
    assert too_long("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")
    assert too_long("oversize", "the llm_job cannot be sent to a worker: 22027475 bytes > 16777216")
    assert too_long("request_too_large", "Request exceeds the maximum size", 413)
    assert not too_long("invalid_request_error", "max_tokens: field required")
    # the model's own reply over the frame: a smaller request would not shrink it
    assert not too_long("oversize", "the llm_result reply cannot be sent: oversize: 16778556 "
                                    "bytes > 16777216")


def test_summary_requests_are_told_apart_and_the_marks_agree():
    ask = summary_request("claude-haiku-4-5", history(2), 10_000, "s1")
    assert is_summary_request(ask) and rules.is_summary_request(ask)
    assert not is_summary_request({"system": "You are an operator."})
    assert ask["metadata"] == {"user_id": "s1"} and "tools" not in ask


def test_result_cap_is_a_third_of_the_budget():
    assert result_cap(160_000) == 213_333
    assert result_cap(100) == 1_000


# -- the agent's budget ------------------------------------------------------------------


def test_windows_of_known_models_and_configured_ones():
    assert Agent(model="sonnet").window() == 200_000
    assert Agent(model="claude-opus-4-5-20251101").window() == 200_000
    assert Agent(model="my-local-llm").window() == 200_000
    assert Agent(model="my-local-llm", context_window=32_000).window() == 32_000
    with pytest.raises(ConfigError, match="compact_at"):
        parse_agent("a", {"compact_at": 1.5}, "oploop.toml")
    with pytest.raises(ConfigError, match="context_window"):
        parse_agent("a", {"context_window": 100}, "oploop.toml")
    assert parse_agent("a", {"context_window": 50_000, "compact_at": 0.5,
                             "compact_model": "haiku"}, "t").compact_model == "haiku"


# -- the machine and the fold ------------------------------------------------------------


def compacted(prior: ContextView = EMPTY, **kw: Any) -> Compacted:
    view = ContextView("sum", 3, 5)
    return Compacted(view, prior, 9_000, 2_000, 2, 1, "budget", **kw)


def test_compacted_in_a_run_is_an_event_whose_usage_the_turn_reports():
    state, _ = step(RunState(), Start("go", 3))
    state, actions = step(state, compacted(usage=Usage(input=100, output=20)))
    (emit,) = actions
    assert isinstance(emit, Emit) and emit.type == EventType.COMPACTED
    assert emit.data == {"before_tokens": 9_000, "after_tokens": 2_000, "cleared_results": 2,
                         "summarised_turns": 1, "by": "budget", "summary": "sum",
                         "summarised": 3, "cleared": 5}
    assert state.context == ContextView("sum", 3, 5) and state.unreported.output == 20
    # stale: computed from a view that changed since
    again, actions = step(state, compacted())
    assert actions == [] and again is state


def test_compacted_between_runs_reports_its_own_usage_and_folds():
    state, actions = step(RunState(), compacted(usage=Usage(input=100, output=20), note="n"))
    (emit,) = actions
    assert emit.data["usage"]["output_tokens"] == 20 and emit.data["note"] == "n"
    folded = fold_event(RunState(), emit.type, emit.turn, emit.data)
    assert folded.context == state.context == ContextView("sum", 3, 5)


def test_a_snapshot_carries_the_view():
    session = Session("s1", Agent(), "/tmp", history=history(3))
    session.run = session.run._replace(context=ContextView("sum", 3, 5))
    mark_logged(session)
    comp = compaction(session)
    restored = restore(comp.state, {}, dict(comp.parts))
    assert restored.context == ContextView("sum", 3, 5)
    assert restored.history == session.history


# -- the driver ----------------------------------------------------------------------------


class ScriptIO:
    """A `LoopIO` answering every call at once: `turns` turns of one big tool result each,
    model calls failing as `failures` says (True: "prompt is too long")."""

    def __init__(self, turns: int, failures: list[bool] | None = None, calls: int = 1,
                 result: int = 3_000) -> None:
        self.config = Config()
        self.turns = turns
        self.calls, self.result = calls, result
        self.failures = failures or []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[dict[str, Any]] = []
        self.summaries = 0

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        session.next_seq += 1
        self.events.append((type_, data))

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Any, route: bool = False,
                         compact: bool = False) -> Message:
        if compact:
            self.summaries += 1
            return {"role": "assistant", "stop_reason": "end_turn",
                    "content": [{"type": "text", "text": f"summary {self.summaries}"}],
                    "usage": {"input_tokens": 50, "output_tokens": 5}}
        assert is_valid(request["messages"])
        self.requests.append(request)
        if self.failures and self.failures.pop(0):
            raise ModelError("invalid_request_error",
                             f"prompt is too long: {request_tokens(request) + 500} tokens > "
                             f"{request_tokens(request)} maximum", 400)
        if turn > self.turns:
            return {"role": "assistant", "stop_reason": "end_turn",
                    "content": [{"type": "text", "text": "done"}]}
        return {"role": "assistant", "stop_reason": "tool_use", "content": [
            {"type": "text", "text": "reading " * 50},
            *({"type": "tool_use", "id": f"t{turn}-{i}", "name": "shell", "input": {"n": turn}}
              for i in range(self.calls))]}

    async def count_tokens(self, session: Session, request: dict[str, Any]) -> int | None:
        return None

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        return ToolOutcome("y" * self.result, False, 1.0)

    def tool_catalogue(self, machine: str = "") -> list[dict[str, Any]]:
        return [{"name": "shell", "description": "run", "input_schema": {"type": "object"},
                 "category": "exec"}]

    def tool_machine(self, session: Session, tool: str = "") -> str:
        return ""


def drive(io: ScriptIO, agent: Agent, prompt: str = "go",
          session: Session | None = None) -> Session:
    session = session or Session("s1", agent, "/tmp")

    async def main() -> None:
        driver = RunDriver(session, io)
        driver.start(prompt)
        await driver.run()

    asyncio.run(main())
    return session


def test_a_run_past_its_budget_compacts_and_every_request_fits():
    agent = Agent(context_window=8_000, max_turns=40)
    io = ScriptIO(30)
    session = drive(io, agent)
    kinds = [k for k, _ in io.events]
    assert kinds[-1] == "DONE", io.events[-1]
    done = [d for k, d in io.events if k == "COMPACTED"]
    assert done and all(d["by"] == "budget" and d["after_tokens"] < 6_400 for d in done)
    assert any(d["summarised_turns"] for d in done) and io.summaries
    assert all(request_tokens(r) < 6_400 for r in io.requests)
    assert len(session.history) == 2 + 2 * 30  # the history of record keeps everything
    assert session.context == ContextView.from_data(done[-1])


def test_a_400_compacts_and_tries_once_more_then_a_second_ends_the_run():
    agent = Agent(max_turns=10)
    io = ScriptIO(3, failures=[False, False, True])
    drive(io, agent)
    kinds = [k for k, _ in io.events]
    assert kinds[-1] == "DONE"
    (only,) = [d for k, d in io.events if k == "COMPACTED"]
    assert only["by"] == "recovery"
    io = ScriptIO(3, failures=[False, False, True, True])
    drive(io, agent)
    end = io.events[-1]
    assert end[0] == "ERROR" and "prompt is too long" in end[1]["message"]
    assert [k for k, _ in io.events].count("COMPACTED") == 1  # never a loop


def test_a_turn_too_large_for_the_budget_ends_naming_sizes():
    agent = Agent(context_window=4_096, max_turns=5)
    io = ScriptIO(1, calls=3, result=20_000)  # each result cut to a third of the budget
    drive(io, agent)
    end = io.events[-1]
    assert end[0] == "ERROR" and end[1]["error"] == "context_full", end
    assert "over the budget of 3276" in end[1]["message"]
    assert "4096-token window" in end[1]["message"]
    assert "oploop compact s1" in end[1]["message"]


# -- the offline model ---------------------------------------------------------------------


def serve(test: Any, **server_kw: Any) -> None:
    async def main() -> None:
        server = await start_server(**server_kw)
        client = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{server.port}",
                                          api_key="offline", max_retries=0)
        try:
            await test(client, server)
        finally:
            await client.close()
            await server.aclose()

    asyncio.run(main())


def big(chars: int) -> dict[str, Any]:
    return {"model": "offline", "max_tokens": 100,
            "messages": [{"role": "user", "content": "word " * (chars // 5)}]}


def test_the_offline_model_refuses_a_request_over_its_window_as_the_api_does():
    async def test(client: anthropic.AsyncAnthropic, server: Any) -> None:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(**big(10_000))
        err = caught.value
        assert err.status_code == 400
        assert err.body["type"] == "error" and err.body["request_id"].startswith("req_")
        assert err.body["error"] == {"type": "invalid_request_error",
                                     "message": "prompt is too long: 2501 tokens > 2000 maximum"}
        ok = await client.messages.create(**big(4_000))
        assert ok.usage.input_tokens == 1001
        stats = server.statistics()
        assert stats.too_long == 1 and stats.largest_prompt == 1001

    serve(test, context_window=2_000)


def test_count_tokens_through_the_sdk_counts_what_a_reply_would():
    async def test(client: anthropic.AsyncAnthropic, server: Any) -> None:
        request = big(4_000)
        counted = await client.messages.count_tokens(model="offline",
                                                     messages=request["messages"])
        reply = await client.messages.create(**request)
        assert counted.input_tokens == reply.usage.input_tokens == 1001
        over = await client.messages.count_tokens(model="offline",
                                                  messages=big(20_000)["messages"])
        assert over.input_tokens > 2_000  # counting is how a client finds out

    serve(test, context_window=2_000)


def test_the_offline_summariser_answers_a_summary_request_deterministically():
    ask = summary_request("offline", history(3), 10_000)
    del ask["temperature"]  # (this SDK's `create` names no such parameter: oploop's
    # backend passes only those it names, `backend.split_known`)

    async def test(client: anthropic.AsyncAnthropic, server: Any) -> None:
        first = await client.messages.create(**ask)
        second = await client.messages.create(**ask)
        text = first.content[0].text
        assert text == second.content[0].text
        assert text.startswith("Summary by the offline model of 7 earlier message(s).")
        assert "Tools called so far: shell x3." in text and "Requests: go" in text

    serve(test, scenario={"turns": [{"reply": "scripted"}]})


def test_a_compacted_session_keeps_its_place_in_a_scripted_scenario():
    """The summary request is the summariser's: it does not take the session's turn."""

    async def test(client: anthropic.AsyncAnthropic, server: Any) -> None:
        ask = summary_request("offline", history(1), 10_000, "s9")
        del ask["temperature"]
        await client.messages.create(**ask)
        reply = await client.messages.create(model="offline", max_tokens=10,
                                             metadata={"user_id": "s9"},
                                             messages=[{"role": "user", "content": "hi"}])
        assert reply.content[0].text == "scripted"

    serve(test, scenario={"turns": [{"reply": "scripted"}]})


def test_summaries_of_summaries_stay_bounded():
    text = ""
    for _ in range(20):
        text = rules.summarise_transcript(transcript(view_messages(
            history(10), ContextView(text, 0, 0) if text else EMPTY), 50_000))
    assert len(text) < 1_000 and "shell x" in text


def test_the_llm_callers_backend_counts_tokens_through_the_sdk():
    from actors.llm_caller.backend import AnthropicBackend

    async def main() -> None:
        server = await start_server(context_window=2_000)
        backend = AnthropicBackend(api_key="offline", base_url=f"http://127.0.0.1:{server.port}")
        try:
            request = {**big(4_000), "temperature": 0.3, "metadata": {"user_id": "s1"}}
            assert await backend.count_tokens(request, timeout_s=5) == 1001
        finally:
            await backend.aclose()
            await server.aclose()

    asyncio.run(main())


def test_a_blocks_json_length_is_json_dumps_length():
    from actors.core.context import _json_len  # (the estimate's own measure)

    blocks_ = [
        "plain", "é\n\"quoted\"\t\u2028", {"type": "text", "text": "ü" * 3},
        {"type": "tool_use", "id": "t", "name": "n", "input": {"a": [1, 2.5, None, True]}},
        {"x": float("nan"), "y": float("inf"), "z": -0.0, "n": 10**20, 3: "int key"},
        [], {}, 7, None,
    ]
    for block in blocks_:
        assert _json_len(block) == len(json.dumps(block)), block
    with pytest.raises(TypeError):
        _json_len({"bytes": b"x"})
