"""OpenTelemetry traces of runs, made from the supervisor's own events (issue 33 item 5).

`RunTracer.on_event` sees every event `Supervisor.emit` stamps and turns a run into
spans after the GenAI semantic conventions:

- `invoke_agent {agent}`: the run, `SESSION_START` to its terminal event (one trace
  per run; the child of a caller's span when `StartRun` carried a `traceparent`);
- `chat {model}`: one model call (a turn), `TURN_START` to the reply's arrival (the
  first event the reply causes), with its usage and stop reason from `TURN_END`;
  each retried attempt is a `retry` event on it;
- `execute_tool {tool}`: one tool call, `TOOL_START` to `TOOL_END` (a call refused
  before it ran spans its refusal only), with its machine and outcome.

Each span starts and ends at the `ts` of the events that bound it: the real times,
however late the span is exported. The model's and tools' text (prompt, replies,
tool input and output) is recorded only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.

The SDK (`opentelemetry-sdk`, the OTLP/HTTP exporter) is imported here only, and
this module only when tracing is on (`Settings.traces`: an `OTEL_EXPORTER_OTLP_*`
endpoint is set); the exporter reads the standard variables itself (endpoint,
headers, timeout). State is per open run and dropped at its terminal event.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bus.vocab import TERMINAL, EventType

#: Characters of one captured text (a prompt, a reply, a tool's input or output).
CONTENT_CAP = 16 * 1024
#: Remote parents waiting for their run's `SESSION_START` (a start refused later
#: leaves one behind: the oldest go first).
PARENTS_MAX = 1024
PROVIDER = "anthropic"

#: The events that show a model call's reply has arrived (the chat span's end).
#: (A terminal event ends a call still waiting for its reply at its own time.)
_AFTER_REPLY = frozenset({EventType.TOOL_START, EventType.TOOL_END, EventType.TURN_END,
                          EventType.APPROVAL_REQUESTED})
_PROPAGATOR = TraceContextTextMapPropagator()
log = logging.getLogger("oploop.tracing")


def _ns(ts: float) -> int:
    return int(ts * 1e9)


def _cut(text: str) -> str:
    return text if len(text) <= CONTENT_CAP else text[:CONTENT_CAP] + "…[cut]"


def traceparent_of(span: Span) -> str:
    """The W3C `traceparent` of `span` ("" when it is not recording)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


@dataclass
class _Run:
    """The open spans of one session's run."""

    span: Span
    model: str
    chat: Span | None = None
    #: When the open chat's reply arrived (0: not yet): its span's end.
    replied: float = 0.0
    text: list[str] = field(default_factory=list)  # the call's streamed reply (capture)
    tools: dict[str, Span] = field(default_factory=dict)


class RunTracer:
    """Turns a supervisor's events into spans and exports them (module docstring)."""

    def __init__(self, exporter: SpanExporter | None = None, *, capture: bool = False,
                 batch: bool = True) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )

            exporter = OTLPSpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": "oploop"}))
        if batch:
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        else:  # (tests: each span exported as it ends)
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor

            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("oploop")
        self.capture = capture
        self._runs: dict[str, _Run] = {}
        self._parents: OrderedDict[str, Any] = OrderedDict()
        #: Events whose tracing failed (logged, never raised).
        self.failures = 0

    # -- what the supervisor asks --------------------------------------------------------

    def expect_parent(self, session: str, traceparent: str) -> None:
        """The next run of `session` is part of the caller's trace `traceparent`."""
        if not traceparent:
            return
        self._parents[session] = _PROPAGATOR.extract({"traceparent": traceparent})
        while len(self._parents) > PARENTS_MAX:
            self._parents.popitem(last=False)

    def traceparent(self, session: str, call_id: str = "") -> str:
        """The context work of `session`'s run carries: the tool call `call_id`'s, else
        the model call's, else the run's; "" when the session has no open run."""
        run = self._runs.get(session)
        if run is None:
            return ""
        span = run.tools.get(call_id) if call_id else None
        return traceparent_of(span or run.chat or run.span)

    def open_runs(self) -> int:
        """Runs with open spans now (each is dropped at its terminal event)."""
        return len(self._runs)

    def shutdown(self) -> None:
        """End what is open (the supervisor stops), export what is pending."""
        for run in list(self._runs.values()):
            for span in (*run.tools.values(), run.chat, run.span):
                if span is not None:
                    span.set_attribute("oploop.interrupted", True)
                    span.end()
        self._runs.clear()
        self.provider.shutdown()

    # -- events ----------------------------------------------------------------------------

    def on_event(self, session: str, agent: str, model: str, type_: str, turn: int,
                 data: dict[str, Any], ts: float) -> None:
        """One event of `session` (of `agent` on `model`) as emitted at `ts`. A fault here
        is logged (the first, then every 1000th), never raised into the supervisor."""
        try:
            self._on_event(session, agent, model, type_, turn, data, ts)
        except Exception:  # the edge: traces are an observer, never the run's failure
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.exception("tracing: %s of %s not traced (%d so far)", type_, session,
                              self.failures)

    def _on_event(self, session: str, agent: str, model: str, type_: str, turn: int,
                  data: dict[str, Any], ts: float) -> None:
        if type_ == EventType.SESSION_START:
            self._start(session, agent, str(data.get("model") or model), data, ts)
            return
        run = self._runs.get(session)
        if run is None:  # a run resumed by a new supervisor: its spans start here
            if type_ in TERMINAL or type_ == EventType.TOKEN:
                return
            run = self._start(session, agent, model, {}, ts, resumed=True)
        if run.chat is not None and not run.replied and type_ in _AFTER_REPLY:
            run.replied = ts
        handler = _HANDLERS.get(type_)
        if handler is not None:
            handler(self, run, turn, data, ts)
        if type_ in TERMINAL:
            self._end(session, run, type_, data, ts)

    def _start(self, session: str, agent: str, model: str, data: dict[str, Any], ts: float,
               resumed: bool = False) -> _Run:
        old = self._runs.pop(session, None)
        if old is not None:  # (never: one terminal event per run)
            self._close(old, ts)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": PROVIDER,
            "gen_ai.agent.name": agent, "gen_ai.conversation.id": session,
            "gen_ai.request.model": model,
        }
        if "run" in data:
            attrs["oploop.run"] = data["run"]
        if resumed:
            attrs["oploop.resumed"] = True
        if self.capture and isinstance(data.get("prompt"), str):
            attrs["gen_ai.input.messages"] = _messages("user", data["prompt"])
        span = self.tracer.start_span(f"invoke_agent {agent}", self._parents.pop(session, None),
                                      SpanKind.INTERNAL, attrs, start_time=_ns(ts))
        run = self._runs[session] = _Run(span, model)
        return run

    def _turn_start(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        if run.chat is not None:
            self._end_chat(run, ts)
        ctx = trace.set_span_in_context(run.span)
        run.chat = self.tracer.start_span(
            f"chat {run.model}", ctx, SpanKind.CLIENT,
            {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
             "gen_ai.request.model": run.model, "oploop.turn": turn},
            start_time=_ns(ts))
        run.replied, run.text = 0.0, []

    def _token(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        if self.capture and run.chat is not None and sum(map(len, run.text)) < CONTENT_CAP:
            run.text.append(str(data.get("text", "")))

    def _retry(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        attrs = {"oploop.retry.attempt": int(data.get("attempt") or 0),
                 "error.type": str(data.get("error", "")),
                 "oploop.retry.wait_s": float(data.get("wait_s") or 0.0)}
        target = run.chat if run.chat is not None and turn else run.span
        target.add_event("retry", attrs, timestamp=_ns(ts))
        run.text = []  # the failed attempt's text is void

    def _turn_end(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        chat = run.chat
        if chat is None:
            return
        usage = data.get("usage") or {}
        if usage:
            cache_read = int(usage.get("cache_read_input_tokens") or 0)
            cache_write = int(usage.get("cache_creation_input_tokens") or 0)
            chat.set_attributes({
                "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0)
                + cache_read + cache_write,
                "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
                "gen_ai.usage.cache_read.input_tokens": cache_read,
                "gen_ai.usage.cache_creation.input_tokens": cache_write,
            })
        if data.get("stop"):
            chat.set_attribute("gen_ai.response.finish_reasons", [str(data["stop"])])
        self._end_chat(run, ts)

    def _end_chat(self, run: _Run, ts: float) -> None:
        chat = run.chat
        assert chat is not None
        if self.capture and run.text:
            chat.set_attribute("gen_ai.output.messages",
                               _messages("assistant", _cut("".join(run.text))))
        chat.end(end_time=_ns(run.replied or ts))
        run.chat, run.replied, run.text = None, 0.0, []

    def _tool_start(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        call_id = str(data.get("tool_use_id", ""))
        run.tools[call_id] = self._tool_span(run, data, ts)

    def _tool_span(self, run: _Run, data: dict[str, Any], ts: float) -> Span:
        name = str(data.get("name", ""))
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": str(data.get("tool_use_id", "")),
            "gen_ai.tool.type": "function",
        }
        if data.get("machine"):
            attrs["oploop.machine"] = str(data["machine"])
        if self.capture and "input" in data:
            attrs["gen_ai.tool.call.arguments"] = _cut(json.dumps(data["input"], default=str))
        return self.tracer.start_span(f"execute_tool {name}", trace.set_span_in_context(run.span),
                                      SpanKind.INTERNAL, attrs, start_time=_ns(ts))

    def _tool_end(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        span = run.tools.pop(str(data.get("tool_use_id", "")), None)
        if span is None:  # refused before it ran: the span of its refusal
            ms = float(data.get("duration_ms") or 0.0)
            span = self._tool_span(run, data, ts - ms / 1000)
            span.set_attribute("oploop.tool.ran", False)
        failed = bool(data.get("is_error"))
        span.set_attribute("oploop.tool.outcome", "error" if failed else "ok")
        if data.get("machine"):
            span.set_attribute("oploop.machine", str(data["machine"]))
        if self.capture and isinstance(data.get("output"), str):
            span.set_attribute("gen_ai.tool.call.result", _cut(data["output"]))
        if failed:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, _cut(str(data.get("output", "")))[:200]))
        span.end(end_time=_ns(ts))

    def _note(self, run: _Run, turn: int, data: dict[str, Any], ts: float) -> None:
        """Approvals and messages said: events on the run's span."""
        attrs = {f"oploop.{k}": str(v) for k, v in data.items()
                 if k in ("tool_use_id", "name", "decision", "by", "reason")}
        run.span.add_event("oploop.note", attrs, timestamp=_ns(ts))

    def _end(self, session: str, run: _Run, type_: str, data: dict[str, Any],
             ts: float) -> None:
        self._runs.pop(session, None)
        span = run.span
        span.set_attribute("oploop.outcome", type_)
        usage = data.get("usage") or {}
        if usage:
            span.set_attributes({
                "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0)
                + int(usage.get("cache_read_input_tokens") or 0)
                + int(usage.get("cache_creation_input_tokens") or 0),
                "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0)})
        if type_ == EventType.ERROR:
            error = str(data.get("error", "error"))
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, str(data.get("message", ""))[:200]))
            if run.chat is not None and not run.replied:  # the call itself failed
                run.chat.set_attribute("error.type", error)
                run.chat.set_status(Status(StatusCode.ERROR, str(data.get("message", ""))[:200]))
        elif type_ == EventType.CANCELLED:
            span.set_attribute("oploop.cancel.mode", str(data.get("mode", "")))
            if run.chat is not None and not run.replied:
                run.chat.set_attribute("oploop.cancelled", True)
        if self.capture and type_ == EventType.DONE and isinstance(data.get("text"), str):
            span.set_attribute("gen_ai.output.messages", _messages("assistant",
                                                                   _cut(data["text"])))
        self._close(run, ts)

    def _close(self, run: _Run, ts: float) -> None:
        for span in run.tools.values():  # (a terminal event ends every call first)
            span.end(end_time=_ns(ts))
        run.tools.clear()
        if run.chat is not None:
            self._end_chat(run, ts)
        run.span.end(end_time=_ns(ts))


def _messages(role: str, text: str) -> str:
    """A message list as the conventions record it (`gen_ai.input.messages`): JSON."""
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": _cut(text)}]}])


_HANDLERS = {
    EventType.TURN_START: RunTracer._turn_start,
    EventType.TOKEN: RunTracer._token,
    EventType.RETRY: RunTracer._retry,
    EventType.TURN_END: RunTracer._turn_end,
    EventType.TOOL_START: RunTracer._tool_start,
    EventType.TOOL_END: RunTracer._tool_end,
    EventType.APPROVAL_REQUESTED: RunTracer._note,
    EventType.APPROVAL_DECIDED: RunTracer._note,
    EventType.USER_MESSAGE: RunTracer._note,
}
