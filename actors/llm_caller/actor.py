"""The llm caller process: a worker of role `llm` serving `LlmJob`s."""

from __future__ import annotations

import logging

from actors.llm_caller.backend import AnthropicBackend, ModelBackend
from actors.llm_caller.batcher import DeltaBatcher
from actors.llm_caller.calls import call_with_retries
from actors.llm_caller.failures import CallFailed
from actors.llm_caller.policy import RetryPolicy
from actors.runtime import run_actor
from actors.worker import Worker
from bus.endpoints import Endpoints
from bus.messages import Body, Delta, Envelope, JobFailed, LlmJob, LlmResult, Retrying

log = logging.getLogger("oploop.llm")


class LlmCaller(Worker):
    """Calls the model for each job, with retries, and streams deltas back."""

    role = "llm"
    capacity = 256

    def __init__(
        self, endpoints: Endpoints, backend: ModelBackend, policy: RetryPolicy | None = None
    ) -> None:
        super().__init__(endpoints)
        self.backend = backend
        self.policy = policy or RetryPolicy.from_env()

    async def perform(self, env: Envelope) -> Body:
        """Answer one `LlmJob` with `LlmResult`, or `JobFailed` once retries are spent."""
        job = env.body
        if not isinstance(job, LlmJob):
            return JobFailed("bad_job", f"an llm caller does not run {job.KIND}")
        batcher = DeltaBatcher(lambda channel, text: self.progress(env, Delta(channel, text)))
        try:
            message = await self._call_with_retries(env, job, batcher)
        except CallFailed as exc:
            f = exc.failure
            return JobFailed(f.error, f.message, retryable=False, status=f.status)
        finally:
            batcher.flush()
        return LlmResult(message)

    async def _call_with_retries(
        self, env: Envelope, job: LlmJob, batcher: DeltaBatcher
    ) -> dict[str, object]:
        def on_retry(attempt: int, error: str, wait_s: float) -> None:
            batcher.discard()  # the failed attempt's text is void; viewers get RETRY
            self.progress(env, Retrying(attempt, error, wait_s))

        return await call_with_retries(
            self.backend, self.policy, job.request, stream=job.stream,
            deadline=env.deadline or None, on_delta=batcher.add, on_retry=on_retry,
        )

    async def aclose(self) -> None:
        """Close the model backend."""
        await self.backend.aclose()


async def _main() -> None:
    caller = LlmCaller(Endpoints.for_home(), AnthropicBackend())
    try:
        await caller.serve()
    finally:
        await caller.aclose()


def main() -> None:
    """Entry point of `python -m actors.llm_caller`."""
    run_actor("llm", _main)
