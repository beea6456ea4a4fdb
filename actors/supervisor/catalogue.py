"""The tools and MCP servers the live executors offer, as the dispatcher keeps them.

Each executor announces its tool specs (`Ready`, then `ToolsChanged` when its MCP
servers change). Every model call offers the union of one machine's specs, so the
union is kept per machine and dropped whenever an executor comes, goes or changes
its tools (`changed`), instead of being built again for every turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from actors.bounds import MAX_CATALOGUE_BYTES, fit_catalogue
from actors.supervisor.jobstate import WorkerState
from actors.tools.spec import ToolSpec
from bus.messages import ToolsChanged

log = logging.getLogger("oploop.dispatch")

#: MCP server states kept per executor (a bound: they come from a worker).
MAX_SERVERS = 256


def valid_specs(peer: bytes, tools: list[Any]) -> list[dict[str, Any]]:
    """The well-formed tool specs of a `Ready`; a bad one is dropped (and logged), so
    a broken executor cannot put a request the API would refuse into every turn."""
    good = []
    for raw in tools:
        try:
            good.append(ToolSpec.from_wire(raw).to_wire())
        except ValueError as exc:
            log.warning("worker %r announced a bad tool spec: %s", peer, exc)
    good, over = fit_catalogue(good)  # (every definition goes in every request)
    if over:
        log.warning("worker %r announced %d tool(s) past %d bytes: left out", peer, over,
                    MAX_CATALOGUE_BYTES)
    return good


class Catalogue:
    """The union of the executors' tool specs per machine, kept until `changed`."""

    def __init__(self) -> None:
        #: Set at every change (a run waiting for its first executor waits on it).
        self.event = asyncio.Event()
        self._union: dict[str | None, list[dict[str, Any]]] = {}

    def changed(self) -> None:
        """An executor came, went or changed its tools: the unions are void."""
        self._union.clear()
        self.event.set()

    def specs(self, workers: Iterable[WorkerState], machine: str | None) -> list[dict[str, Any]]:
        """The tools the live executors of `machine` (None: of any) offer, the first
        announcer's spec per name. A new list each time: callers may extend it."""
        union = self._union.get(machine)
        if union is None:
            seen: dict[str, dict[str, Any]] = {}
            for worker in workers:
                if worker.role == "tool" and machine in (None, worker.machine):
                    for spec in worker.tools:
                        name = spec.get("name")
                        if isinstance(name, str) and name not in seen:
                            seen[name] = spec
            union = self._union[machine] = list(seen.values())
        return list(union)

    def tools_changed(self, worker: WorkerState, body: ToolsChanged) -> None:
        """An executor's tools changed (its MCP servers): the next turns offer the new
        set; its jobs in flight go on."""
        if worker.role != "tool":
            return
        worker.tools = valid_specs(worker.id, body.tools)
        worker.servers = [s for s in body.servers if isinstance(s, dict)][:MAX_SERVERS]
        self.changed()


def mcp_servers(workers: Iterable[WorkerState]) -> list[dict[str, Any]]:
    """The MCP servers of the live executors, with the executor and the machine each
    runs on (each machine's executors read that machine's own `[mcp]` tables)."""
    return [dict(server, executor=worker.id.decode(errors="replace"), machine=worker.machine)
            for worker in workers for server in worker.servers]
