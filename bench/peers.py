"""The same workload on the frameworks users would otherwise pick, in process.

Each peer runs one agent session whose model is a local function (no HTTP): it
asks for one trivial tool call per turn — `read_file` of a small file, the very
call the oploop sessions make — for `turns` turns, then answers with text. The
figure is the time between consecutive model calls, i.e. what one turn costs
the framework (tool dispatch, history bookkeeping, validation).

pydantic-ai drives a `FunctionModel`; openai-agents a `Model` subclass whose
`get_response` returns Responses-API function calls (tracing off: it would
export to the network).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

#: Per-run result: seconds between consecutive model calls (one per turn), and wall time.
Timing = dict[str, Any]

PEERS = ("pydantic-ai", "openai-agents")


def _read(path: str) -> str:
    return Path(path).read_text()


def pydantic_ai_runner(target: str) -> Callable[[int], Awaitable[Timing]]:
    """A function running one pydantic-ai session of `turns` tool turns."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import UsageLimits

    async def run(turns: int) -> Timing:
        stamps: list[float] = []

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            stamps.append(time.perf_counter())
            if len(stamps) <= turns:
                call = ToolCallPart("read_file", {"path": target}, tool_call_id=f"c{len(stamps)}")
                return ModelResponse(parts=[call])
            return ModelResponse(parts=[TextPart("done")])

        agent = Agent(FunctionModel(model))

        @agent.tool_plain
        def read_file(path: str) -> str:
            """Read a text file."""
            return _read(path)

        started = time.perf_counter()
        await agent.run("read the file, again and again",
                        usage_limits=UsageLimits(request_limit=turns + 2))
        return _timing(stamps, started)

    return run


def openai_agents_runner(target: str) -> Callable[[int], Awaitable[Timing]]:
    """A function running one openai-agents session of `turns` tool turns."""
    from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    @function_tool
    def read_file(path: str) -> str:
        """Read a text file."""
        return _read(path)

    class FakeModel(Model):
        """Answers every call from a counter: `turns` tool calls, then text."""

        def __init__(self, turns: int, stamps: list[float]) -> None:
            self.turns = turns
            self.stamps = stamps

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.stamps.append(time.perf_counter())
            n = len(self.stamps)
            if n <= self.turns:
                item: Any = ResponseFunctionToolCall(
                    type="function_call", call_id=f"c{n}", name="read_file",
                    arguments=f'{{"path": "{target}"}}', id=f"fc{n}", status="completed",
                )
            else:
                item = ResponseOutputMessage(
                    type="message", id=f"m{n}", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
                )
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark does not stream")

    async def run(turns: int) -> Timing:
        stamps: list[float] = []
        agent = Agent(name="operator", instructions="Be brief.", tools=[read_file],
                      model=FakeModel(turns, stamps))
        started = time.perf_counter()
        await Runner.run(agent, "read the file, again and again", max_turns=turns + 2)
        return _timing(stamps, started)

    return run


def _timing(stamps: list[float], started: float) -> Timing:
    ended = time.perf_counter()
    steps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"turn_s": steps, "wall_s": ended - started}


def runner(peer: str, target: str) -> Callable[[int], Awaitable[Timing]]:
    """The session runner of `peer` (raises ImportError when it is not installed)."""
    if peer == "pydantic-ai":
        return pydantic_ai_runner(target)
    if peer == "openai-agents":
        return openai_agents_runner(target)
    raise ValueError(f"unknown peer {peer!r}")


async def concurrent(peer: str, target: str, sessions: int, turns: int) -> float:
    """Turns per second with `sessions` runs of `turns` turns under `asyncio.gather`."""
    run = runner(peer, target)
    started = time.perf_counter()
    await asyncio.gather(*(run(turns) for _ in range(sessions)))
    return sessions * turns / (time.perf_counter() - started)


# --- over HTTP: the same workload against a local Messages-API server ---------------

#: A session runner over HTTP, and the function that closes its HTTP client.
HttpRunner = tuple[Callable[[int], Awaitable[Timing]], Callable[[], Awaitable[None]]]

#: The model name sent over HTTP (the offline model answers any).
HTTP_MODEL = "claude-sonnet-4-5"


def _http_timing(stamps: list[float], started: float) -> Timing:
    """Over HTTP the model is not ours to time: a turn is from one `read_file` call to
    the next (model call, parse, tool dispatch, history carried), which is what the
    supervisor's TURN_START to TURN_START measures for oploop."""
    return _timing(stamps, started)


def pydantic_ai_http_runner(base_url: str, target: str) -> HttpRunner:
    """pydantic-ai's Anthropic model, through the `anthropic` SDK, against `base_url`.

    The prompt's `#tN` tag makes the server play N reads and then a text answer;
    `metadata.user_id` keeps each run's place in that script apart. Call it inside the
    event loop that runs it; the second function closes the SDK's client."""
    from anthropic import AsyncAnthropic
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.usage import UsageLimits

    client = AsyncAnthropic(base_url=base_url, api_key="offline", max_retries=0)
    model = AnthropicModel(HTTP_MODEL, provider=AnthropicProvider(anthropic_client=client))
    counter = iter(range(1 << 30))

    async def run(turns: int) -> Timing:
        stamps: list[float] = []
        agent = Agent(model)

        @agent.tool_plain
        def read_file(path: str) -> str:
            """Read a text file."""
            stamps.append(time.perf_counter())
            return _read(path)

        settings = AnthropicModelSettings(
            anthropic_metadata={"user_id": f"pydantic-ai-{os.getpid()}-{next(counter)}"},
            max_tokens=1024)
        started = time.perf_counter()
        await agent.run(f"#t{turns} read the file, again and again", model_settings=settings,
                        usage_limits=UsageLimits(request_limit=turns + 2))
        if len(stamps) != turns:
            raise RuntimeError(f"pydantic-ai made {len(stamps)} tool calls, not {turns}")
        return _http_timing(stamps, started)

    return run, client.close


def openai_agents_http_runner(base_url: str, target: str) -> HttpRunner:
    """openai-agents through its LiteLLM extension (`LitellmModel`) against `base_url`.

    Not through the `anthropic` SDK: openai-agents has no Anthropic model of its own, and
    its other route (any-llm, which does use the SDK) pins `anthropic<1` while pydantic-ai
    needs `>=1.15`. LiteLLM speaks the Messages API with its own HTTP client; the
    OpenAI-style `user` becomes the request's `metadata.user_id`."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.extensions.models.litellm_model import LitellmModel

    set_tracing_disabled(True)
    model = LitellmModel(f"anthropic/{HTTP_MODEL}", base_url=base_url, api_key="offline")
    counter = iter(range(1 << 30))

    async def run(turns: int) -> Timing:
        stamps: list[float] = []

        @function_tool
        def read_file(path: str) -> str:
            """Read a text file."""
            stamps.append(time.perf_counter())
            return _read(path)

        user = f"openai-agents-{os.getpid()}-{next(counter)}"
        agent = Agent(name="operator", instructions="Be brief.", tools=[read_file], model=model,
                      model_settings=ModelSettings(max_tokens=1024, extra_args={"user": user}))
        started = time.perf_counter()
        await Runner.run(agent, f"#t{turns} read the file, again and again",
                         max_turns=turns + 2)
        if len(stamps) != turns:
            raise RuntimeError(f"openai-agents made {len(stamps)} tool calls, not {turns}")
        return _http_timing(stamps, started)

    async def aclose() -> None:
        return None  # LiteLLM keeps its clients per process

    return run, aclose


#: Peers that call the Messages-API server: pydantic-ai through the `anthropic` SDK,
#: openai-agents through LiteLLM (see `openai_agents_http_runner`).
HTTP_PEERS = ("pydantic-ai", "openai-agents")


def http_runner(peer: str, base_url: str, target: str) -> HttpRunner:
    """The over-HTTP session runner of `peer` and its closer (ImportError when it is not
    installed)."""
    if peer == "pydantic-ai":
        return pydantic_ai_http_runner(base_url, target)
    if peer == "openai-agents":
        return openai_agents_http_runner(base_url, target)
    raise ValueError(f"no over-HTTP runner for {peer!r}")
