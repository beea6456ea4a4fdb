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
                    arguments='{"path": "%s"}' % target, id=f"fc{n}", status="completed",
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
