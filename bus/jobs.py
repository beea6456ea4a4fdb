"""The workers' messages: their control pipe (`ControlHello`, `Abort`) and the `work`
protocol (ready, heartbeats, jobs, deltas, results). Each type's docstring is its
protocol documentation, as in `bus.messages`, which registers them all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bus.envelope import Body


@dataclass(frozen=True, slots=True)
class ControlHello(Body):
    """Worker control DEALER -> supervisor `control`: announces the worker's control pipe.

    Sent on connect and after every reconnect; no reply.
    """

    KIND: ClassVar[str] = "control_hello"
    worker: str


@dataclass(frozen=True, slots=True)
class Abort(Body):
    """Supervisor `control` -> worker control DEALER: stop job `envelope.job` now.
    (Also on `work`, for a job an executor reported in its `Ready` that no run waits
    for: that pipe is known to be connected.)

    The worker answers on its work socket with `JobFailed(error="aborted")`, also
    for a job it does not hold (over, or not arrived yet: then it is refused when
    it comes), so the supervisor always frees the job's slot.
    """

    KIND: ClassVar[str] = "abort"


# --- worker protocol on `work` (Majordomo / Paranoid Pirate style) ---------------------


@dataclass(frozen=True, slots=True)
class Ready(Body):
    """Worker -> supervisor `work`: I serve `role` with `capacity` concurrent jobs.

    Executors list the tools they run (ToolSpec wire dicts). `machine` names the
    worker machine this worker runs on (`oploop worker --machine NAME`); empty for
    the host's own workers (and unnamed ones the host admits), which serve as "local"
    (a worker key's `Ready` naming another machine, or none unless allowed, is answered
    `ErrorReply("refused", why)`; an accepted one gets a `Heartbeat` at once). Sent on
    connect and whenever the supervisor says `Disconnect`.

    `running`: the tool jobs an executor still holds when it announces itself again
    (the supervisor restarted, or lost it for a while), each `{job, sid, call, done}`:
    the job's id and session, the `ToolJob.call_id` it runs, and whether it is over
    (its final reply, kept for that, follows the `Ready`). The supervisor adopts the
    ones a resumed run still waits for (same session and call) and answers the others
    `Abort` on `work` (a kept reply nobody waits for is dropped, logged): a job is never
    run twice, and a result from before a restart reaches only the call it belongs to.
    """

    KIND: ClassVar[str] = "ready"
    role: str
    capacity: int
    tools: list[dict[str, Any]] = field(default_factory=list)
    machine: str = ""
    running: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ToolsChanged(Body):
    """Executor -> supervisor `work`: my tools changed (an MCP server listed or re-listed
    its tools), without the jobs in flight being lost as a new `Ready` would lose them.

    `tools`: every tool it runs now (ToolSpec wire dicts, as in `Ready`); `servers`:
    the state of each of its MCP servers (name, transport, state, restarts, tools,
    error, left_out). No reply.
    """

    KIND: ClassVar[str] = "tools_changed"
    tools: list[dict[str, Any]] = field(default_factory=list)
    servers: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Heartbeat(Body):
    """Both ways on `work`, every second; any message counts as life. No reply."""

    KIND: ClassVar[str] = "heartbeat"


@dataclass(frozen=True, slots=True)
class Disconnect(Body):
    """Either way on `work`: forget me (worker leaving) / I do not know you, say `Ready`.

    Workers number their messages (the envelope `id`); the supervisor's `Disconnect`
    carries the id of the message it answers, so that a worker can tell one that
    predates its latest `Ready` (and ignore it) from one that does not.
    """

    KIND: ClassVar[str] = "disconnect"


#: `JobFailed.error` of an llm caller that lacks the history revision a delta builds on.
HISTORY_MISS = "history_miss"


@dataclass(frozen=True, slots=True)
class LlmJob(Body):
    """Supervisor -> llm caller: one Messages-API request (`request` is its JSON body).

    Answered by zero or more `Delta`/`Retrying`, then `LlmResult` or `JobFailed`.

    History deltas (so a turn does not re-send the whole history): with a
    `history_key`, the caller keeps the request's message list under that key
    as revision `rev`. A later job may then send in `request["messages"]` only
    what follows the first `keep` messages of revision `base_rev`. A caller
    that does not hold that revision answers `JobFailed(error="history_miss",
    retryable=True)` and the supervisor sends the job again in full (`keep` 0).
    Without a `history_key` the request is complete and nothing is kept.

    `same_rest` (with `keep` > 0): the request's other fields (system prompt, tools,
    model, ...) are those of revision `base_rev`, so `request` carries `messages`
    only; the caller fills in the rest it holds. Every turn re-sent ~2 KB of tool
    list and system prompt otherwise.
    """

    KIND: ClassVar[str] = "llm_job"
    request: dict[str, Any]
    stream: bool = True
    history_key: str = ""
    base_rev: int = 0
    keep: int = 0
    rev: int = 0
    same_rest: bool = False
    #: Attempts at most (0: the caller's policy), and the whole call's time limit in
    #: seconds, retries included (0: none but the deadline): the intent router's.
    attempts: int = 0
    timeout_s: float = 0.0
    #: Count the request's input tokens (the Messages API's `count_tokens`) instead of
    #: calling the model: answered by `LlmResult` whose message is only
    #: `{"usage": {"input_tokens": N}}`, or `JobFailed` where counting is not offered.
    count: bool = False


@dataclass(frozen=True, slots=True)
class Delta(Body):
    """Llm caller -> supervisor: a batch of streamed `text` on `channel` (text|thinking)."""

    KIND: ClassVar[str] = "delta"
    channel: str
    text: str


@dataclass(frozen=True, slots=True)
class Retrying(Body):
    """Llm caller -> supervisor: attempt `attempt` failed with `error`; next in `wait_s`.

    Text streamed by the failed attempt is void; the supervisor tells viewers.
    `stall_bound_s`: when the attempt stalled, the bound that fired (the next
    attempt's is doubled, up to 30 s); 0 otherwise.
    """

    KIND: ClassVar[str] = "retrying"
    attempt: int
    error: str
    wait_s: float
    stall_bound_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LlmResult(Body):
    """Llm caller -> supervisor: the final assistant `message` (Messages-API Message dict)."""

    KIND: ClassVar[str] = "llm_result"
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolJob(Body):
    """Supervisor -> executor: run tool `name` on `input` in `cwd`, within `timeout_s`.

    `read_paths`: what the confined reads may see besides the system's files,
    the session's cwd and workspace (the agent's `read_paths`). `agent`: the
    session's agent, whose `deny` permission rules the executor enforces itself
    (from its own `oploop.toml`).
    `call_id`: the model's `tool_use` id it answers, which the executor reports back
    when it announces itself again with the job still in hand (`Ready.running`).
    Answered by `ToolResult` (also for a failing tool) or `JobFailed`.
    """

    KIND: ClassVar[str] = "tool_job"
    name: str
    input: dict[str, Any]
    cwd: str = ""
    timeout_s: float = 0.0
    read_paths: list[str] = field(default_factory=list)
    agent: str = ""
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class ToolOutput(Body):
    """Executor -> supervisor: a batch of what a running tool printed, before its result.

    `stream`: "stdout" or "stderr"; `text`: the batch (decoded, utf-8 errors replaced).
    A call's live output is bounded (`actors/tools/live.py`): past the bound one last
    `ToolOutput` with `cut` set says that the output goes on (its `text` says so), and
    nothing more of that call comes before its `ToolResult`, which has the output as
    ever. No reply.
    """

    KIND: ClassVar[str] = "tool_output"
    stream: str
    text: str
    cut: bool = False


@dataclass(frozen=True, slots=True)
class ToolResult(Body):
    """Executor -> supervisor: the tool's `output`, whether it `is_error`, its duration.

    `images`: Messages-API image blocks to put in the tool_result beside the text
    (an MCP tool's images; the built-ins send none).
    """

    KIND: ClassVar[str] = "tool_result"
    output: str
    is_error: bool
    duration_ms: float
    images: list[dict[str, Any]] = field(default_factory=list)
    #: What the tool meant for the user only (an MCP block for the audience "user"):
    #: shown to viewers in `TOOL_END`, never sent to the model.
    shown: str = ""


@dataclass(frozen=True, slots=True)
class ToolProgress(Body):
    """Executor -> supervisor: a tool job in flight reported progress (an MCP server's
    `notifications/progress`): `progress` so far, of `total` (0: unknown), `message`.
    The supervisor emits it as `TOOL_PROGRESS`. No reply."""

    KIND: ClassVar[str] = "tool_progress"
    progress: float
    total: float = 0.0
    message: str = ""


@dataclass(frozen=True, slots=True)
class JobFailed(Body):
    """Worker -> supervisor: the job could not be done.

    `error` is a stable tag (`aborted`, `api_error`, `overloaded`, ...; `oversize`
    or `unencodable` when the worker's reply could not go on the wire and this
    stands in for it),
    `status` the HTTP status where one applies (0 otherwise).
    """

    KIND: ClassVar[str] = "job_failed"
    error: str
    message: str
    retryable: bool = False
    status: int = 0
