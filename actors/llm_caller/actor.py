"""The llm caller process: a worker of role `llm` serving `LlmJob`s."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from actors.llm_caller.backend import AnthropicBackend, ModelBackend
from actors.llm_caller.batcher import DeltaBatcher
from actors.llm_caller.calls import call_with_retries
from actors.llm_caller.failures import CallFailed
from actors.llm_caller.histories import HISTORY_MISS, BadHistory, HistoryCache, HistoryMiss
from actors.llm_caller.policy import RetryPolicy
from actors.llm_caller.scripted import BACKEND_ENV, ScriptedBackend
from actors.offline_model.scenario import ScenarioError
from actors.runtime import run_actor
from actors.worker import Worker
from bus.codec import MAX_FRAME_BYTES
from bus.endpoints import Endpoints
from bus.messages import Body, Delta, Envelope, JobFailed, LlmJob, LlmResult, Retrying

log = logging.getLogger("oploop.llm")

#: Half a frame: far above any real model reply (a model's output is well under 1 MB).
MAX_MODEL_REPLY_BYTES = MAX_FRAME_BYTES // 2


class LlmCaller(Worker):
    """Calls the model for each job, with retries, and streams deltas back."""

    role = "llm"
    capacity = 256
    #: A model reply larger than this fails its call ("oversize"), so that it never
    #: enters a history: with what follows it, it would not fit the session's next
    #: request in one frame, and every later call of the session would fail.
    max_reply_bytes = MAX_MODEL_REPLY_BYTES

    def __init__(
        self, endpoints: Endpoints, backend: ModelBackend, policy: RetryPolicy | None = None
    ) -> None:
        super().__init__(endpoints)
        self.backend = backend
        self.policy = policy or RetryPolicy.from_env()
        self.histories = HistoryCache()

    async def perform(self, env: Envelope) -> Body:
        """Answer one `LlmJob` with `LlmResult`, or `JobFailed` once retries are spent."""
        job = env.body
        if not isinstance(job, LlmJob):
            return JobFailed("bad_job", f"an llm caller does not run {job.KIND}")
        try:
            request = self.histories.resolve(job)
        except HistoryMiss as exc:
            return JobFailed(HISTORY_MISS, str(exc), retryable=True)
        except BadHistory as exc:
            return JobFailed("bad_job", str(exc))
        batcher = DeltaBatcher(lambda channel, text: self.progress(env, Delta(channel, text)))
        try:
            message = await self._call_with_retries(env, job, request, batcher)
        except CallFailed as exc:
            f = exc.failure
            return JobFailed(f.error, f.message, retryable=False, status=f.status)
        finally:
            batcher.flush()
        return LlmResult(message)

    async def _call_with_retries(
        self, env: Envelope, job: LlmJob, request: dict[str, Any], batcher: DeltaBatcher
    ) -> dict[str, object]:
        def on_retry(attempt: int, error: str, wait_s: float) -> None:
            batcher.discard()  # the failed attempt's text is void; viewers get RETRY
            self.progress(env, Retrying(attempt, error, wait_s))

        return await call_with_retries(
            self.backend, self.policy, request, stream=job.stream,
            deadline=env.deadline or None, on_delta=batcher.add, on_retry=on_retry,
        )

    async def aclose(self) -> None:
        """Close the model backend."""
        await self.backend.aclose()


BACKENDS = ("anthropic", "scripted")


class UnknownBackend(ValueError):
    """`OPLOOP_LLM_BACKEND` names no backend."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{BACKEND_ENV}={name!r}: expected one of {', '.join(BACKENDS)}")
        self.name = name


def backend_from_env(env: Mapping[str, str] = os.environ) -> ModelBackend:
    """The backend `OPLOOP_LLM_BACKEND` selects: `anthropic` (default) or `scripted`."""
    name = env.get(BACKEND_ENV) or "anthropic"
    if name == "anthropic":
        return AnthropicBackend()
    if name == "scripted":
        return ScriptedBackend.from_env(env)
    raise UnknownBackend(name)


async def _main() -> None:
    backend = backend_from_env()
    caller = LlmCaller(Endpoints.from_env(), backend)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(caller.serve(), name="llm-caller")
            if isinstance(backend, AnthropicBackend):
                # Import the SDK once the caller serves, so start-up does not wait for it.
                group.create_task(backend.preload(), name="sdk-preload")
    finally:
        await caller.aclose()


def main() -> None:
    """Entry point of `python -m actors.llm_caller`."""
    try:
        run_actor("llm", _main)
    except (UnknownBackend, ScenarioError) as exc:
        print(f"oploop llm caller: {exc}", file=sys.stderr)
        sys.exit(2)
