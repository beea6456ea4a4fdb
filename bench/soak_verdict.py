"""The soak's verdict: what each session's views must satisfy, and the report.

Kept apart from the driver (`bench.soak`), which collects `SessionRun`s and
`Kill`s; here they are checked and summed up, with no I/O.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from actors.core.machine import CANCEL_WHY, INTERRUPTED, WORKER_LOST
from actors.supervisor.dispatch import MAX_REDISPATCH
from bench.stats import machine, percentile
from bus.vocab import TERMINAL, CancelMode

#: The kinds of session (see `bench.soak.prompt`).
KINDS = ("shell", "slow_shell", "read", "list", "write", "multi", "talk", "plain", "cancel")


@dataclass
class SoakConfig:
    """What to run. `kill_plan`, when given, replaces the random killer: each
    `(at_s, actor)` is killed once `at_s` seconds after the first session started."""

    sessions: int = 200
    duration_s: float = 60.0
    kill_every_s: float = 3.0
    seed: int = 0
    viewers: int = 2
    llm_callers: int = 2
    executors: int = 2
    delta_delay_s: float = 0.01
    session_timeout_s: float = 120.0
    #: Host RSS growth allowed (a fraction); None: measured and reported, not checked,
    #: and no warm-up nor settling pauses (the test suite's short soak).
    rss_tolerance: float | None = 0.20
    kill_plan: list[tuple[float, str]] | None = None
    kinds: Sequence[str] = KINDS
    #: `[retention] max_sessions` of the host (None: retention left at its defaults,
    #: and disk not checked), applied every `retention_every_s`.
    retention_max_sessions: int | None = 20
    retention_every_s: float = 1.0




@dataclass
class SessionRun:
    """One session: what was asked, and what each viewer saw."""

    index: int
    kind: str
    prompt: str
    started_at: float = 0.0
    ended_at: float = 0.0
    session: str = ""
    from_seq: int = 0
    start_error: str = ""
    views: list[list[dict[str, Any]]] = field(default_factory=list)
    view_errors: list[str] = field(default_factory=list)
    stored: list[dict[str, Any]] = field(default_factory=list)
    #: Why the stored log could not be read back (e.g. pruned before it was).
    stored_error: str = ""
    #: A "cancel" run: what the cancel got ("ack: cancelled", or the error).
    cancel: str = ""

    def terminal(self) -> str:
        """The type of the first viewer's last event, if terminal ("" otherwise)."""
        last = self.views[0][-1]["type"] if self.views and self.views[0] else ""
        return last if last in TERMINAL else ""


@dataclass
class Kill:
    """One SIGKILL: when (s since the first session), whom, and how long it took to return."""

    at_s: float
    actor: str
    pid: int
    back_s: float = -1.0



#: Bytes a kept session may take in the host's database files per byte of its events
#: (as JSON): its events and history deltas once (the session log's records), its
#: history again in the run-end compaction, in SQLite pages that are partly empty.
DISK_PER_EVENT_BYTE = 6
#: The files with no session in them: schemas, first pages, tombstones of the pruned.
DISK_FIXED_BYTES = 256 * 1024


def peak_running(runs: list[SessionRun]) -> int:
    """The most sessions running at one time."""
    edges = sorted([(r.started_at, 1) for r in runs if r.ended_at]
                   + [(r.ended_at, -1) for r in runs if r.ended_at])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def disk_bound(config: SoakConfig, runs: list[SessionRun]) -> int | None:
    """The most the host's database files may hold with retention on (None: off): the
    sessions it keeps (`max_sessions`, plus those running), each at its mean size."""
    if config.retention_max_sessions is None:
        return None
    sizes = [sum(len(json.dumps(e)) for e in r.views[0]) for r in runs if r.views]
    mean = sum(sizes) / len(sizes) if sizes else 0.0
    kept = config.retention_max_sessions + peak_running(runs)
    return int(DISK_FIXED_BYTES + DISK_PER_EVENT_BYTE * kept * mean)


def check_run(run: SessionRun) -> list[str]:
    """What is wrong with one session's views (empty: nothing)."""
    where = f"session {run.index} ({run.kind}, {run.session or 'not started'})"
    if run.start_error:
        return [f"{where}: start failed: {run.start_error}"]
    problems = [f"{where}: {e}" for e in run.view_errors]
    for n, view in enumerate(run.views):
        seqs = [e["seq"] for e in view]
        if seqs != list(range(run.from_seq, run.from_seq + len(view))):
            problems.append(f"{where}: viewer {n} seqs not contiguous from {run.from_seq}: "
                            f"{_gaps(seqs, run.from_seq)}")
        terminals = [e["type"] for e in view if e["type"] in TERMINAL]
        if len(terminals) != 1 or not view or view[-1]["type"] not in TERMINAL:
            problems.append(f"{where}: viewer {n} terminal events {terminals}, "
                            f"last {view[-1]['type'] if view else 'none'}")
        if n and view != run.views[0]:
            problems.append(f"{where}: viewer {n} differs from viewer 0 "
                            f"({len(view)} vs {len(run.views[0])} events)")
    if run.stored_error and "(pruned)" not in run.stored_error:
        problems.append(f"{where}: the stored log cannot be read: {run.stored_error}")
    elif run.views and not run.stored_error and run.stored[:len(run.views[0])] != run.views[0]:
        problems.append(f"{where}: the stored log differs from what viewers saw "
                        f"({len(run.stored)} stored, {len(run.views[0])} seen)")
    if run.terminal() == "ERROR" and not explained_error(run):
        problems.append(f"{where}: ended in ERROR: {run.views[0][-1]['data']}")
    if run.kind == "cancel":
        problems += [f"{where}: {p}" for p in check_cancel(run)]
    elif run.terminal() == "CANCELLED":
        problems.append(f"{where}: CANCELLED, and nobody cancelled it")
    return problems


def check_cancel(run: SessionRun) -> list[str]:
    """A run cancelled once its tool started must end CANCELLED ("ui") if the cancel
    was acknowledged; it may have ended first (its executor killed, the tool failed,
    the model answered): then the cancel finds nothing running."""
    end = run.terminal()
    if run.cancel == "ack: cancelled":
        if end != "CANCELLED" or run.views[0][-1]["data"].get("mode") != CancelMode.UI:
            return [f"cancel acknowledged, but the run ended {end}"]
        return []
    if end in ("DONE", "ERROR") and "not_running" in run.cancel:
        return []
    return [f"cancel: {run.cancel or 'never sent (no TOOL_START)'}; the run ended {end}"]


def explained_error(run: SessionRun) -> str:
    """Why `run` legitimately ended in ERROR, or "" (then it is a problem).

    Legitimate: a model call re-issued `MAX_REDISPATCH` times, every llm caller it
    went to killed under it (the cap that stops a job that kills its workers).
    """
    view = run.views[0] if run.views else []
    if not view or view[-1]["type"] != "ERROR":
        return ""
    turn = view[max(i for i, e in enumerate(view) if e["type"] in ("TURN_START", "RESUMED")):]
    deaths = [e for e in turn if e["type"] == "RETRY"
              and str(e["data"].get("error", "")).startswith("llm caller")]
    if view[-1]["data"].get("error") == "worker_died" and len(deaths) >= MAX_REDISPATCH:
        return (f"the model call lost its llm caller {len(deaths) + 1} times (re-issued "
                f"{MAX_REDISPATCH} times, then failed)")
    return ""


#: A kill this close (in s) before a session started or after it ended may still be
#: what failed its tool call: the restarted actor's news reaches the run late.
KILL_MARGIN_S = 1.0


def explained_tool_error(run: SessionRun, output: str, kills: Sequence[Kill],
                         t0: float) -> str:
    """Why a tool call of `run` legitimately failed with `output`, or "" (a problem).

    Legitimate: the driver's own cancel of a "cancel" session; a supervisor killed
    while the session ran (the call is never run again: "interrupted"); the executor
    running the call killed under it. Anything else (a file the tools cannot read, a
    command that fails, a refusal) is a finding: the soak exercises the tools too.
    """
    if run.kind == "cancel" and output == CANCEL_WHY[CancelMode.UI]:
        return "the driver cancelled the run"

    def killed(prefix: str) -> bool:
        start, end = run.started_at - t0 - KILL_MARGIN_S, run.ended_at - t0 + KILL_MARGIN_S
        return any(k.actor.startswith(prefix) and start <= k.at_s <= end for k in kills)

    if output == INTERRUPTED and killed("supervisor"):
        return "the supervisor was killed while the call ran"
    # (A killed executor is "died" once its socket says so, "unreachable" when a
    # heartbeat to it finds it gone first: `dispatch._worker_died`.)
    lost = output == WORKER_LOST or output.endswith(("failed: executor died",
                                                     "failed: executor unreachable"))
    if lost and killed("executor"):
        return "its executor was killed while the call ran"
    return ""


def tool_error_problems(runs: Sequence[SessionRun], kills: Sequence[Kill],
                        t0: float) -> list[str]:
    """Every failed tool call (a `TOOL_END` with `is_error`) no kill or cancel explains."""
    problems = []
    for run in runs:
        for ev in run.views[0] if run.views else []:
            if ev["type"] != "TOOL_END" or not ev["data"].get("is_error"):
                continue
            output = str(ev["data"].get("output", ""))
            if not explained_tool_error(run, output, kills, t0):
                problems.append(f"session {run.index} ({run.kind}, {run.session}): tool "
                                f"{ev['data'].get('name')} failed unexplained: {output[:200]}")
    return problems


def trace(run: SessionRun) -> list[str]:
    """The first viewer's events of `run`, one short line each (seconds since the
    first), tokens left out (for the report)."""
    view = run.views[0] if run.views else []
    t0 = view[0]["ts"] if view else 0.0
    return [f"{e['seq']} +{e['ts'] - t0:.2f}s {e['type']} {json.dumps(e['data'])[:100]}"
            for e in view if e["type"] not in ("TOKEN", "THINKING")]


def _gaps(seqs: list[int], first: int) -> str:
    expected = first
    for s in seqs:
        if s != expected:
            return f"expected {expected}, got {s}"
        expected += 1
    return "ok"


def report(config: SoakConfig, got: dict[str, Any],
           orphans: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures as JSON, with `problems` (empty: the soak passed). `got`: what
    `bench.soak.drive` collected."""
    runs: list[SessionRun] = got["runs"]
    kills: list[Kill] = got["kills"]
    problems = [p for r in runs for p in check_run(r)] + got["kill_problems"]
    problems += tool_error_problems(runs, kills, got.get("t0", 0.0))
    first_views = [r.views[0] for r in runs if r.views]
    counts = Counter(e["type"] for v in first_views for e in v)
    # Tool calls that failed, by what they said (an executor killed mid-call: legitimate).
    tool_errors = Counter(str(e["data"].get("output", ""))[:60] for v in first_views for e in v
                          if e["type"] == "TOOL_END" and e["data"].get("is_error"))
    failed = [a["name"] for a in got["actors"] if a.get("state") == "failed"]
    problems += [f"actor {n} was marked failed" for n in failed]
    problems += [f"left after down: process {o['pid']} ({o['cmdline']})" if "pid" in o
                 else f"left after down: cgroup {o['cgroup']}" for o in orphans]
    before, after = got["rss_before"], got["rss_after"]
    growth = after["host"] / before["host"] - 1 if before["host"] else 0.0
    if config.rss_tolerance is not None and abs(growth) > config.rss_tolerance:
        problems.append(f"host RSS {before['host'] / 2**20:.1f} -> {after['host'] / 2**20:.1f} "
                        f"MiB ({growth:+.0%}), beyond {config.rss_tolerance:.0%}")
    # The databases' own size, their WAL folded in; the WAL files themselves are bounded
    # by SQLite's checkpoints, not by retention, and are reported beside it.
    disk = got["disk"]
    checked = sum(disk["pages"].values())
    bound = disk_bound(config, runs)
    if bound is not None and checked > bound:
        problems.append(f"database files hold {checked / 2**20:.2f} MiB, beyond the "
                        f"{bound / 2**20:.2f} MiB that {config.retention_max_sessions} kept "
                        f"sessions (and those running) account for: retention did not hold")
    durations = [r.ended_at - r.started_at for r in runs if r.ended_at]
    plan = asdict(config)
    plan["kinds"] = list(config.kinds)
    return {
        "config": plan,
        "machine": machine(),
        "sessions": {
            "total": len(runs),
            "started": sum(1 for r in runs if r.session),
            "start_failures": [r.start_error for r in runs if r.start_error],
            "by_kind": dict(Counter(r.kind for r in runs)),
            "terminal": dict(Counter(r.terminal() or "none" for r in runs)),
            "errors": [{"index": r.index, "kind": r.kind, "session": r.session,
                        "data": r.views[0][-1]["data"], "explained": explained_error(r),
                        "trace": trace(r)} for r in runs if r.terminal() == "ERROR"],
            "failed": [{"index": r.index, "kind": r.kind, "session": r.session,
                        "trace": trace(r)} for r in runs if check_run(r)],
            "duration_s": {"p50": percentile(durations, 50), "p95": percentile(durations, 95),
                           "max": max(durations, default=0.0)},
        },
        "warmup": got["warmup"],
        "events": {"total": sum(counts.values()), "RETRY": counts["RETRY"],
                   "RESUMED": counts["RESUMED"], "TOOL_END": counts["TOOL_END"],
                   "tool_errors": sum(tool_errors.values()),
                   "tool_errors_unexplained": len(tool_error_problems(runs, kills,
                                                                      got.get("t0", 0.0))),
                   "tool_errors_by_output": dict(tool_errors),
                   "retry_errors": dict(Counter(e["data"].get("error", "")[:60] for v in first_views
                                                for e in v if e["type"] == "RETRY"))},
        "kills": {"total": len(kills),
                  "per_actor": dict(Counter(k.actor for k in kills)),
                  "list": [asdict(k) for k in kills],
                  "back_s_max": max((k.back_s for k in kills), default=0.0)},
        "restarts": {a["name"]: a["restarts"] for a in got["actors"]},
        "failed_actors": failed,
        "time": {"sessions_s": round(got["sessions_s"], 2), "run_s": round(got["run_s"], 2)},
        "rss": {"before": before, "after": after, "host_growth": growth},
        "disk": {"files": disk["files"], "pages": disk["pages"], "checked": checked,
                 "bound": bound,
                 "peak_running": peak_running(runs),
                 "pruned_before_read": sum(1 for r in runs if r.stored_error)},
        "stats": got["stats"],
        "orphans": orphans,
        "problems": problems,
        "ok": not problems,
    }


def summary(rep: dict[str, Any]) -> str:
    """The report for a person."""
    s, k, e, rss = rep["sessions"], rep["kills"], rep["events"], rep["rss"]
    mib = 2**20
    lines = [
        f"soak: {s['total']} sessions over {rep['config']['duration_s']:g} s, "
        f"{rep['config']['viewers']} viewers each, seed {rep['config']['seed']}; "
        f"load average {' '.join(f'{x:.2f}' for x in rep['machine']['loadavg'])}",
        f"  started {s['started']}, start failures {len(s['start_failures'])}; "
        f"terminal {s['terminal']}",
        f"  kills {k['total']}: {k['per_actor']} (slowest return {k['back_s_max']:.2f} s)",
        f"  events {e['total']}: RETRY {e['RETRY']}, RESUMED {e['RESUMED']}, "
        f"tool results {e['TOOL_END']} ({e['tool_errors']} errors, "
        f"{e['tool_errors_unexplained']} unexplained)",
        f"  time: last session ended {rep['time']['sessions_s']:.1f} s after the first "
        f"started; session p50 {s['duration_s']['p50']:.2f} s, p95 "
        f"{s['duration_s']['p95']:.2f} s, max {s['duration_s']['max']:.2f} s",
        f"  RSS host {rss['before']['host'] / mib:.1f} -> {rss['after']['host'] / mib:.1f} MiB "
        f"({rss['host_growth']:+.1%}); all processes {rss['before']['total'] / mib:.1f} -> "
        f"{rss['after']['total'] / mib:.1f} MiB",
        f"  restarts {rep['restarts']}; orphans after down: {len(rep['orphans'])}",
        f"  disk: databases {rep['disk']['checked'] / mib:.2f} MiB (bound "
        + (f"{rep['disk']['bound'] / mib:.2f} MiB" if rep["disk"]["bound"] is not None
           else "none: retention at its defaults")
        + f"), all files {sum(rep['disk']['files'].values()) / mib:.2f} MiB; "
        f"{rep['disk']['pruned_before_read']} session(s) pruned before read back",
    ]
    for err in s["errors"]:
        why = f"; explained: {err['explained']}" if err["explained"] else "; UNEXPLAINED"
        lines.append(f"  ERROR in session {err['index']} ({err['kind']}): {err['data']}{why}")
    lines.append("  OK" if rep["ok"] else f"  FAILED: {len(rep['problems'])} problems")
    lines += [f"    - {p}" for p in rep["problems"][:40]]
    return "\n".join(lines)
