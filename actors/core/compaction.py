"""Carrying out a compaction: the steps `core/context.py` decides, and the summary call.

Used by the run's driver before a model call (the request reached the budget, or
the API found it too long) and by the supervisor between runs (`oploop compact`).
The result is a `Compacted` input for `machine.step`, which emits the `COMPACTED`
event carrying the new view; nothing here changes the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.core.catalogue import resolve_tools
from actors.core.context import (
    CHARS_PER_TOKEN,
    KEEP_RESULT_MESSAGES,
    TARGET,
    ContextView,
    budget_of,
    clear_point,
    count_results,
    count_turns,
    request_tokens,
    summary_of,
    summary_point,
    summary_request,
    view_messages,
)
from actors.core.inputs import Compacted, Delta, Retry
from actors.core.loopio import LoopIO, ModelError
from actors.core.machine import Emit, step
from actors.core.request import build_request
from actors.core.session import Session
from actors.usage import ZERO, of_reply

__all__ = ["Budget", "Outcome", "budget", "compact", "compact_between_runs", "request_builder"]

#: Builds the request a view gives (the turn's tools and system prompt fixed).
Build = Callable[[ContextView], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Budget:
    """A session's context window and the size at which its request is compacted."""

    window: int
    limit: int


#: The budgets lately given, by the identity of the agent and the aliases (both held, so
#: their ids stay theirs): an agent is frozen, and its budget was asked twice a turn.
_BUDGETS: dict[tuple[int, int], tuple[Any, Any, Budget]] = {}
#: Budgets remembered at most (a host has a few agents; a config reload makes new ones).
MAX_BUDGETS = 64


def budget(session: Session, aliases: Any) -> Budget:
    """The budget of `session`'s agent (`context_window`, `compact_at`)."""
    agent = session.agent
    held = _BUDGETS.get((id(agent), id(aliases)))
    if held is not None and held[0] is agent and held[1] is aliases:
        return held[2]
    window = agent.window(aliases)
    found = Budget(window, budget_of(window, agent.compact_at))
    if len(_BUDGETS) >= MAX_BUDGETS:
        _BUDGETS.clear()
    _BUDGETS[(id(agent), id(aliases))] = (agent, aliases, found)
    return found


@dataclass(frozen=True, slots=True)
class Outcome:
    """A compaction's result: the input to feed (None: the view could not change), the
    request the new view gives and its estimated size, and what went wrong, if anything."""

    compacted: Compacted | None
    request: dict[str, Any]
    tokens: int
    note: str = ""


def request_builder(session: Session, io: LoopIO, tools: list[dict[str, Any]]) -> Build:
    """The request of this turn under a view: the history sanitised, the view applied
    (its prefix kept as the same objects, for the llm callers' deltas), then built."""
    config = io.config

    def build(view: ContextView) -> dict[str, Any]:
        messages = session.context_memo.messages(session.turn_cache.sanitized(session.history),
                                                 view)
        return build_request(session.agent, messages, tools, session=session.id,
                             cwd=session.cwd, aliases=config.aliases,
                             memo=session.request_memo)

    return build


def _ignore(_: Delta | Retry) -> None:
    """A summary call's text and retries are no events of the run (its `COMPACTED` is)."""


async def compact(session: Session, io: LoopIO, build: Build, before: int, *, by: str,
                  keep: int = KEEP_RESULT_MESSAGES, summarise: bool = False, turn: int = 0,
                  scale: float = 1.0, goal: int = 0) -> Outcome:
    """Compact `session`'s view: clear older tool results (the latest `keep` messages of
    results kept whole); then, if that leaves more than `TARGET` of the budget (or
    `summarise`), summarise the turns before the latest with a model call; then, if a
    `goal` is given (a recovery: the size the API allows) and still not met, clear the
    latest results too. A summary call that fails leaves the results cleared and says so
    in the note. `scale`: how much the API's count exceeded the estimate, applied."""
    history = session.history
    limits = budget(session, io.config.aliases)
    prior = session.run.context
    view = prior._replace(cleared=clear_point(history, prior, keep))
    request = build(view)
    tokens = int(request_tokens(request) * scale)
    note, usage, turns = "", ZERO, 0
    if summarise or tokens > limits.limit * TARGET:
        upto = summary_point(history, view)
        if upto > view.summarised:
            agent = session.agent
            model = agent.compact_model or agent.model
            ask = summary_request(io.config.aliases.get(model, model),
                                  view_messages(history[:upto], view),
                                  limits.window * CHARS_PER_TOKEN // 2, session.id)
            try:
                reply = await io.call_model(session, ask, stream=False, turn=turn,
                                            progress=_ignore, compact=True)
            except ModelError as exc:
                note = (f"the summary call failed ({exc.error}: {exc.message}): "
                        "tool results were cleared only")
            else:
                usage = of_reply(reply)
                text = summary_of(reply)
                summarised = ContextView(text, upto, max(view.cleared, upto))
                shorter = build(summarised)
                if not text:
                    note = "the summary call gave no text: tool results were cleared only"
                elif int(request_tokens(shorter) * scale) >= tokens:
                    note = "the summary was no shorter than the turns it would replace: not used"
                else:
                    view, request = summarised, shorter
                    tokens = int(request_tokens(request) * scale)
                    turns = count_turns(history, prior.summarised, upto)
    if goal and tokens >= goal and keep > 0:  # the latest results too: nothing else is left
        view = view._replace(cleared=clear_point(history, view, 0))
        request = build(view)
        tokens = int(request_tokens(request) * scale)
    start = max(prior.cleared, prior.summarised)
    cleared = count_results(history, start, view.cleared) if view.cleared > start else 0
    if view.summarised == prior.summarised and not cleared:
        return Outcome(None, request, tokens, note)  # (the same messages: nothing to say)
    if summarise and keep == 0 and tokens >= before:  # on demand, and it would not shrink
        return Outcome(None, request, tokens, note or "it would not get any smaller")
    return Outcome(Compacted(view, prior, before, tokens, cleared, turns, by, usage, note),
                   request, tokens, note)


async def compact_between_runs(session: Session, io: LoopIO, by: str) -> Outcome:
    """`oploop compact` on a session with no run open: every tool result cleared and
    every turn before the last summarised (the next run starts from that)."""
    agent = session.agent
    tools = resolve_tools(io.tool_catalogue(io.tool_machine(session)), agent, 1,
                          io.config.hidden)
    build = request_builder(session, io, tools)
    before = request_tokens(build(session.run.context))
    return await compact(session, io, build, before, by=by, keep=0, summarise=True)


def apply_between_runs(session: Session, event: Compacted,
                       emit: Callable[[Session, str, int, dict[str, Any]], None]) -> bool:
    """Step `session`'s run on `event` where no driver carries it, and publish what it
    emits (`COMPACTED`); False if it was stale (the view changed meanwhile). A run
    begun meanwhile takes it through its driver (the one place its state changes)."""
    driver = session.driver
    if driver is not None:
        before = session.run.context
        driver.feed(event)
        return session.run.context != before
    state, actions = step(session.run, event)
    session.run = state
    done = False
    for action in actions:
        if isinstance(action, Emit):
            emit(session, action.type, action.turn, action.data)
            done = True
    return done
