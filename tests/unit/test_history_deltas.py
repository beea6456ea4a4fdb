"""History deltas: what the supervisor sends each caller rebuilds the full request,
and the incremental sanitiser agrees with `sanitize` everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.config import DEFAULT_AGENT
from actors.core.deltas import TurnCache
from actors.core.history import add_user_text, sanitize
from actors.core.request import build_request
from actors.llm_caller.histories import BadHistory, HistoryCache, HistoryMiss
from bus.codec import decode, encode
from bus.messages import Envelope, LlmJob

TOOLS = [{"name": "read_file", "description": "read", "input_schema": {"type": "object"}}]


def wire(job: LlmJob) -> LlmJob:
    """Through the codec, as a caller receives it."""
    body = decode(encode(Envelope(job))).body
    assert isinstance(body, LlmJob)
    return body


def one_turn(history, i):
    history.append({"role": "assistant", "content": [
        {"type": "tool_use", "id": f"t{i}", "name": "read_file", "input": {"path": "x"}}]})
    history.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok", "is_error": False}]})


def test_each_caller_rebuilds_every_request_exactly_and_deltas_stay_small():
    memo, callers = TurnCache(), {b"a": HistoryCache(), b"b": HistoryCache()}
    history = []
    add_user_text(history, "go")
    order = [b"a", b"a", b"b", b"a", b"b", b"b"] * 5
    sizes, last_seen = [], {}
    for i, worker in enumerate(order):
        if i == 12:
            add_user_text(history, "a follow-up")  # the last message replaced, not appended
        request = build_request(DEFAULT_AGENT, memo.sanitized(history), TOOLS,
                                session="s", cwd="/")
        sent = wire(memo.llm_job("s", request, True).for_caller(worker))
        assert callers[worker].resolve(sent) == request
        behind = i - last_seen.get(worker, -99)
        last_seen[worker] = i
        # what that caller has not seen, and the messages whose cache breakpoint moved
        sizes.append((len(sent.request["messages"]), behind))
        one_turn(history, i)
    assert sizes[0][0] == 1
    assert all(n <= 2 * behind + 3 for n, behind in sizes[6:]), sizes
    assert callers[b"a"].hits and callers[b"b"].hits


def test_a_caller_without_the_revision_misses_then_gets_the_full_request():
    memo, old = TurnCache(), HistoryCache()
    history = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    for i in range(3):
        request = build_request(DEFAULT_AGENT, memo.sanitized(history), TOOLS, session="s",
                                cwd="/")
        old.resolve(wire(memo.llm_job("s", request, True).for_caller(b"a")))
        one_turn(history, i)
    request = build_request(DEFAULT_AGENT, memo.sanitized(history), TOOLS, session="s", cwd="/")
    job = memo.llm_job("s", request, True)
    fresh = HistoryCache()  # the caller restarted under the same routing id
    try:
        fresh.resolve(wire(job.for_caller(b"a")))
        raise AssertionError("a delta against nothing must miss")
    except HistoryMiss as exc:
        assert exc.held is None
    memo.forget_callers()
    again = wire(job.for_caller(b"a"))
    assert again.keep == 0 and fresh.resolve(again) == request


def test_the_tools_and_system_prompt_go_once_per_caller_until_they_change():
    memo, caller = TurnCache(), HistoryCache()
    history = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    tools = TOOLS
    kinds = []
    for i in range(6):
        if i == 4:  # an MCP server came: the tool list changed
            tools = [*TOOLS, {"name": "mcp__x__y", "description": "y",
                              "input_schema": {"type": "object"}}]
        request = build_request(DEFAULT_AGENT, memo.sanitized(history), tools, session="s",
                                cwd="/")
        sent = wire(memo.llm_job("s", request, True).for_caller(b"a"))
        assert caller.resolve(sent) == request
        kinds.append((sent.keep > 0, sent.same_rest, sorted(sent.request)))
        one_turn(history, i)
    full = sorted(build_request(DEFAULT_AGENT, history, TOOLS, session="s", cwd="/"))
    only = ["messages"]
    # (The first three requests move the breakpoints off the first messages: no delta yet.)
    assert kinds == [(False, False, full)] * 3 + [
        (True, True, only), (True, False, full), (True, True, only)]


def test_same_rest_without_a_held_revision_misses_and_without_a_delta_is_refused():
    with pytest.raises(HistoryMiss):  # e.g. the caller restarted: the supervisor resends
        HistoryCache().resolve(LlmJob({"messages": []}, history_key="s", base_rev=1, keep=1,
                                      rev=2, same_rest=True))
    with pytest.raises(BadHistory, match="same_rest"):
        HistoryCache().resolve(LlmJob({"messages": []}, history_key="s", rev=1,
                                      same_rest=True))
    cache = HistoryCache()
    cache.resolve(LlmJob({"model": "m", "messages": []}, history_key="s", rev=1))
    with pytest.raises(BadHistory, match="same_rest"):  # messages alone, or it is no delta
        cache.resolve(LlmJob({"model": "x", "messages": []}, history_key="s", base_rev=1,
                             keep=0, rev=2, same_rest=True))


def test_a_delta_whose_messages_are_not_a_list_is_refused():
    try:
        HistoryCache().resolve(LlmJob({"messages": "nope"}, history_key="s", rev=1))
        raise AssertionError("must refuse")
    except BadHistory as exc:
        assert "must be a list" in str(exc)


def test_a_full_request_without_a_key_is_kept_as_is():
    cache = HistoryCache()
    request = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert cache.resolve(LlmJob(request)) is request and len(cache) == 0


def test_least_recently_used_histories_go_first():
    cache = HistoryCache(max_sessions=2)
    for key in ("a", "b", "c"):
        cache.resolve(LlmJob({"messages": []}, history_key=key, rev=1))
    try:
        cache.resolve(LlmJob({"messages": []}, history_key="a", base_rev=1, keep=1, rev=2))
        raise AssertionError("a was evicted")
    except HistoryMiss:
        pass


def test_histories_are_bounded_in_bytes_and_deltas_are_measured_incrementally():
    big = {"role": "user", "content": [{"type": "text", "text": "x" * 10_000}]}
    cache = HistoryCache(max_sessions=100, max_bytes=25_000)
    for key in ("a", "b", "c"):
        cache.resolve(LlmJob({"messages": [big]}, history_key=key, rev=1))
    assert len(cache) == 2 and cache.bytes <= 25_000  # "a" went for the bytes
    reply = {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    cache.resolve(LlmJob({"messages": [reply]}, history_key="c", base_rev=1, keep=1, rev=2))
    assert 20_000 < cache.bytes <= 25_000
    with pytest.raises(HistoryMiss):
        cache.resolve(LlmJob({"messages": []}, history_key="a", base_rev=1, keep=1, rev=2))


def use(i):
    return {"type": "tool_use", "id": f"t{i}", "name": "shell", "input": {}}


def result(i):
    return {"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}


blocks = st.lists(st.one_of(st.just({"type": "text", "text": "x"}),
                            st.integers(0, 3).map(use), st.integers(0, 3).map(result)),
                  min_size=0, max_size=3)
messages = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), blocks).map(
    lambda rc: {"role": rc[0], "content": [b for b in rc[1] if b["type"] != (
        "tool_use" if rc[0] == "user" else "tool_result")]}), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4))
def test_incremental_sanitising_agrees_with_sanitize(growth):
    memo, history = TurnCache(), []
    for appended in growth:
        history.extend(appended)
        assert memo.sanitized(history) == sanitize(history)
        assert memo.sanitized(history) == sanitize(history)  # from the memo this time
