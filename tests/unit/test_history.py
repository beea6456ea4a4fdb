"""Sanitising: orphan tool calls and results go; valid histories stay unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.history import add_user_text, is_valid, sanitize


def use(i):
    return {"type": "tool_use", "id": f"t{i}", "name": "shell", "input": {}}


def result(i):
    return {"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}


def text(s="x"):
    return {"type": "text", "text": s}


def test_orphan_tool_use_and_orphan_result_are_dropped():
    history = [
        {"role": "user", "content": [text("go")]},
        {"role": "assistant", "content": [text("a"), use(1), use(2)]},
        {"role": "user", "content": [result(1), result(9)]},
    ]
    out = sanitize(history)
    assert is_valid(out)
    assert [b["id"] for b in out[1]["content"] if b["type"] == "tool_use"] == ["t1"]
    assert [b["tool_use_id"] for b in out[2]["content"]] == ["t1"]


def test_valid_history_is_unchanged():
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use(1)]},
        {"role": "user", "content": [result(1)]},
        {"role": "assistant", "content": [text("done")]},
    ]
    assert is_valid(history)
    assert sanitize(history) == history


def test_follow_up_merges_into_a_trailing_user_message():
    history = [{"role": "user", "content": [text()]}, {"role": "assistant", "content": [use(1)]},
               {"role": "user", "content": [result(1)]}]
    add_user_text(history, "more")
    assert history[-1]["content"][-1] == text("more") and is_valid(history)


blocks = st.lists(
    st.one_of(st.builds(text), st.integers(0, 4).map(use), st.integers(0, 4).map(result)),
    max_size=4,
)
messages = st.lists(
    st.tuples(st.sampled_from(["user", "assistant"]), blocks).map(
        lambda rc: {"role": rc[0], "content": rc[1]}
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_sanitize_always_yields_a_valid_history(history):
    # tool_use blocks belong to assistants and results to users, as the API requires
    for m in history:
        kind = "tool_use" if m["role"] == "user" else "tool_result"
        m["content"] = [b for b in m["content"] if b["type"] != kind]
    out = sanitize(history)
    assert is_valid(out)
    assert sanitize(out) == out
