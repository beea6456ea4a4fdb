"""The in-process scripted model: a `ModelBackend` that answers without HTTP.

It plays a scenario in the offline model's file format (`actors.offline_model`:
scripted replies, or ``"rules"`` turns answered by its rule engine) and, past
the scenario's end, lets the rule engine answer. It exists so that a benchmark
measures oploop's own cost per turn, not an HTTP server's, and so that a host
can run fully offline without the offline model process.

The llm caller is stateless and interchangeable, so the scenario's cursor is
not kept here: the turn a request stands at is read from the request itself —
the number of assistant messages since the run's prompt (the last user message
that carries text). The same request always gets the same reply, which keeps a
re-issued call (after a caller died) idempotent, whichever caller serves it.

Faults (HTTP statuses, dropped or stalled streams) need a real transport and
are refused at load: play those scenarios with the offline model.

Selected by ``OPLOOP_LLM_BACKEND=scripted``; the scenario file is
``OPLOOP_LLM_SCRIPT`` (none: the rule engine answers every turn).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.digests import blake2s
from actors.llm_caller.backend import OnDelta
from actors.llm_caller.stalls import StreamBounds
from actors.offline_model.plan import scripted_reply
from actors.offline_model.scenario import (
    Scenario,
    ScenarioError,
    Turn,
    load_scenario,
    session_of,
)
from actors.offline_model.wire import Reply, text_chunks


class ScriptedBackend:
    """Answers Messages-API requests from a scenario, in process, statelessly."""

    def __init__(self, scenario: Scenario | None = None) -> None:
        self.scenario = scenario or Scenario([], "<rules only>")
        for i, turn in enumerate(self.scenario.turns):
            if turn.fault is not None:
                raise ScenarioError(
                    self.scenario.source, f"turns[{i}].fault",
                    "the scripted backend plays replies only; faults need the offline model",
                )
        self.calls = 0
        #: The reply of each scripted turn, by its index: a scripted turn's reply does
        #: not depend on the request, and making it (its token count: a JSON dump of
        #: every tool input) cost more than the rest of a call. Rules turns are not kept.
        self._answers: dict[int, Reply] = {}

    @classmethod
    def from_script(cls, path: str) -> ScriptedBackend:
        """The backend for `OPLOOP_LLM_SCRIPT` (a scenario file), or rules only ("")."""
        return cls(load_scenario(path) if path else None)

    def reply(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The final assistant message for `request`, in the form every backend returns
        (`role`, `content` blocks in request form, `stop_reason`, `model`, `usage`)."""
        self.calls += 1
        messages = request.get("messages") or []
        at = run_position(messages)
        answer = self._answers.get(at)
        if answer is None:
            turn = self.scenario.turns[at] if at < len(self.scenario.turns) else Turn()
            answer = scripted_reply(turn, request)  # a "rules" turn asks the rule engine
            if turn.content is not None:
                self._answers[at] = answer
        salt = f"{session_of(request)}/{len(messages)}"
        content = [_with_fresh_id(block, salt, i) for i, block in enumerate(answer.content)]
        return {
            "role": "assistant",
            "content": content,
            "stop_reason": answer.stop_reason,
            "model": str(request.get("model", "")),
            # The scripted model reads nothing, so it counts no input tokens: counting
            # them would add a cost that grows with history and is no part of oploop's.
            "usage": {"input_tokens": 0, "output_tokens": answer.output_tokens},
        }

    async def stream(
        self, request: dict[str, Any], on_delta: OnDelta, *, bounds: StreamBounds, timeout_s: float
    ) -> dict[str, Any]:
        """The reply, its text and thinking passed to `on_delta` in word-sized deltas."""
        message = self.reply(request)
        for block in message["content"]:
            kind = block.get("type")
            if kind in ("text", "thinking"):
                for piece in text_chunks(block[kind]):
                    on_delta(kind, piece)
        return message

    async def create(self, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """The reply, at once."""
        return self.reply(request)

    def forget(self, messages: list[Any]) -> None:
        """Nothing is kept of a request."""

    async def aclose(self) -> None:
        """Nothing to release."""


def run_position(messages: list[Any]) -> int:
    """How many assistant replies the current run already has: the scenario turn due.

    The run began at the last user message carrying text (its prompt); tool
    results are user messages too, but carry no text.
    """
    replies = 0
    for message in reversed(messages):
        if type(message) is not dict and not isinstance(message, Mapping):
            continue  # (a plain dict first: an ABC's isinstance is slow)
        if message.get("role") == "assistant":
            replies += 1
        elif _has_text(message):
            break
    return replies


def _has_text(message: Mapping[str, Any]) -> bool:
    """Whether a message carries text (a prompt), not only tool results."""
    content = message.get("content")
    if isinstance(content, str):
        return bool(content.strip())
    if not isinstance(content, list):
        return False
    for block in content:
        if (type(block) is dict or isinstance(block, Mapping)) and block.get("type") == "text":
            return True
    return False


def _with_fresh_id(block: dict[str, Any], salt: str, position: int) -> dict[str, Any]:
    """A tool_use block with an id unique in its session and stable for the same request.

    The scenario's ids are per turn of the file, so a follow-up run would repeat them.
    """
    if block.get("type") != "tool_use":
        return dict(block)
    digest = blake2s(f"{salt}/{position}".encode(), digest_size=12).hexdigest()
    return {**block, "id": "toolu_" + digest}
