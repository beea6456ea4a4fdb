"""What happens to a run: the inputs of `machine.step` (the driver turns each happening
-- a model reply, a streamed batch, a tool's outcome, a cancel, a restart -- into one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.core.context import ContextView
from actors.core.history import Message
from actors.core.turn import ToolOutcome
from actors.permissions import Rule
from actors.usage import ZERO, Usage

__all__ = ["Begin", "Cancel", "Compacted", "Decide", "Delta", "Failed", "Input", "ModelFailed",
           "ModelReplied", "Resume", "Retry", "Routed", "Sampled", "Say", "Start", "StopLater",
           "ToolFinished", "ToolStarted", "WorkerLost"]


@dataclass(frozen=True, slots=True)
class Start:
    """A new run on `prompt`: at most `limit` turns; `deadline_s` is reported only
    (the driver turns it into a `Cancel("deadline")` when it passes)."""

    prompt: str
    limit: int
    agent: str = ""
    model: str = ""
    deadline_s: float = 0.0
    #: Ask the intent router first (a `CallModel(route=True)`, answered by `Routed`).
    router: bool = False
    #: Tool names offered on each turn (a call of any other is refused, never run).
    offered: frozenset[str] = frozenset()
    #: Checks a final answer: None if fine, else the problem (one repair turn).
    check: Callable[[str], str | None] | None = None
    #: The agent's permission rules (`actors.permissions`): `deny` refuses a call,
    #: `ask` waits for a `Decide` for at most `approval_timeout_s` (the driver's timer).
    rules: tuple[Rule, ...] = ()
    approval_timeout_s: float = 600.0
    #: The session's working directory: the rules judge a call's paths against it.
    cwd: str = ""


@dataclass(frozen=True, slots=True)
class Begin:
    """The driver is ready to do the run's work (its task runs, the tools are known):
    the turns of a started or resumed run begin (or the intent router's call)."""


@dataclass(frozen=True, slots=True)
class Routed:
    """The intent router's answer ("DIRECT", "AGENT"), or None if its call failed;
    `usage`: what its call used (`actors.usage.of_reply`); `reason` says why a failed
    or unclear call fell back to AGENT (in the ROUTE event)."""

    route: str | None
    usage: Usage = ZERO
    reason: str = ""


# Not frozen (nor hashable), unlike the other inputs: one or more is made every turn,
# and a frozen dataclass's `__init__` sets each field through `object.__setattr__`
# (3x the cost of this one's). Nothing edits one once made.
@dataclass(slots=True)
class Delta:
    """Text (or thinking) the model call in flight streamed: a `TOKEN` (`THINKING`)
    event; text is kept, marked, if the run is cancelled."""

    text: str
    channel: str = "text"


@dataclass(frozen=True, slots=True)
class Retry:
    """The model call in flight is being retried (a `RETRY` event): the text it
    streamed is void."""

    attempt: int = 0
    error: str = ""
    wait_s: float = 0.0
    #: After a stall, the bound that fired (the `RETRY` event's `stall_bound_s`).
    stall_bound_s: float = 0.0


# Not frozen (nor hashable), unlike the other inputs: one or more is made every turn,
# and a frozen dataclass's `__init__` sets each field through `object.__setattr__`
# (3x the cost of this one's). Nothing edits one once made.
@dataclass(slots=True)
class ModelReplied:
    """The model's reply (an assistant message with `stop_reason`)."""

    message: Message
    #: The tool names the request offered (a call of any other is refused, never
    #: run); None: those the run started with.
    offered: frozenset[str] | None = None
    #: Wall-clock time of the reply (a call under `ask` expires `approval_timeout_s`
    #: after it): the machine has no clock of its own.
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelFailed:
    """The model call failed for good: the run ends `ERROR`."""

    error: str
    message: str


# Not frozen (nor hashable), unlike the other inputs: one or more is made every turn,
# and a frozen dataclass's `__init__` sets each field through `object.__setattr__`
# (3x the cost of this one's). Nothing edits one once made.
@dataclass(slots=True)
class ToolStarted:
    """The driver is about to run call `call_id` (its parallelism gate let it in) on
    `machine` ("": not said)."""

    call_id: str
    machine: str = ""


# Not frozen (nor hashable), unlike the other inputs: one or more is made every turn,
# and a frozen dataclass's `__init__` sets each field through `object.__setattr__`
# (3x the cost of this one's). Nothing edits one once made.
@dataclass(slots=True)
class ToolFinished:
    """Call `call_id` finished with `outcome` (failures are outcomes with `is_error`)."""

    call_id: str
    outcome: ToolOutcome


@dataclass(frozen=True, slots=True)
class Cancel:
    """A cancel: "ui" and "deadline" end the run now, "operation" at the next boundary."""

    mode: str
    reason: str = ""
    #: How long each started tool call had run (call id, ms), measured by the driver
    #: when the cancel arrives: the `TOOL_END` the cancel sends for it reports that.
    ran_ms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Decide:
    """A decision on the pending approval of call `call_id`: `decision` is "approve" or
    "deny"; `by` names who decided ("local", a key, "timeout"); a denied call's result
    is an error saying `reason`. A call not pending is ignored (the caller answers)."""

    call_id: str
    decision: str
    by: str
    reason: str = ""
    #: Approve this tool's calls for the rest of the session (a session-scoped allow
    #: rule, over `ask` only: never over `deny`).
    always: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    """The run cannot go on (a driver's bug, the session log failing): it ends `ERROR`
    at once, its work aborted, its open calls answered with `message`."""

    error: str
    message: str


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """The worker serving the run went away: a model call is made again; started
    tools that had not finished end as errors (a tool is never run twice)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """A supervisor restart: go on with the run the folded state describes. `adopt`:
    its calls in flight may still run on their executors (the supervisor alone
    restarted): they are waited for (`ToolJob.adopted`), not interrupted."""

    reason: str
    router: bool = False
    offered: frozenset[str] = frozenset()
    check: Callable[[str], str | None] | None = None
    rules: tuple[Rule, ...] = ()
    approval_timeout_s: float = 600.0
    cwd: str = ""
    adopt: bool = False


@dataclass(frozen=True, slots=True)
class Say:
    """A user message into the open run, said by `by` (a key's name, or "local"):
    queued, it joins the history at the next boundary as a `USER_MESSAGE`. (An idle
    session has no run to take it: the caller starts one on it instead.)"""

    text: str
    by: str = "local"


@dataclass(frozen=True, slots=True)
class Sampled:
    """A model call an MCP server asked for (sampling) was answered, outside the turns:
    a `SAMPLING` event saying `data`, its `usage` counted with the run's."""

    data: dict[str, object]
    usage: Usage = ZERO


@dataclass(frozen=True, slots=True)
class StopLater:
    """An operation cancel for an open run that no driver in this process carries (one
    a restart left and no one has resumed here yet): recorded only, and honoured at
    the next boundary by the driver that resumes it."""


@dataclass(frozen=True, slots=True)
class Compacted:
    """The requests' view of the history compacted from `prior` to `view` (a
    `COMPACTED` event): sizes in tokens before and after, how many tool results were
    cleared and model turns summarised, and who asked (`by`: "budget", "recovery", a
    key's name). `usage`: the summary call's tokens; `note`: what went wrong, if
    anything (a summary call that failed: results were cleared only). Ignored unless
    the view is still `prior` (an older compaction's result, arriving late)."""

    view: ContextView
    prior: ContextView
    before_tokens: int
    after_tokens: int
    cleared_results: int
    summarised_turns: int
    by: str
    usage: Usage = ZERO
    note: str = ""


Input = (Start | Begin | Routed | Delta | Retry | ModelReplied | ModelFailed | ToolStarted
         | ToolFinished | Cancel | Failed | WorkerLost | Resume | Say | Decide | StopLater
         | Compacted | Sampled)
