"""Every message type on the wire, in one place.

Each type is a frozen dataclass whose docstring is its protocol documentation:
who sends it, who receives it, and what it is answered with. A message travels
inside an `Envelope`; the codec (`bus.codec`) checks its `kind`, the protocol
version and every field's type before any actor sees it.

Sockets (see `bus.endpoints`):
  api      supervisor ROUTER  <- clients DEALER      start/list/inspect/prune/remove
  control  supervisor ROUTER  <- clients, workers    cancel, approve/deny, abort (priority)
  work     supervisor ROUTER  <- workers DEALER      ready, heartbeat, jobs
  ingest   broadcaster PULL   <- supervisor PUSH     sequenced session events
  events   broadcaster XPUB   -> viewers SUB         topic = session id
  replay   broadcaster ROUTER <- viewers DEALER      events of S from seq N
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class Body:
    """Base of every message body; `KIND` is the envelope's `kind` tag."""

    KIND: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message: routing-free header fields plus a typed body.

    `id` identifies the message (a reply carries the request's `id`), `sid` the
    session, `job` the job, `deadline` an absolute `time.time()` after which the
    work is moot (0 when none applies).
    """

    body: Body
    id: str = ""
    sid: str = ""
    job: str = ""
    deadline: float = 0.0
    v: int = PROTOCOL_VERSION

    @property
    def kind(self) -> str:
        """The body's kind tag."""
        return self.body.KIND


# --- replies common to every request socket -------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorReply(Body):
    """Any request socket -> requester: the request failed or was refused.

    `code` is a stable tag (`bad_frame`, `unknown_session`, `busy`, ...),
    `message` one human-readable line. Also supervisor `work` -> worker, code
    `refused`: its `Ready` is refused (its key may not serve that machine); it stops.
    """

    KIND: ClassVar[str] = "error"
    code: str
    message: str


# --- clients -> supervisor `api` ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartRun(Body):
    """Client -> supervisor `api`: run the agent on `prompt`.

    `session` empty starts a new session, else continues that session with a
    follow-up user message. `max_turns` 0 means the agent's own limit;
    `deadline_s` 0 means none. `cwd` is where relative tool paths resolve.
    `lease_s` > 0: the run is cancelled when no `Renew` came for that long (a run
    asked for by another host, which may vanish); 0 means no lease.
    `key`: chosen by the client, the same for every resend of one start (a
    supervisor that restarted may have lost the request, or the reply): a
    `StartRun` whose key the supervisor knows is answered with that run's
    `RunStarted` again, never started twice.
    `machine`: run the session's tools on that worker machine only (the agent's
    `target_machine` for this session); empty keeps the agent's own.
    Reply: `RunStarted` or `ErrorReply`, sent once the run is journaled.
    """

    KIND: ClassVar[str] = "start_run"
    prompt: str
    session: str = ""
    agent: str = ""
    max_turns: int = 0
    deadline_s: float = 0.0
    cwd: str = ""
    key: str = ""
    lease_s: float = 0.0
    machine: str = ""


@dataclass(frozen=True, slots=True)
class RunStarted(Body):
    """Supervisor `api` -> client: the run is under way.

    Its events start at `from_seq` of `session` (the run's `SESSION_START`).
    """

    KIND: ClassVar[str] = "run_started"
    session: str
    run: int
    from_seq: int


@dataclass(frozen=True, slots=True)
class ListSessions(Body):
    """Client -> supervisor `api`: list sessions. Reply: `SessionList`."""

    KIND: ClassVar[str] = "list_sessions"


@dataclass(frozen=True, slots=True)
class SessionList(Body):
    """Supervisor `api` -> client: one summary dict per session.

    Keys: `session`, `state`, `agent`, `runs`, `turns`, `last_seq`, `created`.
    """

    KIND: ClassVar[str] = "session_list"
    sessions: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class InspectSession(Body):
    """Client -> supervisor `api`: one session in full. Reply: `SessionInfo`."""

    KIND: ClassVar[str] = "inspect_session"
    session: str


@dataclass(frozen=True, slots=True)
class SessionInfo(Body):
    """Supervisor `api` -> client: a session's summary and its stored history.

    `history` is the Messages-API message list as stored (no reminders).
    """

    KIND: ClassVar[str] = "session_info"
    summary: dict[str, Any]
    history: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class PruneSessions(Body):
    """Client -> supervisor `api`: delete finished sessions now, by the host's
    `[retention]` rules.

    `older_than_s` >= 0 replaces the age limit (delete every session idle for
    longer); `keep` >= 0 replaces the count limit (keep only the `keep` most
    recently active; 0 keeps none); -1 leaves the configured rule. A running
    session is never deleted. Reply: `SessionsRemoved`.
    """

    KIND: ClassVar[str] = "prune_sessions"
    older_than_s: float = -1.0
    keep: int = -1


@dataclass(frozen=True, slots=True)
class RemoveSessions(Body):
    """Client -> supervisor `api`: delete `sessions`, log, history and events.

    A running session, or an id the supervisor does not hold, is refused (and
    named in the reply) while the others are deleted. Reply: `SessionsRemoved`.
    """

    KIND: ClassVar[str] = "remove_sessions"
    sessions: list[str]


@dataclass(frozen=True, slots=True)
class SessionsRemoved(Body):
    """Supervisor `api` -> client: the answer to `PruneSessions` and `RemoveSessions`.

    `removed`: the sessions deleted; from now on their ids are answered
    `unknown_session` "no such session (pruned)". `refused`: session id -> why
    it was not deleted (running, no such session).
    """

    KIND: ClassVar[str] = "sessions_removed"
    removed: list[str]
    refused: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListTools(Body):
    """Client -> supervisor `api`: the tool catalogue as `agent` sees it.

    Reply: `ToolList`.
    """

    KIND: ClassVar[str] = "list_tools"
    agent: str = ""


@dataclass(frozen=True, slots=True)
class ToolList(Body):
    """Supervisor `api` -> client: tool spec dicts (`actors.tools.spec.ToolSpec` wire form)."""

    KIND: ClassVar[str] = "tool_list"
    tools: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Stats(Body):
    """Any actor's request socket: ask for its counters. Reply: `StatsReply`."""

    KIND: ClassVar[str] = "stats"


@dataclass(frozen=True, slots=True)
class StatsReply(Body):
    """Counters of an actor: messages handled, frames rejected by reason, workers, ..."""

    KIND: ClassVar[str] = "stats_reply"
    counters: dict[str, Any]


# --- control (priority) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cancel(Body):
    """Client -> supervisor `control`: cancel `session`.

    `mode` is `ui` (now: abort streams, kill tools) or `operation` (cooperative,
    at the next loop boundary). Reply: `CancelAck` or `ErrorReply`.
    """

    KIND: ClassVar[str] = "cancel"
    session: str
    mode: str = "ui"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CancelAck(Body):
    """Supervisor `control` -> client: the cancel was accepted (`state` of the session)."""

    KIND: ClassVar[str] = "cancel_ack"
    session: str
    state: str


@dataclass(frozen=True, slots=True)
class Renew(Body):
    """Client -> supervisor `control`: keep the lease of `session`'s run (started with
    `StartRun.lease_s`) for `lease_s` more seconds. Sent every second by the host that
    asked for the run; its replies are also how that host knows the link lives.
    Reply: `RenewAck` or `ErrorReply`.
    """

    KIND: ClassVar[str] = "renew"
    session: str
    lease_s: float


@dataclass(frozen=True, slots=True)
class RenewAck(Body):
    """Supervisor `control` -> client: the lease is renewed; `running` False when the
    run has ended (nothing left to keep)."""

    KIND: ClassVar[str] = "renew_ack"
    session: str
    running: bool


@dataclass(frozen=True, slots=True)
class Say(Body):
    """Client -> supervisor `control`: a user message into `session`.

    A running session takes it at its next boundary (after the current tool
    results, before the next model call) as a `USER_MESSAGE` event; an idle one
    starts a run on it, as a follow-up `StartRun` does. Who may: the local user
    and `control` keys. Reply: `SayAck` (sent once the message is journaled: a
    supervisor restart still delivers it) or `ErrorReply`.
    """

    KIND: ClassVar[str] = "say"
    session: str
    text: str


@dataclass(frozen=True, slots=True)
class SayAck(Body):
    """Supervisor -> client: the message was accepted. `state`: "queued" (the running
    run takes it at its next boundary) or "started" (run `run` began on it, its events
    from `from_seq`)."""

    KIND: ClassVar[str] = "say_ack"
    session: str
    state: str
    run: int
    from_seq: int = 0


@dataclass(frozen=True, slots=True)
class DecideCalls(Body):
    """Client -> supervisor `control`: approve or deny calls of `session` waiting for
    approval: `call_ids`, or every one waiting if `all`. `decision` is "approve" or
    "deny"; a denied call's result says `reason`. The local user and `control` keys
    may decide, a `viewer` key may not. Reply: `DecideAck` or `ErrorReply` (nothing
    changed: an unknown session or call, a call decided already)."""

    KIND: ClassVar[str] = "decide_calls"
    session: str
    decision: str
    call_ids: list[str] = field(default_factory=list)
    all: bool = False
    reason: str = ""
    #: With "approve": approve the tools of these calls for the rest of the session.
    always: bool = False


@dataclass(frozen=True, slots=True)
class DecideAck(Body):
    """Supervisor `control` -> client: the calls decided, and who `by` is said to be."""

    KIND: ClassVar[str] = "decide_ack"
    session: str
    decided: list[str]
    by: str


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
    """

    KIND: ClassVar[str] = "ready"
    role: str
    capacity: int
    tools: list[dict[str, Any]] = field(default_factory=list)
    machine: str = ""


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
    """

    KIND: ClassVar[str] = "llm_job"
    request: dict[str, Any]
    stream: bool = True
    history_key: str = ""
    base_rev: int = 0
    keep: int = 0
    rev: int = 0
    #: Attempts at most (0: the caller's policy), and the whole call's time limit in
    #: seconds, retries included (0: none but the deadline): the intent router's.
    attempts: int = 0
    timeout_s: float = 0.0


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
    Answered by `ToolResult` (also for a failing tool) or `JobFailed`.
    """

    KIND: ClassVar[str] = "tool_job"
    name: str
    input: dict[str, Any]
    cwd: str = ""
    timeout_s: float = 0.0
    read_paths: list[str] = field(default_factory=list)
    agent: str = ""


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


# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event(Body):
    """Supervisor PUSH -> broadcaster `ingest`, then broadcaster XPUB -> viewers.

    One session event (DESIGN.md §4); `envelope.sid` is the session. `seq` is
    contiguous from 1 per session, stamped by the supervisor alone.
    """

    KIND: ClassVar[str] = "event"
    seq: int
    type: str
    turn: int
    ts: float
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ForgetSessions(Body):
    """Supervisor PUSH -> broadcaster `ingest`: these sessions were deleted; drop their
    event logs. It travels behind every event of theirs already pushed. No reply.

    Broadcaster PUB `events` -> viewers, one session at a time on its topic: that
    session was deleted; a viewer following it stops (`Client.events` raises
    `SessionRemoved`)."""

    KIND: ClassVar[str] = "forget_sessions"
    sessions: list[str]


@dataclass(frozen=True, slots=True)
class ReplayRequest(Body):
    """Viewer -> broadcaster `replay`: events of `envelope.sid` with seq >= `from_seq`.

    `to_seq` 0 means "to the end". Reply: `ReplayBatch` or `ErrorReply`.
    """

    KIND: ClassVar[str] = "replay_request"
    from_seq: int = 1
    to_seq: int = 0


@dataclass(frozen=True, slots=True)
class ReplayBatch(Body):
    """Broadcaster `replay` -> viewer: encoded `Event` envelopes, in seq order.

    `last_seq` is the newest seq the broadcaster holds for the session; `more`
    says the batch was cut at its size limit and the viewer should ask again.
    """

    KIND: ClassVar[str] = "replay_batch"
    events: list[bytes]
    last_seq: int
    more: bool


MESSAGE_TYPES: tuple[type[Body], ...] = (
    ErrorReply,
    StartRun,
    RunStarted,
    ListSessions,
    SessionList,
    InspectSession,
    SessionInfo,
    PruneSessions,
    RemoveSessions,
    SessionsRemoved,
    ListTools,
    ToolList,
    Stats,
    StatsReply,
    Cancel,
    CancelAck,
    Renew,
    RenewAck,
    Say,
    SayAck,
    DecideCalls,
    DecideAck,
    ControlHello,
    Abort,
    Ready,
    ToolsChanged,
    Heartbeat,
    Disconnect,
    LlmJob,
    Delta,
    Retrying,
    LlmResult,
    ToolJob,
    ToolResult,
    JobFailed,
    Event,
    ForgetSessions,
    ReplayRequest,
    ReplayBatch,
)

BY_KIND: dict[str, type[Body]] = {t.KIND: t for t in MESSAGE_TYPES}
