"""MCP servers' model calls (sampling), in the supervisor: approval, the call, its event.

An executor's `Sample` for a tool job in flight (a server with `sampling = true`) is
judged by the agent's permission rules as the pseudo-tool `mcp__NAME__sampling`
(`"mcp__x__*" = "deny"` denies it too); with no rule naming it, it is **ask**: the
session's operators are asked (`ELICITATION_REQUESTED` with an empty form and
`sampling {messages, max_tokens}`; `oploop answer S ID` approves, `--decline`
refuses; unanswered within the call's time, refused). Approved, the request is made
with the session's model (the agent's, its `max_tokens` at most) through the llm
callers like a turn's call, and the reply goes back to the server
(`SampleAnswer`). A `SAMPLING {id, server, call_id, model, stop_reason, usage}`
event says it; its usage counts with the run's (`actors.usage.CLOSES_CALL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Protocol

from actors.bounds import cut_line
from actors.core import inputs
from actors.core.loopio import ModelError
from actors.permissions import named_rule
from actors.usage import of_reply
from bus.errors import BusError
from bus.mcpwire import Sample, SampleAnswer
from bus.messages import Envelope, JobFailed, LlmJob, LlmResult

if TYPE_CHECKING:
    from actors.config import Config
    from actors.core.session import Session
    from actors.supervisor.dispatch import Dispatcher
    from actors.supervisor.elicits import Elicits

#: Shown of the request's last message when asking for approval.
SHOWN_CHARS = 500


def pseudo_tool(server: str) -> str:
    """The name permission rules give a server's sampling."""
    return f"mcp__{server}__sampling"


class SampleIO(Protocol):
    """What serving a sample needs of the supervisor's worker I/O (`WorkerIO`)."""

    config: Config
    dispatcher: Dispatcher
    #: Where a sample's approval is asked (as an elicitation's confirmation).
    elicits: Elicits

    async def sample(self, session: Session, request: dict[str, Any],
                     wait_s: float) -> dict[str, Any]:
        """A model call an MCP server asked for, priced; raises `ModelError`."""
        ...


class Samples:
    """The model calls MCP servers ask for, each served by a task of its own."""

    def __init__(self, io: SampleIO) -> None:
        self.io = io
        self._tasks: set[asyncio.Task[None]] = set()

    def requested(self, session: Session, call_id: str, env: Envelope) -> None:
        """An executor's `Sample` for the job of `call_id`."""
        task = asyncio.get_running_loop().create_task(self._serve(session, call_id, env))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, session: Session, call_id: str, env: Envelope) -> None:
        body = env.body
        assert isinstance(body, Sample)
        try:
            message, error = await self._sample(session, call_id, env, body)
        except Exception as exc:  # never the supervisor's: the server is told
            message, error = {}, f"the model call failed: {type(exc).__name__}: {exc}"
        self._answer(env.job, SampleAnswer(body.id, message, error))

    async def _sample(self, session: Session, call_id: str, env: Envelope,
                      body: Sample) -> tuple[dict[str, Any], str]:
        started = time.monotonic()
        name = pseudo_tool(body.server)
        rule = named_rule(session.agent.permissions, name) or "ask"
        if rule == "deny":
            return {}, f"denied by the permission rules ({name} = \"deny\")"
        if rule == "ask":
            action = await self._approval(session, call_id, env, body)
            if action != "accept":
                return {}, f"not approved ({action})"
        request = self._request(session, body.request)
        wait_s = body.wait_s - (time.monotonic() - started)
        if wait_s <= 0:
            return {}, "no time left for the model call"
        try:
            reply = await self.io.sample(session, request, wait_s)
        except ModelError as exc:
            return {}, f"the model call failed: {exc.error}: {exc.message}"
        driver = session.driver
        if driver is not None and not session.run_over:
            driver.feed(inputs.Sampled(
                {"id": body.id, "server": body.server, "call_id": call_id,
                 "model": reply.get("model", ""), "stop_reason": reply.get("stop_reason")},
                of_reply(reply)))
        return reply, ""

    async def _approval(self, session: Session, call_id: str, env: Envelope,
                        body: Sample) -> str:
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def on_answer(action: str) -> None:
            if not answered.done():
                answered.set_result(action)

        messages = body.request.get("messages") or []
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        text = " ".join(b.get("text", "") for b in last.get("content") or []
                        if isinstance(b, dict))
        max_tokens = body.request.get("max_tokens")
        message = (f"MCP server {body.server} asks to use the model ({len(messages)} "
                   f"message(s), up to {max_tokens} tokens): {cut_line(text, SHOWN_CHARS)!r}. "
                   f"Accept to let it (oploop answer SESSION ID), or --decline.")
        self.io.elicits.confirm(session, call_id, env, body.id, message, body.wait_s,
                                on_answer, {"server": body.server, "sampling": {
                                    "messages": len(messages), "max_tokens": max_tokens,
                                    "system": cut_line(str(body.request.get("system", "")),
                                                       SHOWN_CHARS)}})
        return await answered

    def _request(self, session: Session, asked: dict[str, Any]) -> dict[str, Any]:
        """The server's request made the session's: its model, its `max_tokens` at most."""
        agent = session.agent
        request = {k: v for k, v in asked.items()
                   if k in ("system", "messages", "temperature", "stop_sequences")}
        want = asked.get("max_tokens")
        limit = agent.max_tokens
        request["max_tokens"] = min(want, limit) if isinstance(want, int) and want > 0 \
            else limit
        request["model"] = agent.model_id(self.io.config.aliases)
        request["metadata"] = {"user_id": session.id}
        return request

    def _answer(self, job_id: str, answer: SampleAnswer) -> None:
        dispatcher = self.io.dispatcher
        job = dispatcher.jobs.get(job_id)
        if job is None or job.worker is None:
            return  # the call is over: nobody waits for it
        with contextlib.suppress(BusError):
            dispatcher.work.send(Envelope(answer, job=job_id, sid=job.env.sid), job.worker)


def reply_of(reply: Envelope) -> dict[str, Any]:
    """An llm caller's answer as a message; `ModelError` if the call failed."""
    body = reply.body
    if isinstance(body, LlmResult):
        return dict(body.message)
    if isinstance(body, JobFailed):
        raise ModelError(body.error, body.message, body.status)
    raise ModelError("internal", f"unexpected reply {reply.kind}")


def llm_job(request: dict[str, Any], wait_s: float) -> LlmJob:
    """The llm caller's job for a sampling request (no streaming: nobody reads it live)."""
    return LlmJob(request, stream=False, timeout_s=wait_s)
