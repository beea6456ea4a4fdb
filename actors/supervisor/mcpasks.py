"""The supervisor's api requests about MCP servers beyond their tools: a prompt's
messages (`GetPrompt`), fetched by an executor of the agent's machine (`PromptJob`)."""

from __future__ import annotations

import asyncio
import time

from actors.machines import LOCAL
from actors.supervisor.jobstate import NoCapacity
from actors.supervisor.runhost import RunHost
from bus.mcpwire import GetPrompt
from bus.messages import Envelope, JobFailed, PromptJob, PromptResult

#: How long a prompt's fetch may take in all (the server's own `timeout_s` bounds it
#: in the executor; this covers an executor that never answers).
PROMPT_WAIT_S = 70.0


def serve_get_prompt(supervisor: RunHost, peer: bytes | None, env: Envelope,
                     body: GetPrompt) -> None:
    """`GetPrompt`: answered `PromptResult` or `ErrorReply`, from a task of its own."""
    supervisor.spawn(_get_prompt(supervisor, peer, env, body), "get-prompt")


async def _get_prompt(supervisor: RunHost, peer: bytes | None, env: Envelope,
                      body: GetPrompt) -> None:
    port = supervisor.api
    agent = supervisor.config.agent(body.agent)
    if agent is None:
        port.reply_error(peer, env.id, "unknown_agent", supervisor.no_agent(body.agent))
        return
    if not body.server or not body.prompt:
        port.reply_error(peer, env.id, "bad_request", "name a server and a prompt "
                                                      "(SERVER/PROMPT)")
        return
    dispatcher = supervisor.dispatcher
    try:
        job = dispatcher.submit("tool", PromptJob(body.server, body.prompt,
                                                  dict(body.arguments)),
                                sid="", deadline=time.time() + PROMPT_WAIT_S,
                                on_progress=lambda _env: None,
                                machine=agent.target_machine or LOCAL)
    except NoCapacity as exc:
        port.reply_error(peer, env.id, "busy", str(exc))
        return
    try:
        async with asyncio.timeout(PROMPT_WAIT_S):
            reply = await job.future
    except TimeoutError:
        dispatcher.abort(job)
        port.reply_error(peer, env.id, "timeout", f"no executor answered within "
                                                  f"{PROMPT_WAIT_S:g} s")
        return
    answer = reply.body
    if isinstance(answer, PromptResult):
        port.reply(Envelope(answer, id=env.id), peer)
    elif isinstance(answer, JobFailed):
        port.reply_error(peer, env.id, answer.error, answer.message)
    else:
        port.reply_error(peer, env.id, "internal", f"unexpected reply {reply.kind}")
