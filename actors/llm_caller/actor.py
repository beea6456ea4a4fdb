"""The llm caller process: a worker of role `llm` serving `LlmJob`s."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from typing import Any

from actors.batching import FLUSH_INTERVAL_S, DeltaBatcher
from actors.llm_caller.backend import AnthropicBackend, ModelBackend
from actors.llm_caller.calls import call_with_retries
from actors.llm_caller.failures import CallFailed
from actors.llm_caller.histories import HISTORY_MISS, BadHistory, HistoryCache, HistoryMiss
from actors.llm_caller.policy import RetryPolicy
from actors.runtime import run_actor
from actors.settings import Settings
from actors.worker import Worker
from bus.codec import MAX_FRAME_BYTES
from bus.endpoints import Endpoints
from bus.messages import Body, Delta, Envelope, JobFailed, LlmJob, LlmResult, Retrying

log = logging.getLogger("oploop.llm")

#: Half a frame: far above any real model reply (a model's output is well under 1 MB).
MAX_MODEL_REPLY_BYTES = MAX_FRAME_BYTES // 2
#: A token count's time limit (it only refines an estimate the loop already has).
COUNT_TIMEOUT_S = 10.0


class LlmCaller(Worker):
    """Calls the model for each job, with retries, and streams deltas back."""

    role = "llm"
    capacity = 256
    #: A model reply larger than this fails its call ("oversize"), so that it never
    #: enters a history: with what follows it, it would not fit the session's next
    #: request in one frame, and every later call of the session would fail.
    max_reply_bytes = MAX_MODEL_REPLY_BYTES

    def __init__(
        self, endpoints: Endpoints, backend: ModelBackend, policy: RetryPolicy | None = None,
        batch_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        super().__init__(endpoints)
        self.backend = backend
        self.policy = policy or RetryPolicy()
        #: How long streamed text is batched (`OPLOOP_TOKEN_BATCH_MS`).
        self.batch_s = batch_s
        self.histories = HistoryCache()

    def forget_sessions(self, sids: list[str]) -> None:
        """Drop the histories of `sids` (the supervisor holds those sessions no more: their
        next run sends in full), and what the backend keeps of their messages."""
        self.backend.forget(self.histories.forget(sids))

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
        if job.count:
            return await self._count(request)
        if env.traceparent:  # the run's trace continues at the model's server (W3C header)
            request = {**request, "extra_headers": {"traceparent": env.traceparent}}
        batcher = DeltaBatcher(lambda channel, text: self.progress(env, Delta(channel, text)),
                               self.batch_s)
        policy = self.policy
        if job.attempts > 0:  # the intent router's call: fewer attempts than a turn's
            policy = dataclasses.replace(policy, attempts=job.attempts)
        try:
            message = await self._call_with_retries(env, job, request, batcher, policy)
        except CallFailed as exc:
            f = exc.failure
            return JobFailed(f.error, exc.message, retryable=False, status=f.status)
        finally:
            batcher.flush()
        return LlmResult(message)

    async def _count(self, request: dict[str, Any]) -> Body:
        """A `count` job: the request's input tokens, or why they cannot be had (a
        backend without counting, the server refusing): one attempt, no retries (the
        caller falls back to its estimate)."""
        count = getattr(self.backend, "count_tokens", None)  # (optional: not every backend)
        if count is None:
            return JobFailed("not_supported", "this model backend counts no tokens")
        preload = getattr(self.backend, "preload", None)
        try:
            if preload is not None:  # the SDK's import at a first call is not the count's time
                await preload()
            async with asyncio.timeout(COUNT_TIMEOUT_S):
                tokens = await count(request, timeout_s=COUNT_TIMEOUT_S)
        except Exception as exc:  # the job's edge: any failure is the answer
            return JobFailed("count_failed", f"{type(exc).__name__}: {exc}"[:300])
        return LlmResult({"role": "assistant", "content": [],
                          "usage": {"input_tokens": tokens}})

    async def _call_with_retries(
        self, env: Envelope, job: LlmJob, request: dict[str, Any], batcher: DeltaBatcher,
        policy: RetryPolicy,
    ) -> dict[str, object]:
        def on_retry(attempt: int, error: str, wait_s: float, stall_bound_s: float) -> None:
            batcher.discard()  # the failed attempt's text is void; viewers get RETRY
            self.progress(env, Retrying(attempt, error, wait_s, stall_bound_s))

        return await call_with_retries(
            self.backend, policy, request, stream=job.stream,
            deadline=env.deadline or None, on_delta=batcher.add, on_retry=on_retry,
            total_s=job.timeout_s or None,
        )

    async def aclose(self) -> None:
        """Close the model backend."""
        await self.backend.aclose()


class BadScript(ValueError):
    """The scripted backend's scenario (`OPLOOP_LLM_SCRIPT`) cannot be played."""


def backend_for(settings: Settings) -> ModelBackend:
    """The backend `OPLOOP_LLM_BACKEND` selects: `anthropic` (default) or `scripted`
    (playing `OPLOOP_LLM_SCRIPT`; `load_settings` has checked the name)."""
    if settings.llm_backend == "scripted":
        # Imported here only: a caller on the SDK has no use for the scripted model and
        # the offline model's scenario code it plays (resident in every caller otherwise).
        from actors.llm_caller.scripted import ScriptedBackend
        from actors.offline_model.scenario import ScenarioError

        try:
            return ScriptedBackend.from_script(settings.llm_script)
        except ScenarioError as exc:
            raise BadScript(str(exc)) from exc
    return AnthropicBackend(settings.model.api_key, settings.model.base_url)


async def _main(settings: Settings) -> None:
    backend = backend_for(settings)
    caller = LlmCaller(settings.endpoints(), backend, RetryPolicy.from_settings(settings.retry),
                       settings.token_batch_s)
    caller.machine = settings.machine
    # The SDK is imported at the first call (`AnthropicBackend.sdk_client`), not at
    # start: ~60 MiB resident that an idle caller, or one never called, has no use for.
    try:
        await caller.serve()
    finally:
        await caller.aclose()


def main() -> None:
    """Entry point of `python -m actors.llm_caller`."""
    try:
        run_actor("llm", _main)
    except BadScript as exc:
        print(f"oploop llm caller: {exc}", file=sys.stderr)
        sys.exit(2)
