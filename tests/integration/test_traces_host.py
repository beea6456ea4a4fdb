"""OpenTelemetry traces of a real host's run (issue 33 item 5), received by a real
OTLP/HTTP endpoint in the test (aiohttp, `POST /v1/traces`, decoded with the
collector protocol's `ExportTraceServiceRequest`): one trace per run, the span tree
`invoke_agent` > `chat` (per model call, a retry as its event) and `execute_tool`,
the GenAI attributes, the real times, and the text only when capture is asked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from homes import make_home, remove_home
from hostkit import of_type, run, running_host, scripted_host
from mcpkit import DONE
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from peerkit import ask, free_ports, issue_peer_key, network_config, peer_config, write_home

PROMPT = "#traced run the secret-word-4711 command"
SCRIPTS = {"traced": [
    {"fault": "status", "status": 529},  # the first attempt is refused: a retry
    {"reply": [{"type": "tool_use", "name": "shell", "id": "toolu_traced1",
                "input": {"command": "echo tool-output-0815"}}]},
    DONE,
]}
CONTENT_KEYS = {"gen_ai.input.messages", "gen_ai.output.messages",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on loopback, in a thread: the spans it was sent."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        spans = [_span(s) for rs in message.resource_spans for ss in rs.scope_spans
                 for s in ss.spans]
        services = {_value(a.value) for rs in message.resource_spans
                    for a in rs.resource.attributes if a.key == "service.name"}
        assert services == {"oploop"}, services
        with self.changed:
            self.spans += spans
            self.changed.notify_all()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def wait(self, found: Any, timeout: float = 30.0) -> Any:
        """Until `found(spans)` is truthy; its value."""
        with self.changed:
            result = self.changed.wait_for(lambda: found(self.spans), timeout)
            assert result, self.spans
            return result

    def run_spans(self, session: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The spans of `session`'s run, once its `invoke_agent` span (the last to
        end) and everything of its trace has arrived."""

        def trace() -> list[dict[str, Any]] | None:
            roots = [s for s in self.spans if s["name"].startswith("invoke_agent")
                     and s["attrs"].get("gen_ai.conversation.id") == session]
            if not roots:
                return None
            mine = [s for s in self.spans if s["trace_id"] == roots[0]["trace_id"]]
            return mine if len(mine) >= 4 else None

        with self.changed:
            assert self.changed.wait_for(trace, timeout), self.spans
            return trace() or []


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def _span(s: Any) -> dict[str, Any]:
    return {"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
            "parent": s.parent_span_id.hex(), "start": s.start_time_unix_nano / 1e9,
            "end": s.end_time_unix_nano / 1e9, "status": s.status.code,
            "attrs": {a.key: _value(a.value) for a in s.attributes},
            "events": [(e.name, {a.key: _value(a.value) for a in e.attributes})
                       for e in s.events]}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def traced_host(receiver: OtlpReceiver, home: str, directory: Path, capture: bool) -> Any:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
           "OTEL_BSP_SCHEDULE_DELAY": "50", "NO_PROXY": "127.0.0.1,localhost",
           "OPLOOP_RETRY_BASE_S": "0.05"}
    if capture:
        env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
    return scripted_host(home, SCRIPTS, directory, env)


def traced_run(receiver: OtlpReceiver, tmp_path: Path, capture: bool, **start: Any
               ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    home = make_home("opt-")
    try:
        with traced_host(receiver, home, tmp_path, capture):
            events = run(home, PROMPT, **start)
            spans = receiver.run_spans(events[0]["session"])
    finally:
        remove_home(Path(home))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_kind.setdefault(span["attrs"]["gen_ai.operation.name"], []).append(span)
    return events, by_kind


def test_a_run_is_one_trace_of_agent_chat_and_tool_spans(receiver, tmp_path):
    events, spans = traced_run(receiver, tmp_path, capture=False)
    assert events[-1]["type"] == "DONE"
    (agent,) = spans["invoke_agent"]
    chats = sorted(spans["chat"], key=lambda s: s["start"])
    (tool,) = spans["execute_tool"]
    assert len({s["trace_id"] for s in [agent, *chats, tool]}) == 1
    assert agent["parent"] == "" and agent["name"] == "invoke_agent default"
    assert all(s["parent"] == agent["span_id"] for s in [*chats, tool])
    session = events[0]["session"]
    assert agent["attrs"]["gen_ai.conversation.id"] == session
    assert agent["attrs"]["gen_ai.agent.name"] == "default"
    assert agent["attrs"]["oploop.outcome"] == "DONE"

    # one chat per model call: the tool call's, then the final answer's
    assert len(chats) == 2
    model = agent["attrs"]["gen_ai.request.model"]
    for chat, stop in zip(chats, ("tool_use", "end_turn"), strict=True):
        assert chat["name"] == f"chat {model}"
        assert chat["attrs"]["gen_ai.request.model"] == model
        assert chat["attrs"]["gen_ai.response.finish_reasons"] == [stop]
        assert chat["attrs"]["gen_ai.usage.input_tokens"] > 0
        assert chat["attrs"]["gen_ai.usage.output_tokens"] > 0
    retries = [e for e in chats[0]["events"] if e[0] == "retry"]
    assert len(retries) == 1 and retries[0][1]["oploop.retry.attempt"] == 1, chats[0]["events"]
    assert retries[0][1]["error.type"] == of_type(events, "RETRY")[0]["data"]["error"]

    start, = of_type(events, "TOOL_START")
    end, = of_type(events, "TOOL_END")
    assert tool["name"] == "execute_tool shell"
    assert tool["attrs"]["gen_ai.tool.name"] == "shell"
    assert tool["attrs"]["gen_ai.tool.call.id"] == "toolu_traced1" == start["data"]["tool_use_id"]
    assert tool["attrs"]["oploop.machine"] == "local"
    assert tool["attrs"]["oploop.tool.outcome"] == "ok"
    # the real times: the events' own
    assert tool["start"] == pytest.approx(start["ts"], abs=1e-3)
    assert tool["end"] == pytest.approx(end["ts"], abs=1e-3)
    assert agent["start"] <= chats[0]["start"] < chats[0]["end"] <= tool["start"]
    assert tool["end"] <= chats[1]["start"] < chats[1]["end"] <= agent["end"]
    assert agent["end"] == pytest.approx(events[-1]["ts"], abs=1e-3)

    # no content without OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
    for span in [agent, *chats, tool]:
        assert not CONTENT_KEYS & span["attrs"].keys(), span
        text = repr(span)
        assert "secret-word-4711" not in text and "tool-output-0815" not in text


def test_content_is_recorded_only_when_capture_is_asked(receiver, tmp_path):
    # (and a client's trace context, sent with its StartRun, is the run's parent)
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    events, spans = traced_run(receiver, tmp_path, capture=True, traceparent=caller)
    (agent,) = spans["invoke_agent"]
    assert (agent["trace_id"], agent["parent"]) == tuple(caller.split("-")[1:3])
    (tool,) = spans["execute_tool"]
    assert "secret-word-4711" in agent["attrs"]["gen_ai.input.messages"]
    assert events[-1]["data"]["text"] in agent["attrs"]["gen_ai.output.messages"]
    assert "echo tool-output-0815" in tool["attrs"]["gen_ai.tool.call.arguments"]
    assert "tool-output-0815" in tool["attrs"]["gen_ai.tool.call.result"]


def test_an_ask_machine_continues_the_callers_trace_on_the_asked_host(receiver):
    homes = {name: make_home(f"opt{name}-") for name in "ab"}
    listen = f"tcp://127.0.0.2:{free_ports('127.0.0.2')}"
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
              "OTEL_BSP_SCHEDULE_DELAY": "50", "NO_PROXY": "127.0.0.1,localhost"}
    remote = {"echo": [{"reply": [{"type": "tool_use", "name": "shell",
                                   "input": {"command": "echo from-b"}}]}, DONE]}
    try:
        env_b = write_home(homes["b"], remote, network_config(listen))
        key = issue_peer_key(homes["b"], "host-a")
        env_a = write_home(homes["a"], {"askb": [{"reply": [ask("b", "#echo hello")]}, DONE]},
                           peer_config("b", listen, key))
        with running_host(homes["b"], {**env_b, **traced}), \
                running_host(homes["a"], {**env_a, **traced}):
            events = run(homes["a"], "#askb ask b")
            assert events[-1]["type"] == "DONE"
            (asked,) = receiver.run_spans(events[0]["session"]) and [
                s for s in receiver.spans if s["name"] == "execute_tool ask_machine"
                and s["attrs"]["gen_ai.tool.call.id"] ==
                of_type(events, "TOOL_START")[0]["data"]["tool_use_id"]]

            def remote_root(spans: list[dict[str, Any]]) -> dict[str, Any] | None:
                return next((s for s in spans if s["name"].startswith("invoke_agent")
                             and s["parent"] == asked["span_id"]), None)

            root = receiver.wait(remote_root)
            assert root["trace_id"] == asked["trace_id"]
            assert root["attrs"]["gen_ai.conversation.id"] != events[0]["session"]
            tools = receiver.wait(lambda spans: [
                s for s in spans if s["name"] == "execute_tool shell"
                and s["parent"] == root["span_id"]])
            assert tools[0]["trace_id"] == asked["trace_id"]
    finally:
        for home in homes.values():
            remove_home(Path(home))
