"""`GET /metrics`: the host's figures in the Prometheus text format (`prometheus_client`).

Everything is read at each scrape, so a gateway restart resets nothing but its own
figures (SSE streams, cancel timings, scrape errors, its process's RSS and CPU):

- **What the events add up to**, counted by the broadcaster as it publishes them
  (`actors.eventcounts`, the `counts` of its `Stats` answer): runs by terminal
  type, cancels by mode, turns, tool calls by tool and outcome with their
  durations, model retries by cause, turn ends by stop reason, runs ended in
  error by code, tokens by kind (when `TURN_END` carries `usage`), cost, events by
  type. They count since the broadcaster started: **they reset when the
  broadcaster restarts** (Prometheus' `rate()` and `increase()` handle a counter
  reset); `oploop_gateway_events_missed` counts the events it could not recover
  (and so did not count). Absent from a scrape the broadcaster did not answer.
- **The host's state**, from the supervisor, the broadcaster and the host's
  status file: sessions by state, viewers, actor restarts and state, events the
  broadcaster recovered or lost (actor restarts count since the host started; the
  broadcaster's since it started).
- **The gateway's own**: SSE streams, and the time from a cancel it forwarded to
  the session's CANCELLED event (`cancel_seconds`: the gateway follows each session
  it cancelled until then, `Gateway.time_cancel`).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
from collections.abc import Iterator
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
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from actors.eventcounts import TOOL_BUCKETS
from actors.usage import Usage
from bus.client import Client
from bus.errors import BusError

log = logging.getLogger("oploop.gateway")

# No `_created` series beside every counter: twice the scrape for a figure nobody graphs.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: A scrape waits this long for the supervisor or the broadcaster.
SCRAPE_TIMEOUT_S = 2.0
#: The states a session is listed in (`Session.state`): each exported, 0 when none is.
SESSION_STATES = ("running", "idle")
#: The host's status file (`actors.host.actor.STATE_FILE`, not imported: the host's
#: module is not the gateway's to load).
HOST_STATE = "host.json"


class EventCounters:
    """The broadcaster's event counts of the last scrape, as Prometheus metrics (a
    custom collector: the counts are the broadcaster's, set, never incremented here)."""

    def __init__(self) -> None:
        self.counts: dict[str, Any] | None = None

    def describe(self) -> list[Any]:
        """Nothing up front: the families depend on what the broadcaster said."""
        return []

    def collect(self) -> Iterator[Any]:
        """The families of `counts` (none when the broadcaster did not answer)."""
        c = self.counts
        if c is None:
            return
        yield _counter("oploop_events", "Events published, by type", ["type"], c["events"])
        yield _counter("oploop_runs", "Runs ended, by terminal event", ["terminal"], c["runs"])
        yield _counter("oploop_run_errors", "Runs ended in ERROR, by error code", ["error"],
                       c["errors"])
        yield _counter("oploop_cancels", "Runs cancelled, by mode", ["mode"], c["cancels"])
        yield _counter("oploop_turns", "Turns started", [], {"": c["turns"]})
        yield _counter("oploop_turn_ends", "Turns ended (model replies), by stop reason",
                       ["stop"], c["turn_ends"])
        yield _counter("oploop_tool_calls", "Tool calls ended, by tool and outcome",
                       ["tool", "outcome"], c["tool_calls"])
        seconds = HistogramMetricFamily("oploop_tool_call_duration_seconds",
                                        "Tool call durations, by tool", labels=["tool"])
        for tool, row in sorted(c["tool_seconds"].items()):
            counts, total = row[:-1], row[-1]
            cumulative = list(itertools.accumulate(counts))
            bounds = [floatToGoString(b) for b in TOOL_BUCKETS] + ["+Inf"]
            seconds.add_metric([tool], list(zip(bounds, cumulative, strict=True)), total)
        yield seconds
        yield _counter("oploop_model_retries", "Model calls retried, by cause", ["cause"],
                       c["retries"])
        yield _counter("oploop_tokens", "Model tokens, by kind (TURN_END usage)", ["kind"],
                       c["tokens"])
        yield _counter("oploop_model_cost_usd", "Estimated model cost in USD (TURN_END "
                       "usage, priced by the host; calls of unpriced models not included)",
                       [], {"": c["cost"]})
        yield _counter("oploop_gateway_events_missed", "Events not counted above (the "
                       "broadcaster lost them: never published)", [], {"": c["missed"]})


def _counter(name: str, doc: str, labels: list[str], values: dict[str, float]
             ) -> CounterMetricFamily:
    """A counter family; a key of `values` holds its label values joined by NUL."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key.split("\0") if labels else [], value)
    return family


class Metrics:
    """The gateway's registry: the broadcaster's event counts and the host's state,
    read at each `scrape`, and the gateway's own figures."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # the gateway's own RSS and CPU
        r = self.registry
        self.counted = EventCounters()
        r.register(self.counted)  # type: ignore[arg-type]
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
            "From a cancel the gateway forwarded to the session's CANCELLED event",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r)
        self.scrape_errors = Counter("oploop_gateway_scrape_errors",
                                     "Scrapes where a source did not answer", ["source"],
                                     registry=r)

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
        self.counted.counts = None
        try:
            stats = await client.broadcaster_stats(timeout=SCRAPE_TIMEOUT_S)
            self.viewers.set(int(stats.get("viewers", 0)))
            self.backfilled.set(int(stats.get("recovered", 0)))
            self.lost.set(int(stats.get("lost", 0)))
            counts = stats.get("counts")
            if isinstance(counts, dict):
                self.counted.counts = {**counts, "missed": int(stats.get("lost", 0))}
        except BusError as exc:
            self.scrape_errors.labels("broadcaster").inc()
            log.warning("metrics: the broadcaster did not answer: %s", exc)
        self._read_host(run_dir)
        try:
            return generate_latest(self.registry)
        except (KeyError, TypeError, ValueError) as exc:  # counts of another shape
            log.warning("metrics: the broadcaster's counts are unreadable: %s", exc)
            self.counted.counts = None
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
