"""`Runner[Deps, Output]`: the agent loop embedded in a program, typed.

The same run the supervisor drives (`actors.core.machine`, carried out by
`actors.core.driver`), in this process: the model through the same
backend and retry policy as the llm caller, tools from a `Catalogue` called
directly, so that Python tools can take the program's own objects (`deps`,
reaching them as `ctx.deps`). When an output type is given (a dataclass, a
TypedDict — `typing_extensions.TypedDict` before Python 3.12 — or anything
pydantic validates), the final answer is parsed into it; a parse failure gets
one repair turn, then the run fails with `RunFailed("output_invalid")`::

    @dataclass
    class Answer:
        city: str
        temp_c: float

    async with Runner(output_type=Answer, tools=[lookup]) as runner:
        result = await runner.run("weather in Oslo?", deps=db)
        result.output.temp_c
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import pydantic

from actors.config import DEFAULT_AGENT, Agent, Config
from actors.core.driver import run_session
from actors.core.history import Message
from actors.core.loopio import ModelError, Progress
from actors.core.machine import INTERRUPTED, Delta, Retry
from actors.core.session import Session
from actors.core.turn import ToolCall, ToolOutcome
from actors.llm_caller.backend import AnthropicBackend, ModelBackend
from actors.llm_caller.calls import call_with_retries
from actors.llm_caller.failures import CallFailed
from actors.llm_caller.policy import RetryPolicy
from actors.llm_caller.scripted import ScriptedBackend
from actors.settings import Settings, load_settings, model_choice
from actors.tools import BUILTIN, Catalogue, Tool, ToolContext, invoke
from actors.usage import ZERO, Usage, priced
from bus.vocab import EventType

log = logging.getLogger("oploop.runner")

Deps = TypeVar("Deps")
Output = TypeVar("Output")

OnEvent = Callable[[dict[str, Any]], None]
#: Decides a call waiting for approval (`APPROVAL_REQUESTED`'s data: call_id, tool,
#: input, rule, expires_at): True approves, False denies, a string denies saying why;
#: it may be a coroutine function.
OnApproval = Callable[[dict[str, Any]], "bool | str | Awaitable[bool | str]"]

#: The reason a call needing approval is denied when the Runner has no `on_approval`.
NO_APPROVER = "denied: this runner has no on_approval callback to ask"

#: Longest JSON answer searched for (characters): keeps a runaway reply cheap.
MAX_OUTPUT_CHARS = 1_000_000


class RunFailed(Exception):
    """A run ended with `ERROR` or `CANCELLED`; `events` is the whole run, `usage`
    what it used until then."""

    def __init__(self, error: str, message: str, events: list[dict[str, Any]]) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message
        self.events = events
        self.usage = Usage.from_dict(events[-1]["data"].get("usage")) if events else ZERO


@dataclasses.dataclass(frozen=True, slots=True)
class RunOutput(Generic[Output]):
    """A finished run: the typed output, the final text, how it ended, and its
    tokens and cost (`usage.cost` None: the model has no price in `[prices]`)."""

    output: Output
    text: str
    stop: str
    turns: int
    session: Session
    events: list[dict[str, Any]]
    usage: Usage = ZERO


class OutputParser(Generic[Output]):
    """Parses a final answer into `output_type` (JSON, validated by pydantic)."""

    def __init__(self, output_type: type[Output]) -> None:
        self.adapter: pydantic.TypeAdapter[Output] = pydantic.TypeAdapter(output_type)
        self.schema = self.adapter.json_schema()

    def instructions(self) -> str:
        """What the system prompt tells the model about the answer's shape."""
        return ("When you give your final answer, reply with only a JSON value that matches "
                f"this JSON schema, with no text around it:\n{json.dumps(self.schema)}")

    def parse(self, text: str) -> Output:
        """The answer as `Output`; raises ValueError saying what is wrong."""
        raw = _json_part(text[:MAX_OUTPUT_CHARS])
        try:
            output: Output = self.adapter.validate_json(raw)
            return output
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            raise ValueError(problems) from exc

    def problem(self, text: str) -> str | None:
        """None if `text` parses, else why not (the loop's output check)."""
        try:
            self.parse(text)
        except ValueError as exc:
            return str(exc)
        return None


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _json_part(text: str) -> str:
    """The JSON of an answer: a fenced block's content, else the outermost object."""
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if 0 <= start < end else text.strip()


def default_backend(settings: Settings, environ: Mapping[str, str] | None = None) -> ModelBackend:
    """The model a `Runner` calls when given none, as a host chooses it: the scripted
    backend with `OPLOOP_LLM_BACKEND=scripted`; the real API with `ANTHROPIC_API_KEY`
    or `ANTHROPIC_BASE_URL`; else the offline model's rules, in this process (said
    once on stderr)."""
    choice = settings.model if environ is None else model_choice(settings.llm_backend, environ)
    if choice.kind == "scripted":
        return ScriptedBackend.from_script(settings.llm_script)
    if choice.kind == "api":
        return AnthropicBackend(choice.api_key, choice.base_url)
    print("oploop: no ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL set: the Runner uses the "
          "offline model (canned answers, no network)", file=sys.stderr)
    return ScriptedBackend()


class Runner(Generic[Deps, Output]):
    """Runs the agent loop in this process, typed by its dependencies and output."""

    def __init__(
        self,
        agent: Agent = DEFAULT_AGENT,
        *,
        output_type: type[Output] | None = None,
        tools: Iterable[Tool] = (),
        builtin: bool = True,
        config: Config | None = None,
        backend: ModelBackend | None = None,
        policy: RetryPolicy | None = None,
        on_event: OnEvent | None = None,
        on_approval: OnApproval | None = None,
        settings: Settings | None = None,
    ) -> None:
        # Read only when something is left to the settings (`oploop.toml`, OPLOOP_RETRY_*,
        # OPLOOP_LLM_BACKEND).
        if config is None or policy is None or backend is None:
            settings = settings or load_settings()
            config = config or settings.config
            policy = policy or RetryPolicy.from_settings(settings.retry)
            backend = backend or default_backend(settings)
        self.config = config
        self.parser = OutputParser(output_type) if output_type is not None else None
        if self.parser is not None:
            agent = dataclasses.replace(
                agent, system=f"{agent.system}\n\n{self.parser.instructions()}"
            )
        self.agent = agent
        self.catalogue = Catalogue([*(BUILTIN.values() if builtin else ()), *tools])
        assert backend is not None
        self.backend: ModelBackend = backend
        self.policy = policy
        self.on_event = on_event
        #: Asked for each call an `ask` permission rule of the agent holds back; none:
        #: every such call is denied.
        self.on_approval = on_approval
        self._sessions = 0

    async def run(
        self,
        prompt: str,
        *,
        deps: Deps,
        session: Session | None = None,
        cwd: str | Path | None = None,
        max_turns: int = 0,
        deadline_s: float = 0.0,
    ) -> RunOutput[Output]:
        """One run on `prompt` (a follow-up when `session` is a previous run's)."""
        if session is None:
            self._sessions += 1
            session = Session(f"local-{self._sessions}", self.agent, str(cwd or Path.cwd()))
        if self.parser is not None:
            session.output_check = self.parser.problem
        io = _LocalIO(self, deps)
        await run_session(session, io, prompt, max_turns, deadline_s)
        end = io.events[-1]
        data = end["data"]
        if end["type"] != EventType.DONE:
            error = data.get("error") or f"cancelled ({data.get('mode')})"
            message = data.get("message") or data.get("reason", "")
            if error in ("connection", "timeout", "auth", "authentication"):
                message += (" (the model at ANTHROPIC_BASE_URL or api.anthropic.com: check the "
                            "key and the network; without ANTHROPIC_API_KEY and "
                            "ANTHROPIC_BASE_URL the runner uses the offline model)")
            raise RunFailed(error, message, io.events)
        text = data["text"]
        output: Any = self.parser.parse(text) if self.parser is not None else text
        return RunOutput(output, text, data["stop"], data["turns"], session, io.events,
                         Usage.from_dict(data.get("usage")))

    async def aclose(self) -> None:
        """Close the model backend's connections."""
        await self.backend.aclose()

    async def __aenter__(self) -> Runner[Deps, Output]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _LocalIO(Generic[Deps]):
    """`LoopIO` in this process: the backend for the model, the catalogue for tools."""

    def __init__(self, runner: Runner[Deps, Any], deps: Deps) -> None:
        self.runner = runner
        self.config = runner.config
        self.deps = deps
        self.events: list[dict[str, Any]] = []
        self._deciding: set[asyncio.Task[None]] = set()

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        ts = time.time()
        event = {"seq": session.stamp(type_, data, ts), "session": session.id, "type": type_,
                 "turn": turn, "ts": ts, "data": data}
        self.events.append(event)
        if self.runner.on_event is not None:
            self.runner.on_event(event)
        if type_ == EventType.APPROVAL_REQUESTED:  # decided after this step, never inside it
            task = asyncio.get_running_loop().create_task(self._approve(session, data))
            self._deciding.add(task)
            task.add_done_callback(self._deciding.discard)

    async def _approve(self, session: Session, data: dict[str, Any]) -> None:
        """Ask `on_approval` about one call (deny without one) and feed the decision."""
        answer: bool | str = NO_APPROVER
        callback = self.runner.on_approval
        if callback is not None:
            try:
                result = callback(dict(data))
                answer = await result if inspect.isawaitable(result) else result
            except Exception as exc:  # the program's callback failing denies, says why
                answer = f"denied: on_approval failed: {type(exc).__name__}: {exc}"
        driver = session.driver
        if driver is None:
            return
        if answer is True:
            driver.decide(data["call_id"], "approve", "on_approval")
        else:
            why = answer if isinstance(answer, str) and answer else "denied by on_approval"
            driver.decide(data["call_id"], "deny", "on_approval", why)

    def tool_machine(self, session: Session, tool: str = "") -> str:
        """Not said: the tools run in this process."""
        return ""

    def tool_catalogue(self, machine: str) -> list[dict[str, Any]]:
        return [spec.to_wire() for spec in self.runner.catalogue.specs()]

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Progress, route: bool = False,
                         compact: bool = False) -> Message:
        # The router's call is the loop's business (its ROUTE says it all): neither its
        # text nor its retries are events, as over the bus; nor a compaction's summary.
        quiet = route or compact

        def on_delta(channel: str, text: str) -> None:
            if not quiet:
                progress(Delta(text, channel))

        def on_retry(attempt: int, error: str, wait_s: float, stall_bound_s: float) -> None:
            if not quiet:
                progress(Retry(attempt, error, wait_s, stall_bound_s))

        runner = self.runner
        policy, total_s = runner.policy, None
        if route:  # the intent router fails fast (`[router] attempts`, `timeout_s`)
            router = self.config.router
            policy = dataclasses.replace(policy, attempts=router.attempts)
            total_s = router.timeout_s
        try:
            reply = await call_with_retries(
                runner.backend, policy, request, stream=stream,
                deadline=session.deadline or None, on_delta=on_delta, on_retry=on_retry,
                total_s=total_s,
            )
            return priced(reply, self.config.prices)
        except CallFailed as exc:
            f = exc.failure
            raise ModelError(f.error, exc.message, f.status) from exc

    async def count_tokens(self, session: Session, request: dict[str, Any]) -> int | None:
        """The request's tokens as the backend's server counts them, or None (a backend
        that cannot count, or a failure: the loop keeps its estimate)."""
        count = getattr(self.runner.backend, "count_tokens", None)  # (optional)
        if count is None:
            return None
        try:
            return int(await count(request, timeout_s=10.0))
        except Exception:  # only a refinement of an estimate: never the run's failure
            log.info("count_tokens failed", exc_info=True)
            return None

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        deadline = time.time() + timeout_s
        if session.deadline:
            deadline = min(deadline, session.deadline)
        ctx = ToolContext(cwd=Path(session.cwd), deadline=deadline, deps=self.deps)
        started = time.perf_counter()
        outcome = await invoke(self.runner.catalogue, call.name, call.input, ctx)
        elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        return ToolOutcome(outcome.output, outcome.is_error, elapsed_ms)

    async def adopt_tool(self, session: Session, call: ToolCall, *,
                         timeout_s: float) -> ToolOutcome:
        """In one process nothing outlives a restart (a `Runner` never resumes with
        `adopt`): the call was interrupted."""
        return ToolOutcome(INTERRUPTED, True)
