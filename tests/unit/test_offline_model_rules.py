"""The offline model without HTTP: prompt parsing, the rule engine, scenarios, plans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from actors.offline_model import rules
from actors.offline_model.intents import ToolCall, parse_tool_calls, split_clauses
from actors.offline_model.plan import Drop, End, Event, Head, Stall, plan_response
from actors.offline_model.scenario import (
    DEFAULT_SESSION,
    ScenarioError,
    StatusFault,
    StreamFault,
    load_scenario,
    parse_scenario,
)
from actors.offline_model.wire import (
    InvalidRequest,
    json_chunks,
    message_json,
    stream_events,
    text_chunks,
    validate_request,
)

ALL_TOOLS = [
    {"name": n, "input_schema": {"type": "object"}}
    for n in ("shell", "read_file", "list_dir", "write_file")
]


def request(prompt: Any, tools: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A minimal Messages request with one user message."""
    body = {
        "model": "offline",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": prompt}],
    }
    if tools is not None:
        body["tools"] = tools
    return {**body, **extra}


# --- prompt parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "call"),
    [
        ("run `uname -a`", ToolCall("shell", {"command": "uname -a"})),
        ("run uname -a", ToolCall("shell", {"command": "uname -a"})),
        ("please execute `ls; echo a and b`.", ToolCall("shell", {"command": "ls; echo a and b"})),
        ("read README.md", ToolCall("read_file", {"path": "README.md"})),
        ("read the file docs/x.txt.", ToolCall("read_file", {"path": "docs/x.txt"})),
        ("show me the contents of /etc/hostname", ToolCall("read_file", {"path": "/etc/hostname"})),
        ("list /tmp", ToolCall("list_dir", {"path": "/tmp"})),
        ("list files in src", ToolCall("list_dir", {"path": "src"})),
        ("can you list the current directory", ToolCall("list_dir", {"path": "."})),
        ("list ..", ToolCall("list_dir", {"path": ".."})),
        (
            "write HELLO to notes.txt",
            ToolCall("write_file", {"path": "notes.txt", "content": "HELLO"}),
        ),
        (
            'write "salt and pepper" into the file a.txt',
            ToolCall("write_file", {"path": "a.txt", "content": "salt and pepper"}),
        ),
    ],
)
def test_one_request_becomes_one_call(prompt: str, call: ToolCall) -> None:
    assert parse_tool_calls(prompt) == [call]


def test_several_requests_keep_their_order() -> None:
    calls = parse_tool_calls("list /tmp and read README.md, then run `date`")
    assert [c.name for c in calls] == ["list_dir", "read_file", "shell"]
    assert calls[2].input == {"command": "date"}


def test_quoted_spans_are_not_split() -> None:
    assert split_clauses("run `a, b and c` then list /") == ["run `a, b and c`", "list /"]


def test_chatter_is_not_a_tool_call() -> None:
    assert parse_tool_calls("hello, how are you today?") == []


# --- the rule engine -----------------------------------------------------------------------


def test_prompt_becomes_tool_use_blocks_in_one_reply() -> None:
    reply = rules.respond(request("list /tmp and read README.md, then run `date`", ALL_TOOLS))
    assert reply.stop_reason == "tool_use"
    kinds = [b["type"] for b in reply.content]
    assert kinds == ["text", "tool_use", "tool_use", "tool_use"]
    ids = [b["id"] for b in reply.content[1:]]
    assert all(i.startswith("toolu_") for i in ids) and len(set(ids)) == 3
    assert reply.content[3]["input"] == {"command": "date"}


def test_same_request_same_ids() -> None:
    one = rules.respond(request("run `date`", ALL_TOOLS))
    two = rules.respond(request("run `date`", ALL_TOOLS))
    assert one == two


def test_missing_tool_is_named_honestly() -> None:
    reply = rules.respond(request("read README.md and run `date`", [ALL_TOOLS[1]]))
    assert [b["name"] for b in reply.content if b["type"] == "tool_use"] == ["read_file"]
    assert "`shell` tool is not available" in reply.content[0]["text"]
    none = rules.respond(request("run `date`"))
    assert none.stop_reason == "end_turn"
    assert [b["type"] for b in none.content] == ["text"]
    assert "not available" in none.content[0]["text"]


def test_nothing_recognised_gets_help() -> None:
    reply = rules.respond(request("hi there", ALL_TOOLS))
    assert reply.stop_reason == "end_turn"
    assert reply.content[0]["text"] == rules.HELP_TEXT


def test_reminders_in_the_prompt_are_not_read_as_requests() -> None:
    text = "<system-reminder>run `rm -rf /`</system-reminder>hello"
    reply = rules.respond(request([{"type": "text", "text": text}], ALL_TOOLS))
    assert reply.content[0]["text"] == rules.HELP_TEXT


def _after_tools(results: list[dict[str, Any]]) -> dict[str, Any]:
    uses = [
        {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"command": "uname -a"}},
        {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "nope.txt"}},
    ]
    return {
        "model": "offline",
        "max_tokens": 1000,
        "tools": ALL_TOOLS,
        "messages": [
            {"role": "user", "content": "run `uname -a` and read nope.txt"},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ],
    }


def test_tool_results_are_reported() -> None:
    long_output = "Linux box 6.1.0 x86_64\n" + "\n".join(f"line {i}" for i in range(50))
    reply = rules.respond(
        _after_tools(
            [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": long_output},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "No such file"}],
                },
            ]
        )
    )
    assert reply.stop_reason == "end_turn"
    text = reply.content[0]["text"]
    assert "`uname -a` printed:" in text and "Linux box 6.1.0" in text
    assert "more lines)" in text and "line 49" not in text
    assert "`nope.txt` failed:" in text and "No such file" in text


def test_empty_tool_result() -> None:
    reply = rules.respond(_after_tools([{"type": "tool_result", "tool_use_id": "toolu_1"}]))
    assert "`uname -a` finished with no output." in reply.content[0]["text"]


def test_thinking_comes_first_with_a_signature() -> None:
    reply = rules.respond(
        request("run `date`", ALL_TOOLS, thinking={"type": "enabled", "budget_tokens": 1024})
    )
    first = reply.content[0]
    assert first["type"] == "thinking" and first["signature"] and "run `date`" in first["thinking"]
    assert reply.stop_reason == "tool_use"


def test_max_tokens_cuts_the_reply() -> None:
    reply = rules.respond(request("hello", ALL_TOOLS, max_tokens=5))
    assert reply.stop_reason == "max_tokens"
    assert len(reply.content[0]["text"].split()) == 5
    assert reply.output_tokens == 5
    # a tool call that does not fit is dropped whole, never sent half-made
    cut = rules.respond(request("run `date`", ALL_TOOLS, max_tokens=4))
    assert cut.stop_reason == "max_tokens"
    assert all(b["type"] == "text" for b in cut.content)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "image"}, "junk", 3]}],
        [{"role": "assistant", "content": "only an assistant"}],
        [{"role": "user", "content": [{"type": "tool_result", "content": {"odd": 1}}]}],
    ],
)
def test_odd_content_never_breaks_the_rules(messages: list[Any]) -> None:
    reply = rules.respond({"model": "m", "max_tokens": 50, "messages": messages})
    assert reply.content and reply.stop_reason in ("end_turn", "max_tokens")


# --- wire shapes ---------------------------------------------------------------------------


def test_chunks_join_back() -> None:
    text = "  Hello,  world!\n\nSecond   line "
    assert "".join(text_chunks(text)) == text and len(text_chunks(text)) > 3
    data = json.dumps({"command": "echo 'a b c d e f'"})
    assert "".join(json_chunks(data)) == data and len(json_chunks(data)) >= 3


def test_stream_event_sequence() -> None:
    reply = rules.respond(request("run `date`", ALL_TOOLS))
    message = message_json(reply, model="m", message_id="msg_1", in_tokens=3)
    names = [name for name, _ in stream_events(message)]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "JSON object"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 1, "messages": []}, "messages"),
        (
            {"model": "m", "max_tokens": 1, "messages": [{"role": "bot", "content": "x"}]},
            "messages.0",
        ),
    ],
)
def test_invalid_requests_are_named(body: Any, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        validate_request(body)


# --- scenarios -----------------------------------------------------------------------------


def test_scenario_parses_every_turn_kind() -> None:
    scenario = parse_scenario(
        {
            "turns": [
                "rules",
                {"reply": "hello", "delay_s": 0.01},
                {"reply": [{"type": "tool_use", "name": "shell", "input": {"command": "ls"}}]},
                {"fault": "status", "status": 429, "headers": {"retry-after": 1}},
                {"fault": "drop", "after_events": 2},
                {"fault": "stall", "seconds": 0.1, "ping_every_s": 0.05, "then": "drop"},
                {"fault": "truncate"},
                {"fault": "error_event", "reply": "partial"},
            ]
        }
    )
    t = scenario.turns
    assert t[0].content is None and t[0].fault is None
    assert t[1].content == ({"type": "text", "text": "hello"},) and t[1].stop_reason == "end_turn"
    assert t[2].stop_reason == "tool_use" and t[2].content is not None
    assert t[2].content[0]["id"].startswith("toolu_")
    assert t[3].fault == StatusFault(
        429,
        (("retry-after", "1"),),
        {"type": "rate_limit_error", "message": t[3].fault.error["message"]},
    )  # type: ignore[union-attr]
    assert t[4].fault == StreamFault("drop", 2)
    assert isinstance(t[5].fault, StreamFault) and t[5].fault.then == "drop"
    assert t[6].fault == StreamFault("truncate", None)
    assert t[7].fault.error["type"] == "overloaded_error"  # type: ignore[union-attr]


def test_scenario_cursor_is_per_session() -> None:
    scenario = parse_scenario(["rules", {"reply": "two"}])
    assert scenario.next_turn("a") == scenario.turns[0]
    assert scenario.next_turn("b") == scenario.turns[0]
    assert scenario.next_turn("a") == scenario.turns[1]
    assert scenario.next_turn("a") is None  # out of turns: the rules answer
    assert scenario.played(DEFAULT_SESSION) == 0


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"turn": []}, "unknown top-level keys"),
        ([{"reply": "x", "stop_reason": "done"}], r"turns\[0\].stop_reason"),
        ([{"fault": "explode"}], r"turns\[0\].fault: unknown fault 'explode'"),
        (["rules", {"fault": "status", "status": 200}], r"turns\[1\].status"),
        ([{"fault": "drop", "after_event": 2}], r"turns\[0\]: unknown keys \['after_event'\]"),
        ([{"fault": "stall"}], r"turns\[0\].seconds: required"),
        ([{"reply": [{"type": "tool_use", "name": "x"}]}], r"turns\[0\].reply\[0\].input"),
        ([42], r"turns\[0\]"),
    ],
)
def test_malformed_scenarios_say_what_is_wrong(data: Any, where: str) -> None:
    with pytest.raises(ScenarioError, match=where):
        parse_scenario(data, "s.json")


def test_scenario_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[{")
    with pytest.raises(ScenarioError, match="bad.json: not valid JSON"):
        load_scenario(path)
    path.write_text(json.dumps([{"reply": "ok"}]))
    assert len(load_scenario(path).turns) == 1


# --- plans ---------------------------------------------------------------------------------


def _plan(turn_data: Any, stream: bool = True) -> list[Any]:
    turn = parse_scenario([turn_data]).turns[0]
    req = request("hello", ALL_TOOLS, stream=stream)
    return plan_response(req, turn, message_id="msg_1", request_id="req_1")


def test_drop_plan_never_ends_the_body() -> None:
    plan = _plan({"fault": "drop", "after_events": 2})
    assert isinstance(plan[0], Head) and [a.name for a in plan[1:3]] == ["message_start", "ping"]
    assert isinstance(plan[-1], Drop) and not any(isinstance(a, End) for a in plan)
    assert _plan({"fault": "drop"}, stream=False) == [Drop()]


def test_truncate_plan_stops_before_message_delta() -> None:
    plan = _plan({"fault": "truncate"})
    names = [a.name for a in plan if isinstance(a, Event)]
    assert names[-1] == "content_block_stop" and isinstance(plan[-1], End)


def test_stall_plan_continues() -> None:
    plan = _plan({"fault": "stall", "seconds": 1, "ping_every_s": 0.5})
    stalls = [a for a in plan if isinstance(a, Stall)]
    assert stalls == [Stall(1.0, 0.5)]
    assert [a.name for a in plan if isinstance(a, Event)][-1] == "message_stop"
