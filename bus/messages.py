"""Every message type on the wire, registered in one place (`MESSAGE_TYPES`).

The clients' requests and replies, the control verbs and the events are defined
here; the workers' messages in `bus.jobs`, the `Envelope` in `bus.envelope` (both
imported here, so `bus.messages` names every type). Each type is a frozen
dataclass whose docstring is its protocol documentation:
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

from bus.envelope import PROTOCOL_VERSION, Body, Envelope
from bus.jobs import (
    HISTORY_MISS,
    Abort,
    ControlHello,
    Delta,
    Disconnect,
    Heartbeat,
    JobFailed,
    LlmJob,
    LlmResult,
    Ready,
    Retrying,
    ToolJob,
    ToolOutput,
    ToolProgress,
    ToolResult,
    ToolsChanged,
)
from bus.mcpwire import (
    AnswerElicitation,
    Elicit,
    ElicitAnswer,
    ElicitationAck,
    GetPrompt,
    PromptJob,
    PromptResult,
    Sample,
    SampleAnswer,
)
from bus.vocab import CancelMode

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
    `host`: see below.
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
    #: On a shared store: the host (id or name, `oploop status`) to run a new session
    #: on; "" the least-loaded (`actors.supervisor.forwarding`).
    host: str = ""


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
    """Client -> supervisor `api`: one session in full (`history` False: its summary
    only, the reply's history empty). Reply: `SessionInfo`."""

    KIND: ClassVar[str] = "inspect_session"
    session: str
    history: bool = True


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
    mode: str = CancelMode.UI
    reason: str = ""
    #: Set by a host of the same store forwarding this to the session's owner
    #: (`actors.supervisor.forwarding`): who asked there ("local" or a key's name).
    #: Honoured from the owner's own user and the store's other hosts (their keys) only;
    #: a forwarded request is never forwarded again.
    by: str = ""


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
    #: Set by a host of the same store forwarding this to the session's owner
    #: (`actors.supervisor.forwarding`): who asked there ("local" or a key's name).
    #: Honoured from the owner's own user and the store's other hosts (their keys) only;
    #: a forwarded request is never forwarded again.
    by: str = ""


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
class Compact(Body):
    """Client -> supervisor `control`: compact `session`'s requests now
    (`actors/core/context.py`). A session with no run open: every tool result is
    cleared and the turns before the last summarised by a model call; the reply comes
    once its `COMPACTED` is journaled. A running one compacts before its next model
    call. Who may: the local user and `control` keys. Reply: `CompactAck` or
    `ErrorReply` (an unknown session, nothing to compact, the summary call failing).
    """

    KIND: ClassVar[str] = "compact"
    session: str
    #: Set by a host of the same store forwarding this to the session's owner
    #: (`actors.supervisor.forwarding`): who asked there ("local" or a key's name).
    #: Honoured from the owner's own user and the store's other hosts (their keys) only;
    #: a forwarded request is never forwarded again.
    by: str = ""


@dataclass(frozen=True, slots=True)
class CompactAck(Body):
    """Supervisor -> client: `state` "compacted" (sizes in tokens before and after, and
    what went wrong if anything: `note`) or "queued" (the running run compacts before
    its next model call)."""

    KIND: ClassVar[str] = "compact_ack"
    session: str
    state: str
    before_tokens: int = 0
    after_tokens: int = 0
    note: str = ""


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
    #: Set by a host of the same store forwarding this to the session's owner
    #: (`actors.supervisor.forwarding`): who asked there ("local" or a key's name).
    #: Honoured from the owner's own user and the store's other hosts (their keys) only;
    #: a forwarded request is never forwarded again.
    by: str = ""


@dataclass(frozen=True, slots=True)
class DecideAck(Body):
    """Supervisor `control` -> client: the calls decided, and who `by` is said to be."""

    KIND: ClassVar[str] = "decide_ack"
    session: str
    decided: list[str]
    by: str


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
class EventBatch(Body):
    """Supervisor PUSH -> broadcaster `ingest`: the events of one group commit, in the
    order they were stamped. Each of `frames` is one `Event` envelope, encoded exactly
    as the broadcaster stores and publishes it (viewers still get one event per
    message); the broadcaster takes them one by one, as if each had come alone. One
    message per commit, not one per event: every message on the pipe costs a send,
    a receive and wake-ups of both sides' I/O threads. No reply."""

    KIND: ClassVar[str] = "event_batch"
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class ForgetSessions(Body):
    """Supervisor PUSH -> broadcaster `ingest`: these sessions were deleted; drop their
    event logs. It travels behind every event of theirs already pushed. No reply.

    Broadcaster PUB `events` -> viewers, one session at a time on its topic: that
    session was deleted; a viewer following it stops (`Client.events` raises
    `SessionRemoved`).

    Supervisor ROUTER `work` -> one of the host's own llm callers: these sessions left
    the supervisor's memory (their runs ended), so no delta will build on the histories
    the caller holds of them; it drops them (`supervisor/forgets.py`). No reply."""

    KIND: ClassVar[str] = "forget_sessions"
    sessions: list[str]


@dataclass(frozen=True, slots=True)
class Subscribed(Body):
    """Broadcaster PUB `events` -> a viewer of every session (topic b""): its
    subscription is in effect, whatever is published from now on reaches it
    (`Client.live`'s `on_subscribed`). Viewers of one session never get it."""

    KIND: ClassVar[str] = "subscribed"


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
    Subscribed,
    Cancel,
    CancelAck,
    Renew,
    RenewAck,
    Say,
    SayAck,
    Compact,
    CompactAck,
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
    ToolOutput,
    ToolProgress,
    ToolResult,
    JobFailed,
    Event,
    EventBatch,
    ForgetSessions,
    ReplayRequest,
    ReplayBatch,
    GetPrompt,
    PromptJob,
    PromptResult,
    Elicit,
    ElicitAnswer,
    AnswerElicitation,
    ElicitationAck,
    Sample,
    SampleAnswer,
)

BY_KIND: dict[str, type[Body]] = {t.KIND: t for t in MESSAGE_TYPES}

#: Every name of the wire: the types defined here and those `bus.jobs` and `bus.envelope` define.
__all__ = [
    "Abort", "BY_KIND", "Body", "Cancel", "CancelAck", "Compact", "CompactAck",
    "ControlHello", "DecideAck",
    "DecideCalls", "Delta", "Disconnect", "Envelope", "ErrorReply", "Event",
    "EventBatch", "ForgetSessions", "HISTORY_MISS", "Heartbeat", "InspectSession", "JobFailed",
    "ListSessions", "ListTools", "LlmJob", "LlmResult", "MESSAGE_TYPES", "PROTOCOL_VERSION",
    "PruneSessions", "Ready", "RemoveSessions", "Renew", "RenewAck", "ReplayBatch",
    "ReplayRequest", "Retrying", "RunStarted", "Say", "SayAck", "SessionInfo",
    "SessionList", "SessionsRemoved", "StartRun", "Stats", "StatsReply", "Subscribed", "ToolJob",
    "ToolList", "ToolOutput", "ToolProgress", "ToolResult", "ToolsChanged", "GetPrompt",
    "PromptJob", "PromptResult", "Elicit", "ElicitAnswer", "AnswerElicitation",
    "ElicitationAck", "Sample", "SampleAnswer",
]
