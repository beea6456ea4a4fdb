"""Who may ask the supervisor's runs for what, and whether a new run is admitted.

The control and api sockets name their callers by ZAP User-Id (`ROLE:NAME`): the role
of a key (`role_of`), who it is in the events it causes (`by_of`, `asker_of`: a request
another host forwarded names who asked there), and whether a `StartRun` may begin a
run now (`start_refusal`: limits, the disk, the session's state). Apart from `runs.py`,
which starts, resumes, cancels and ends the runs: these are the checks before that,
plain functions of the caller and the request.
"""

from __future__ import annotations

from typing import Any

from actors.machines import LOCAL, machine_name_error
from actors.supervisor.runhost import RunHost
from bus.mcpwire import AnswerElicitation
from bus.messages import Cancel, Compact, DecideCalls, Say, StartRun

#: The role of another host of the shared store (`bus.security.HOST`): it sends on the
#: requests its callers may make (their rights checked there), naming who asked (`by`).
HOST = "host"

#: Who may cancel (or say) on the control socket, by ZAP User-Id (None: ipc without CURVE).
CONTROLLERS = frozenset({None, "local", "control", HOST})

#: What another host may send on (anything else from its key is refused).
FORWARDED = (Cancel, Say, DecideCalls, AnswerElicitation, Compact)

#: The role of a remote user's key: all a local user may do, but in no directory of its
#: choosing (its path names a directory of another machine).
CONTROL = "control"

#: The role of another host's key (`ask_machine`): it may start new runs (in no
#: directory of its choosing), and cancel and renew the runs it started; nothing else.
PEER = "peer"


def role_of(user_id: str | None) -> str | None:
    """The role part of a ZAP User-Id (`ROLE:NAME`, "local", or None over plain ipc)."""
    return user_id.split(":", 1)[0] if user_id else user_id


def by_of(user_id: str | None) -> str:
    """Who decided or said, as `APPROVAL_DECIDED.by` and `USER_MESSAGE.by` say it: the
    key's name, or "local" (the host's own key, or ipc)."""
    if not user_id or user_id == "local":
        return "local"
    return user_id.split(":", 1)[1] if ":" in user_id else user_id


def asker_of(user_id: str | None, body: Any) -> str:
    """Who asked for `body`: as `by_of` says, or, for a request another host of the store
    forwarded (`body.by`, honoured from this host's own user and the store's other
    hosts only), who asked there."""
    forwarded = getattr(body, "by", "")
    if forwarded and role_of(user_id) in (None, "local", HOST):
        return str(forwarded)
    return by_of(user_id)


def start_refusal(sup: RunHost, req: StartRun) -> tuple[str, str] | None:
    """Why a `StartRun` cannot be served by `sup`, as (error, message), or None."""
    limits = sup.config.limits
    if not req.prompt.strip():
        return "bad_request", "the prompt is empty"
    if len(req.prompt) > limits.max_prompt_chars:
        return "too_large", (f"prompt of {len(req.prompt)} chars exceeds the limit of "
                             f"{limits.max_prompt_chars} (limits.max_prompt_chars)")
    if req.max_turns < 0 or req.deadline_s < 0 or req.deadline_s != req.deadline_s:
        return "bad_request", "max_turns and deadline_s must be >= 0"
    if req.lease_s < 0 or req.lease_s != req.lease_s:
        return "bad_request", "lease_s must be >= 0"
    if req.machine:
        problem = machine_name_error(req.machine)
        if problem is None and req.machine == LOCAL:
            problem = f"{LOCAL!r} is the host's own machine: leave the machine out"
        if problem is not None:
            return "bad_request", problem
    unwritable = sup.unwritable()
    if unwritable:
        return "disk_full", unwritable
    # A run counts until its terminal event, not until its task has unwound. (Fewer
    # sessions in memory than the limit cannot be too many runs: no O(sessions) count
    # per start then, which 1,000 sessions starting together made quadratic.)
    running = 0
    if len(sup.sessions) >= limits.max_running_sessions:
        running = sum(1 for s in sup.sessions.values() if not s.run_over)
    if running >= limits.max_running_sessions:
        return "busy", (f"{running} sessions are running, the limit "
                        f"(limits.max_running_sessions = {limits.max_running_sessions}): "
                        f"try again when one has ended")
    if req.session:
        session = sup.session(req.session)
        if session is None:
            return "unknown_session", sup.no_session(req.session)
        if not session.run_over:
            return "busy", f"session {req.session} is running a turn"
    elif sup.config.agent(req.agent) is None:
        return "unknown_agent", sup.no_agent(req.agent)
    return None
