"""The bounds on what enters a history (`actors.bounds`), and where they apply without
processes: an MCP result, the MCP catalogue, a request built from a large history."""

from __future__ import annotations

import base64
import copy
from typing import Any

import mcp_types as types
import msgpack
import pytest

from actors import bounds
from actors.bounds import cut_line, cut_reason, cut_text, estimate, fit_messages, size_of
from actors.config import Agent, ConfigError, Limits, parse_config
from actors.core.request import build_request
from actors.mcp.hub import McpHub
from actors.mcp.results import outcome_of
from actors.mcp.servers import McpServer

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


def test_cut_text_keeps_head_and_tail_and_says_how_much() -> None:
    assert cut_text("short", 10) == "short"
    text = "a" * 500 + "b" * 500
    out = cut_text(text, 100)
    assert out.startswith("a" * 50 + "\n[truncated: 900 chars omitted]\n")
    assert out.endswith("b" * 50)
    assert len(out) < 100 + 40
    assert cut_text("x" * 11, 0) == "\n[truncated: 11 chars omitted]\n"


def test_cut_result_leaves_room_for_the_tools_own_notes() -> None:
    read = "r" * (256 * 1024) + "\n[truncated: 1000 bytes more]"
    assert bounds.cut_result(read, 256 * 1024) == read
    assert len(bounds.cut_result("x" * 10**6, 1000)) < 1000 + bounds.NOTE_ROOM + 40


def test_cut_line_and_reason() -> None:
    assert cut_line("abcdef", 3) == "abc… [3 chars cut]"
    assert cut_line("abc", 3) == "abc"
    reason = "no " * 1_300_000  # 3.9 MB
    out = cut_reason(reason)
    assert len(out) < bounds.MAX_REASON_CHARS + 40
    assert out.endswith(f"[{len(reason) - bounds.MAX_REASON_CHARS} chars cut]")


def test_size_of_is_msgpacks_and_an_upper_estimate_where_msgpack_fails() -> None:
    value = {"a": ["é" * 1000, 1, 2.5, None, True, {"b": b"xyz"}], "c": "x" * 70000}
    assert size_of(value) == len(msgpack.packb(value, use_bin_type=True)) <= estimate(value)
    deep: Any = "x"
    for _ in range(5000):  # past msgpack's nesting limit; no recursion here
        deep = [deep]
    assert size_of(deep) == estimate(deep) > 5000
    assert size_of(["\ud800" * 10]) == estimate(["\ud800" * 10]) >= 30  # a lone surrogate


def _result(n: int, size: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{n}", "name": "x",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}",
                                      "content": "r" * size, "is_error": False}]},
    ]


def test_fit_messages_leaves_out_the_oldest_results_first() -> None:
    history = [{"role": "user", "content": "go"}]
    for n in range(3):
        history += _result(n, 7_000_000)
    before = copy.deepcopy(history)
    fitted = fit_messages(history, 16_000_000)
    assert history == before  # the log of record is untouched
    assert size_of(fitted) <= 16_000_000
    contents = [m["content"][0].get("content") for m in fitted[2::2]]
    assert contents[0].startswith("[7000005 bytes left out of this request")
    assert contents[1:] == ["r" * 7_000_000] * 2
    assert [m["role"] for m in fitted] == [m["role"] for m in history]
    assert fitted[1] is history[1]  # what was not changed is the same object
    assert fit_messages(history, 10**9) is history


def test_fit_messages_then_long_texts_and_images() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "A" * 5_000_000}}
    history = [
        {"role": "user", "content": [{"type": "text", "text": "t" * 5_000_000}, image]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "now", "cache_control": {}}]},
    ]
    fitted = fit_messages(history, 6_000_000)
    first = fitted[0]["content"]
    assert first[0]["text"].startswith("[50000") and "bytes left out" in first[0]["text"]
    assert first[1]["type"] == "image"  # one was enough
    assert fitted[2] is history[2]
    assert fit_messages(history, 1000)[2] is history[2]  # short texts are never replaced


def test_build_request_fits_the_frame_whatever_the_history() -> None:
    history = [{"role": "user", "content": "go"}]
    for n in range(3):
        history += _result(n, 7_000_000)
    history.append({"role": "assistant", "content": "done"})
    history.append({"role": "user", "content": "and now?"})
    request = build_request(Agent(), history, [], session="s", cwd="/")
    frame = msgpack.packb(request, use_bin_type=True)
    assert len(frame) <= bounds.MAX_REQUEST_BYTES
    assert len(request["messages"]) == len(history)
    small = build_request(Agent(), history[:1], [], session="s", cwd="/")
    assert small["messages"][0]["content"][0]["text"] == "go"


def test_mcp_result_text_and_images_are_bounded() -> None:
    big = "x" * 10_000_000
    png = base64.b64encode(PNG).decode()
    huge_png = base64.b64encode(PNG + b"\0" * (6 * 1024 * 1024)).decode()
    result = types.CallToolResult(content=[
        types.TextContent(type="text", text=big),
        types.ImageContent(type="image", data=huge_png, mime_type="image/png"),
        types.ImageContent(type="image", data=png, mime_type="image/png"),
    ])
    out = outcome_of(result, 1000)
    assert len(out.output) < 1100
    note = "[image 1 dropped: larger than 5 MB]"
    assert f"[truncated: {10_000_000 + 1 + len(note) - 1000} chars omitted]" in out.output
    assert out.output.endswith(note)
    assert len(out.images) == 1 and out.images[0]["source"]["data"] == png
    only_image = outcome_of(types.CallToolResult(content=[
        types.ImageContent(type="image", data=huge_png, mime_type="image/png")]))
    assert only_image.output == note and not only_image.images
    many = outcome_of(types.CallToolResult(content=[
        types.ImageContent(type="image", data=png, mime_type="image/png")] * 10_000), 1000)
    assert len(many.images) == 8 and len(many.output) < 1100  # 9,992 notes, cut


def _hub(tools: list[types.Tool], limits: Limits) -> McpHub:
    config = parse_config({"mcp": {"big": {"command": ["true"]}}}).mcp
    hub = McpHub(config, None, lambda: None, limits=limits)
    server: McpServer = hub.servers["big"]
    server.tools = tools
    hub._tools_changed(server)
    return hub


def test_the_mcp_catalogue_is_bounded() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    tools = [types.Tool(name=f"t{n}", description="d" * 5000, input_schema=schema)
             for n in range(3000)]
    tools.insert(0, types.Tool(name="wide", description="w", input_schema={
        "type": "object", "properties": {f"p{n}": {"type": "string"} for n in range(2000)}}))
    hub = _hub(tools, Limits(max_tools=50, max_tool_description_chars=100))
    specs = hub.specs()
    assert len(specs) == 50
    assert all(len(s.description) < 130 for s in specs)
    assert specs[0].description.endswith("… [4900 chars cut]")
    notes = hub.left_out["big"]
    assert notes[0].startswith("wide: its input schema is") and "max_tool_schema_chars" in notes[0]
    assert notes[-1] == ("2950 more tool(s): the catalogue holds at most 50 MCP tools "
                         "(limits.max_tools)")
    assert sum(len(s.description) + len(str(s.input_schema)) for s in specs) < 50 * 400


def test_limits_are_configurable_and_checked() -> None:
    limits = parse_config({"limits": {"max_result_chars": 5, "max_tools": 3}}).limits
    assert (limits.max_result_chars, limits.max_tools) == (5, 3)
    assert Limits().max_result_chars == bounds.MAX_RESULT_CHARS
    with pytest.raises(ConfigError, match="limits.max_tool_schema_chars: must be at least 1"):
        parse_config({"limits": {"max_tool_schema_chars": 0}})


def test_a_request_carries_at_most_100_images_the_latest() -> None:
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": "iVBORw0KGgo="}}
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(13):  # 8 images a result: 104 in all
        history += _result(n, 10)
        history[-1]["content"][0]["content"] = [{"type": "text", "text": "r"}] + [png] * 8
    fitted = fit_messages(history, 10**9)
    kinds = [b["type"] for m in fitted[2::2] for b in m["content"][0]["content"]]
    assert kinds.count("image") == 100
    assert kinds[:9] == ["text"] * 5 + ["image"] * 4  # the oldest four went
    assert "at most 100 images" in fitted[2]["content"][0]["content"][1]["text"]
    assert fitted[4] is history[4] and history[2]["content"][0]["content"][1] is png
    few = history[:5]
    assert fit_messages(few, 10**9) is few


def test_the_host_takes_at_most_a_quarter_frame_of_an_executors_catalogue() -> None:
    spec = {"name": "t", "description": "d" * 5000, "input_schema": {"type": "object"},
            "tags": [], "risky": False, "core": False}
    specs = [dict(spec, name=f"t{n}") for n in range(3000)]  # 15 MB
    kept, over = bounds.fit_catalogue(specs)
    assert 0 < len(kept) < 3000 and over == 3000 - len(kept)
    assert sum(len(msgpack.packb(s)) for s in kept) <= bounds.MAX_CATALOGUE_BYTES
    assert bounds.fit_catalogue(specs[:10]) == (specs[:10], 0)
    # what one executor offers under the default bounds fits whole
    widest = dict(spec, name="x" * 64, description="d" * bounds.MAX_TOOL_DESCRIPTION_CHARS,
                  input_schema={"type": "object", "description": "s" * 16_000},
                  server="s" * 64)
    assert bounds.fit_catalogue([widest] * bounds.MAX_TOOLS)[1] == 0


def test_message_sizes_match_size_of_as_a_history_grows_and_changes() -> None:
    """What a session's requests measure once per message (`MessageSizes`) is what
    packing the whole list says, whatever was appended, replaced or dropped since."""
    sizes = bounds.MessageSizes()
    history = [{"role": "user", "content": [{"type": "text", "text": "x" * n}]}
               for n in range(40)]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(PNG).decode()}}
    for messages in (history[:1], history[:15], history[:16], history[:17], history,
                     history[:3],  # (a compaction's view is shorter)
                     [*history[:10], {"role": "user", "content": [image, image]},
                      *history[11:]],  # one replaced: its images counted
                     history):
        assert sizes.measure(messages) == (size_of(messages), bounds._count_images(messages))
    unpackable = [*history[:2], {"role": "user", "content": [object()]}]
    assert sizes.measure(unpackable) is None  # (fit_messages estimates it whole)
    assert sizes.measure(history) == (size_of(history), 0)


def test_build_request_with_a_session_memo_sends_what_it_would_without() -> None:
    """The session's memo (`RequestMemo`) changes nothing of the request: same bytes on
    the bus, turn after turn, the agent, tools or directory changing or not."""
    from actors.core.request import RequestMemo

    memo = RequestMemo()
    tools = [{"name": "read_file", "description": "Read a file.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    history: list[dict[str, Any]] = [{"role": "user", "content": "read it"}]
    for turn in range(4):
        agent = Agent() if turn < 2 else Agent(system="Be brief.")
        cwd = "/" if turn != 3 else "/tmp"
        with_memo = build_request(agent, history, tools, session="s", cwd=cwd, memo=memo)
        without = build_request(agent, history, tools, session="s", cwd=cwd)
        assert msgpack.packb(with_memo) == msgpack.packb(without)
        history = [*history, {"role": "assistant", "content": [
            {"type": "tool_use", "id": f"t{turn}", "name": "read_file", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{turn}", "content": "x" * 99}]}]


def test_pack_is_packb_and_recovers_from_a_refusal():
    value = {"h": [["user", [{"type": "text", "text": "é"}]]], "b": b"\x00", "n": 2**40}
    assert bounds.pack(value) == msgpack.packb(value, use_bin_type=True)
    with pytest.raises(TypeError):
        bounds.pack({"nested": [1, 2, object()]})  # (fails midway, the buffer half written)
    assert bounds.pack([1, "x"]) == msgpack.packb([1, "x"], use_bin_type=True)
