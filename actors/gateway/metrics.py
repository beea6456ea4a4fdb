"""`GET /metrics`: the host's figures in the Prometheus text format (`prometheus_client`).

Two sources, and they differ on restarts:

- **Counted from the live event stream** (`Metrics.observe`, fed by the gateway's
  subscription to every session): runs by terminal type, cancels by mode, turns,
  tool calls by tool and outcome with their durations, model retries by cause,
  turn ends by stop reason, runs ended in error by code,
  tokens by kind (when `TURN_END` carries `usage`), events by type. They count
  what this gateway saw since it started: **they reset when the gateway restarts**
  (Prometheus' `rate()` and `increase()` handle a counter reset), and events the
  live stream dropped under load are not counted (`oploop_gateway_events_missed`
  counts those, from the gaps in each session's seq).
- **Read at each scrape** from the supervisor, the broadcaster and the host's
  status file: sessions by state, viewers, actor restarts and state, events the
  broadcaster recovered or lost. These are the host's own figures and do not reset
  with the gateway (actor restarts count since the host started; the broadcaster's
  since it started).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.process_collector import ProcessCollector

from actors.usage import Usage
from bus.client import Client
from bus.errors import BusError
from bus.vocab import TERMINAL, CancelMode, EventType

log = logging.getLogger("oploop.gateway")

# No `_created` series beside every counter: twice the scrape for a figure nobody graphs.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: Distinct values kept for a label a model can choose (a tool's name, a retry's
#: cause); the rest are counted as "other", so a model cannot grow the scrape.
MAX_LABELS = 64
#: Sessions whose last seq is remembered to notice gaps (least recently seen forgotten).
MAX_TRACKED = 10_000
#: A scrape waits this long for the supervisor or the broadcaster.
SCRAPE_TIMEOUT_S = 2.0
#: Tool call durations (seconds).
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: The kinds of a `usage` that are counted as tokens.
TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
               "cache_read_input_tokens")
#: The states a session is listed in (`Session.state`): each exported, 0 when none is.
SESSION_STATES = ("running", "idle")
#: The host's status file (`actors.host.actor.STATE_FILE`, not imported: the host's
#: module is not the gateway's to load).
HOST_STATE = "host.json"


class _Labels:
    """At most `MAX_LABELS` distinct values; later new ones become "other"."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= MAX_LABELS:
            return "other"
        self.seen.add(value)
        return value


class Metrics:
    """The gateway's registry: counters fed by `observe`, gauges filled by `scrape`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # the gateway's own RSS and CPU
        r = self.registry
        self.events = Counter("oploop_events", "Events seen on the live stream, by type",
                              ["type"], registry=r)
        self.runs = Counter("oploop_runs", "Runs ended, by terminal event", ["terminal"],
                            registry=r)
        self.errors = Counter("oploop_run_errors", "Runs ended in ERROR, by error code",
                              ["error"], registry=r)
        self.cancels = Counter("oploop_cancels", "Runs cancelled, by mode", ["mode"], registry=r)
        self.turns = Counter("oploop_turns", "Turns started", registry=r)
        self.turn_ends = Counter("oploop_turn_ends", "Turns ended (model replies), by stop "
                                 "reason", ["stop"], registry=r)
        self.tool_calls = Counter("oploop_tool_calls", "Tool calls ended, by tool and outcome",
                                  ["tool", "outcome"], registry=r)
        self.tool_seconds = Histogram("oploop_tool_call_duration_seconds",
                                      "Tool call durations, by tool", ["tool"],
                                      buckets=TOOL_BUCKETS, registry=r)
        self.retries = Counter("oploop_model_retries", "Model calls retried, by cause",
                               ["cause"], registry=r)
        self.tokens = Counter("oploop_tokens", "Model tokens, by kind (TURN_END usage)",
                              ["kind"], registry=r)
        self.cost = Counter("oploop_model_cost_usd", "Estimated model cost in USD (TURN_END "
                            "usage, priced by the host; calls of unpriced models not "
                            "included)", registry=r)
        self.missed = Counter("oploop_gateway_events_missed",
                              "Events the gateway's live stream skipped (not counted above)",
                              registry=r)
        self.sse_clients = Gauge("oploop_gateway_sse_clients", "SSE streams open", registry=r)
        self.sse_dropped = Counter("oploop_gateway_sse_dropped",
                                   "SSE clients dropped for reading too slowly", registry=r)
        self.sessions = Gauge("oploop_sessions", "Sessions by state (the supervisor's list)",
                              ["state"], registry=r)
        self.sessions_cost = Gauge("oploop_sessions_cost_usd",
                                   "Estimated cost in USD of the sessions listed (the "
                                   "supervisor's totals; unpriced ones not included)",
                                   registry=r)
        self.viewers = Gauge("oploop_viewers", "Viewers subscribed at the broadcaster",
                             registry=r)
        self.backfilled = Gauge("oploop_broadcaster_events_recovered",
                                "Events the broadcaster fetched again from the supervisor "
                                "(since it started)", registry=r)
        self.lost = Gauge("oploop_broadcaster_events_lost",
                          "Events the broadcaster could not recover (since it started)",
                          registry=r)
        self.actor_restarts = Gauge("oploop_actor_restarts",
                                    "Restarts of each actor since the host started",
                                    ["actor"], registry=r)
        self.actor_up = Gauge("oploop_actor_up", "1 while the actor runs, by actor and state",
                              ["actor", "state"], registry=r)
        self.cancel_seconds = Histogram(
            "oploop_gateway_cancel_seconds",
            "From a cancel the gateway forwarded to the CANCELLED event on the live stream",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r)
        self.scrape_errors = Counter("oploop_gateway_scrape_errors",
                                     "Scrapes where a source did not answer", ["source"],
                                     registry=r)
        # Known label values from the start, at 0: a rate over a series that appears
        # only with its first event misses that event (and a dashboard shows no line).
        for terminal in sorted(TERMINAL):
            self.runs.labels(terminal)
        for mode in CancelMode:
            self.cancels.labels(mode.value)
        for name in TOKEN_KINDS:
            self.tokens.labels(name.removesuffix("_tokens"))
        self._tool = _Labels()
        self._cause = _Labels()
        self._stop = _Labels()
        self._error = _Labels()
        self._last_seq: collections.OrderedDict[str, int] = collections.OrderedDict()
        #: Cancels forwarded and not yet seen ended: session -> when (monotonic).
        self._cancels: collections.OrderedDict[str, float] = collections.OrderedDict()

    def cancel_sent(self, session: str) -> None:
        """A cancel of `session` is being forwarded (its CANCELLED ends the timing)."""
        self._cancels.pop(session, None)
        self._cancels[session] = time.monotonic()
        if len(self._cancels) > MAX_TRACKED:
            self._cancels.popitem(last=False)

    def cancel_refused(self, session: str) -> None:
        """The cancel of `session` was refused (not running...): no CANCELLED will come."""
        self._cancels.pop(session, None)

    # -- the event stream --------------------------------------------------------------

    def observe(self, ev: dict[str, Any]) -> None:
        """Count one event of the live stream (`Client.live`)."""
        self._track(ev["session"], ev["seq"])
        kind, data = ev["type"], ev.get("data") or {}
        self.events.labels(kind).inc()
        if kind == EventType.TURN_START:
            self.turns.inc()
        elif kind == EventType.TOOL_END:
            tool = self._tool(str(data.get("name", "")))
            outcome = "error" if data.get("is_error") else "ok"
            self.tool_calls.labels(tool, outcome).inc()
            duration = data.get("duration_ms")
            if isinstance(duration, int | float) and duration >= 0:
                self.tool_seconds.labels(tool).observe(duration / 1000)
        elif kind == EventType.RETRY:
            cause = str(data.get("error", "")).partition(":")[0].strip() or "unknown"
            self.retries.labels(self._cause(cause[:64])).inc()
        elif kind == EventType.TURN_END:
            self.turn_ends.labels(self._stop(str(data.get("stop", ""))[:64] or "none")).inc()
            usage = data.get("usage")
            if isinstance(usage, dict):
                for name in TOKEN_KINDS:
                    n = usage.get(name)
                    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                        self.tokens.labels(name.removesuffix("_tokens")).inc(n)
                cost = usage.get("cost_usd")
                if isinstance(cost, int | float) and not isinstance(cost, bool) and cost > 0:
                    self.cost.inc(cost)
        elif kind in TERMINAL:
            self.runs.labels(kind).inc()
            sent = self._cancels.pop(ev["session"], None)
            if sent is not None and kind == EventType.CANCELLED:
                self.cancel_seconds.observe(time.monotonic() - sent)
            if kind == EventType.ERROR:
                self.errors.labels(self._error(str(data.get("error", ""))[:64] or "none")).inc()
            if kind == EventType.CANCELLED:
                mode = str(data.get("mode", ""))
                self.cancels.labels(mode if mode in CancelMode._value2member_map_
                                    else "other").inc()

    def _track(self, session: str, seq: int) -> None:
        last = self._last_seq.pop(session, None)
        if last is not None and seq > last + 1:
            self.missed.inc(seq - last - 1)
        self._last_seq[session] = max(seq, last or 0)
        if len(self._last_seq) > MAX_TRACKED:
            self._last_seq.popitem(last=False)

    # -- at scrape ---------------------------------------------------------------------

    async def scrape(self, client: Client, run_dir: Path) -> bytes:
        """Read the host's current figures, then render the whole registry."""
        self.sessions.clear()
        try:
            listed = await client.sessions(timeout=SCRAPE_TIMEOUT_S)
            states = collections.Counter({state: 0 for state in SESSION_STATES})
            states.update(str(s.get("state", "")) for s in listed)
            for state, n in states.items():
                self.sessions.labels(state).set(n)
            self.sessions_cost.set(sum(Usage.from_dict(s.get("usage")).cost or 0.0
                                       for s in listed))
        except BusError as exc:
            self.scrape_errors.labels("supervisor").inc()
            log.warning("metrics: the supervisor did not answer: %s", exc)
        try:
            stats = await client.broadcaster_stats(timeout=SCRAPE_TIMEOUT_S)
            self.viewers.set(int(stats.get("viewers", 0)))
            self.backfilled.set(int(stats.get("recovered", 0)))
            self.lost.set(int(stats.get("lost", 0)))
        except BusError as exc:
            self.scrape_errors.labels("broadcaster").inc()
            log.warning("metrics: the broadcaster did not answer: %s", exc)
        self._read_host(run_dir)
        return generate_latest(self.registry)

    def _read_host(self, run_dir: Path) -> None:
        self.actor_restarts.clear()
        self.actor_up.clear()
        try:
            state = json.loads((run_dir / HOST_STATE).read_text())
            actors = list(state["actors"])
        except (OSError, ValueError, KeyError, TypeError):
            self.scrape_errors.labels("host").inc()
            return
        for a in actors:
            name = str(a.get("name", ""))
            self.actor_restarts.labels(name).set(int(a.get("restarts", 0)))
            self.actor_up.labels(name, str(a.get("state", ""))).set(
                1 if a.get("state") == "running" else 0)
