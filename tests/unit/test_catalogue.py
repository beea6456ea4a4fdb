"""The executors' tool catalogue as the dispatcher keeps it: the union per machine is
kept between turns and dropped at every change (an executor came, went, or changed
its tools), so a turn never offers a stale set."""

from __future__ import annotations

import asyncio

from actors.supervisor.catalogue import Catalogue, mcp_servers
from actors.supervisor.jobstate import WorkerState
from actors.tools.spec import ToolSpec
from bus.messages import ToolsChanged


def spec(name: str) -> dict[str, object]:
    return ToolSpec(name, name, {"type": "object", "properties": {}}, (), False, False).to_wire()


def names(specs: list[dict[str, object]]) -> list[str]:
    return sorted(str(s["name"]) for s in specs)


def test_the_union_follows_every_change():
    async def body() -> None:
        catalogue = Catalogue()
        workers = {b"e1": WorkerState(b"e1", "tool", 4, [spec("shell")])}
        assert names(catalogue.specs(workers.values(), "local")) == ["shell"]

        catalogue.tools_changed(workers[b"e1"], ToolsChanged(
            tools=[spec("shell"), spec("mcp__db__query")], servers=[{"name": "db"}]))
        assert catalogue.event.is_set()
        assert names(catalogue.specs(workers.values(), "local")) == ["mcp__db__query", "shell"]
        assert mcp_servers(workers.values())[0]["executor"] == "e1"

        workers[b"e2"] = WorkerState(b"e2", "tool", 4, [spec("read_file")], machine="E")
        catalogue.changed()  # (the dispatcher's word for a worker that came)
        assert names(catalogue.specs(workers.values(), None)) == [
            "mcp__db__query", "read_file", "shell"]
        assert names(catalogue.specs(workers.values(), "E")) == ["read_file"]

        del workers[b"e1"]
        catalogue.changed()
        assert catalogue.specs(workers.values(), "local") == []

    asyncio.run(body())


def test_a_caller_extending_its_list_leaves_the_kept_union_alone():
    async def body() -> None:
        catalogue = Catalogue()
        workers = [WorkerState(b"e1", "tool", 4, [spec("shell")])]
        first = catalogue.specs(workers, "local")
        first.append(spec("ask_machine"))
        assert names(catalogue.specs(workers, "local")) == ["shell"]

    asyncio.run(body())


def test_an_llm_caller_changes_nothing_and_a_bad_spec_is_left_out():
    async def body() -> None:
        catalogue = Catalogue()
        llm = WorkerState(b"l1", "llm", 4, [])
        catalogue.tools_changed(llm, ToolsChanged(tools=[spec("shell")]))
        assert not catalogue.event.is_set() and llm.tools == []
        tool = WorkerState(b"e1", "tool", 4, [])
        catalogue.tools_changed(tool, ToolsChanged(tools=[spec("shell"), {"name": 3}]))
        assert names(catalogue.specs([tool], "local")) == ["shell"]

    asyncio.run(body())
