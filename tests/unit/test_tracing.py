"""Traces (issue 33 item 5) in parts: the envelope's optional `traceparent` on the wire,
the spans `RunTracer` makes of a run's events (tree, times, refusals, faults, bounded
state), when tracing is on, that a supervisor without it never imports the SDK, and
that the llm caller sends the context to the model's server through the real SDK."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from actors.settings import trace_settings
from actors.tracing import RunTracer, traceparent_of
from bus.codec import decode, encode
from bus.errors import BadFrame
from bus.messages import Envelope, Heartbeat, LlmJob

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# -- the envelope ---------------------------------------------------------------------------


def test_a_frame_without_trace_context_is_the_seven_item_array_it_always_was():
    frame = encode(Envelope(Heartbeat(), id="r1", sid="s"))
    assert len(msgpack.unpackb(frame)) == 7
    assert decode(frame).traceparent == ""


def test_a_traceparent_travels_as_an_eighth_item_and_comes_back():
    frame = encode(Envelope(LlmJob({"messages": []}), job="j", traceparent=TP))
    assert msgpack.unpackb(frame)[7] == TP
    assert decode(frame).traceparent == TP


@pytest.mark.parametrize("bad", [7, "x" * 300, None])
def test_a_bad_traceparent_is_a_bad_frame(bad):
    items = msgpack.unpackb(encode(Envelope(Heartbeat())))
    with pytest.raises(BadFrame, match="traceparent"):
        decode(msgpack.packb([*items, bad]))
    with pytest.raises(BadFrame, match="7-item"):
        decode(msgpack.packb([*items, TP, "more"]))


# -- when it is on ------------------------------------------------------------------------


def test_tracing_is_on_with_an_otlp_endpoint_only():
    assert trace_settings({}) is None
    assert trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is not None
    on = trace_settings({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces",
                         "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "True"})
    assert on is not None and on.capture_content
    assert not trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}).capture_content
    for off in ({"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}):
        assert trace_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **off}) is None


SUPERVISOR_FOR_A_MOMENT = """
import asyncio, contextlib, sys
from actors.settings import load_settings
from actors.supervisor import actor
from bus.endpoints import Endpoints
settings = load_settings({{"OPLOOP_HOME": {home!r}, **{extra!r}}})
Endpoints.for_home(settings.home).prepare()
async def main():
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.5):
            await actor._main(settings)
asyncio.run(main())
"""


@pytest.mark.parametrize("extra, loaded", [({}, False),
                                           ({"OTEL_EXPORTER_OTLP_ENDPOINT":
                                             "http://127.0.0.1:9"}, True)])
def test_a_supervisor_imports_opentelemetry_only_when_tracing(short_home, extra, loaded):
    code = SUPERVISOR_FOR_A_MOMENT.format(home=short_home, extra=extra) + \
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    modules = eval(done.stdout.strip().splitlines()[-1])  # a printed list of names
    assert bool(modules) is loaded, modules
    if loaded:
        assert "opentelemetry.sdk.trace" in modules


# -- the spans of a run's events ------------------------------------------------------------


def tracer(capture: bool = False) -> tuple[RunTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return RunTracer(exporter, capture=capture, batch=False), exporter


def feed(t: RunTracer, events: list[tuple[str, int, dict[str, Any], float]],
         session: str = "s1") -> None:
    for type_, turn, data, ts in events:
        t.on_event(session, "ops", "claude-sonnet-4-5", type_, turn, data, ts)


USAGE = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100,
         "cache_creation_input_tokens": 1}
RUN = [
    ("SESSION_START", 0, {"prompt": "do it", "model": "claude-sonnet-4-5", "run": 1}, 100.0),
    ("TURN_START", 1, {}, 100.1),
    ("TOKEN", 1, {"text": "lost"}, 100.2),
    ("RETRY", 1, {"attempt": 1, "error": "overloaded", "wait_s": 0.5}, 100.3),
    ("TOKEN", 1, {"text": "Let me run it."}, 101.0),
    ("TOOL_START", 1, {"tool_use_id": "t1", "name": "shell", "input": {"command": "ls"},
                       "machine": "local"}, 101.5),
    ("TOOL_END", 1, {"tool_use_id": "t2", "name": "write_file", "is_error": True,
                     "output": "write_file: denied", "duration_ms": 0.0}, 101.6),
    ("TOOL_END", 1, {"tool_use_id": "t1", "name": "shell", "is_error": False,
                     "output": "a b", "duration_ms": 1400.0, "machine": "local"}, 102.9),
    ("TURN_END", 1, {"stop": "tool_use", "usage": USAGE}, 103.0),
    ("TURN_START", 2, {}, 103.0),
    ("TURN_END", 2, {"stop": "end_turn", "usage": USAGE}, 104.0),
    ("DONE", 2, {"text": "done it", "turns": 2, "usage": USAGE}, 104.0),
]


def spans_by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def test_a_run_becomes_agent_chat_and_tool_spans_at_the_events_times():
    t, exporter = tracer()
    feed(t, RUN)
    spans = spans_by_name(exporter)
    (agent,) = spans["invoke_agent ops"]
    chat1, chat2 = sorted(spans["chat claude-sonnet-4-5"], key=lambda s: s.start_time)
    (shell,) = spans["execute_tool shell"]
    (refused,) = spans["execute_tool write_file"]
    assert agent.parent is None
    assert {s.parent.span_id for s in (chat1, chat2, shell, refused)} == \
        {agent.context.span_id}
    assert (agent.start_time, agent.end_time) == (100 * 10**9, 104 * 10**9)
    # the first call ends when its reply arrived (its first tool), not at TURN_END
    assert (chat1.start_time, chat1.end_time) == (int(100.1e9), int(101.5e9))
    assert chat1.attributes["gen_ai.usage.input_tokens"] == 111
    assert chat1.attributes["gen_ai.usage.output_tokens"] == 5
    assert chat1.attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert [e.name for e in chat1.events] == ["retry"]
    assert chat1.events[0].attributes["error.type"] == "overloaded"
    assert (shell.start_time, shell.end_time) == (int(101.5e9), int(102.9e9))
    assert shell.attributes["gen_ai.tool.call.id"] == "t1"
    assert shell.attributes["oploop.machine"] == "local"
    assert shell.attributes["oploop.tool.outcome"] == "ok"
    assert refused.attributes["oploop.tool.ran"] is False
    assert refused.status.status_code is StatusCode.ERROR
    assert agent.attributes["oploop.outcome"] == "DONE"
    for span in exporter.get_finished_spans():  # no content unless asked
        assert not {k for k in span.attributes if "messages" in k or "call.a" in k
                    or "call.r" in k}
    assert t.open_runs() == 0


def test_captured_content_is_the_prompt_the_replies_and_the_tools_text():
    t, exporter = tracer(capture=True)
    feed(t, RUN)
    spans = spans_by_name(exporter)
    (agent,) = spans["invoke_agent ops"]
    chat1 = min(spans["chat claude-sonnet-4-5"], key=lambda s: s.start_time)
    (shell,) = spans["execute_tool shell"]
    assert json.loads(agent.attributes["gen_ai.input.messages"])[0]["parts"][0]["content"] \
        == "do it"
    assert "done it" in agent.attributes["gen_ai.output.messages"]
    # the retried attempt's text is void
    assert json.loads(chat1.attributes["gen_ai.output.messages"])[0]["parts"][0]["content"] \
        == "Let me run it."
    assert json.loads(shell.attributes["gen_ai.tool.call.arguments"]) == {"command": "ls"}
    assert shell.attributes["gen_ai.tool.call.result"] == "a b"


def test_a_model_call_that_fails_marks_its_chat_and_the_run():
    t, exporter = tracer()
    feed(t, RUN[:2] + [("ERROR", 0, {"error": "overloaded", "message": "529"}, 109.0)])
    spans = spans_by_name(exporter)
    (agent,), (chat,) = spans["invoke_agent ops"], spans["chat claude-sonnet-4-5"]
    assert chat.status.status_code is StatusCode.ERROR and chat.end_time == 109 * 10**9
    assert agent.attributes["error.type"] == "overloaded"
    assert t.open_runs() == 0


def test_a_cancel_ends_the_tools_in_flight_and_a_caller_trace_is_the_parent():
    t, exporter = tracer()
    t.expect_parent("s1", TP)
    feed(t, RUN[:6] + [("CANCELLED", 1, {"mode": "ui"}, 102.0)])
    spans = spans_by_name(exporter)
    (agent,), (shell,) = spans["invoke_agent ops"], spans["execute_tool shell"]
    assert f"{agent.context.trace_id:032x}" == TP.split("-")[1]
    assert f"{agent.parent.span_id:016x}" == TP.split("-")[2]
    assert shell.end_time == agent.end_time == 102 * 10**9
    assert agent.attributes["oploop.cancel.mode"] == "ui"


def test_a_job_carries_its_model_calls_context_while_it_is_open():
    t, exporter = tracer()
    assert t.traceparent("s1") == ""
    feed(t, RUN[:2])
    tp = t.traceparent("s1")
    assert tp.startswith("00-") and len(tp) == 55
    feed(t, RUN[2:6])  # a tool call under way (an ask_machine's is sent to the peer)
    in_tool = t.traceparent("s1", "t1")
    feed(t, RUN[6:])
    spans = spans_by_name(exporter)
    chat1 = min(spans["chat claude-sonnet-4-5"], key=lambda s: s.start_time)
    assert tp == traceparent_of(_Readable(chat1))
    assert in_tool == traceparent_of(_Readable(spans["execute_tool shell"][0]))
    assert t.traceparent("s1") == ""


class _Readable:
    """A finished span seen as `traceparent_of` sees a live one."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def get_span_context(self) -> Any:
        return self.span.context


def test_a_run_resumed_by_a_new_supervisor_starts_its_spans_there():
    t, exporter = tracer()
    feed(t, [("RESUMED", 1, {"reason": "supervisor restarted"}, 50.0),
             ("TURN_START", 2, {}, 50.1), ("TURN_END", 2, {"stop": "end_turn"}, 51.0),
             ("DONE", 2, {"text": "", "turns": 2}, 51.0)])
    (agent,) = spans_by_name(exporter)["invoke_agent ops"]
    assert agent.attributes["oploop.resumed"] is True and t.open_runs() == 0


class _Dropped(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def test_its_memory_does_not_grow_with_the_runs_it_traced():
    t = RunTracer(_Dropped(), batch=False)

    def runs(n: int, first: int) -> None:
        for i in range(first, first + n):
            t.expect_parent(f"s{i}", TP)
            feed(t, RUN, session=f"s{i}")
            t.expect_parent(f"never-started-{i}", TP)  # a start refused after all

    tracemalloc.start()
    try:
        runs(1100, 0)  # past the bound of the parents left behind
        before = tracemalloc.take_snapshot()
        runs(1500, 1100)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert t.open_runs() == 0 and len(t._parents) <= 1024
    assert grown < 100_000, grown  # 1,500 runs: under 70 bytes a run


def test_a_fault_in_tracing_never_reaches_the_supervisor():
    t, exporter = tracer()
    t.on_event("s1", "ops", "m", "TOOL_END", 1, {"duration_ms": "not a number"}, 1.0)
    assert t.failures == 1


# -- the context at the model's server, through the real SDK ----------------------------------


def test_the_llm_caller_sends_the_jobs_context_to_the_models_server(short_home):
    from actors.llm_caller.actor import LlmCaller
    from actors.llm_caller.backend import AnthropicBackend
    from bus.endpoints import Endpoints

    seen: list[str | None] = []

    async def messages(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent"))
        return web.json_response({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})

    async def main() -> list[Any]:
        app = web.Application()
        app.router.add_post("/v1/messages", messages)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        endpoints = Endpoints.for_home(Path(short_home))
        endpoints.prepare()
        backend = AnthropicBackend("key", f"http://127.0.0.1:{port}")
        caller = LlmCaller(endpoints, backend)
        request = {"model": "m", "max_tokens": 5,
                   "messages": [{"role": "user", "content": "hi"}]}
        try:
            replies = []
            for tp in (TP, ""):
                env = Envelope(LlmJob(request, stream=False), job="j1", traceparent=tp)
                replies.append(await caller.perform(env))
            return replies
        finally:
            caller.reactor.close()
            await backend.aclose()
            await runner.cleanup()

    replies = asyncio.run(main())
    assert all(type(r).__name__ == "LlmResult" for r in replies), replies
    assert seen == [TP, None]
