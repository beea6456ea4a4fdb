"""Worker machines (issue 20 items 1, 2 and the worker half of 4): a host in one
network namespace, `oploop worker` machines in others, links cut for real.

Every tool that must run on machine B reports where it ran: B's shell may use
B's network (its `sandbox.toml`), so `cat /proc/net/dev` lists B's interface.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from homes import make_home, remove_home
from hostkit import assert_one_run, of_type, processes_with, run, wait_until
from machines_lab import (
    OPLOOP,
    PORT,
    WorkerMachineProc,
    _env,
    hub_host,
    issue_key,
    machines,
    oploop_in,
    wait_machine,
)

from bench.netlink import Lab, unavailable
from bus.client import Client

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"no network namespaces: {unavailable()}")


@pytest.fixture(scope="module")
def lab():
    """The host in the hub; machine B serving it (one executor); C and D linked, idle."""
    with Lab() as lab:
        for name in ("B", "C", "D"):
            lab.add_machine(name)
        home = make_home("opm-")
        far = Path(make_home("opb-"))
        try:
            with hub_host(lab, home):
                keys = issue_key(home, "B", "worker")
                b = WorkerMachineProc(lab, "B", far, keys)
                try:
                    asyncio.run(wait_machine(home, "B", "up", tools=1))
                    yield lab, home, b
                finally:
                    b.stop()
                    assert "Traceback" not in b.log.read_text(), b.log.read_text()
        finally:
            remove_home(Path(home))
            remove_home(far)


def where(events) -> str:
    """The output of the run's tool (`cat /proc/net/dev`): the interfaces it saw."""
    ends = of_type(events, "TOOL_END")
    assert len(ends) == 1, ends
    return ends[0]["data"]["output"]


def test_tools_aimed_at_a_machine_run_there_and_others_here(lab):
    lab, home, _ = lab
    b = lab.machines["B"]
    events = run(home, "run `cat /proc/net/dev`", machine="B")
    assert events[-1]["type"] == "DONE"
    assert b.iface in where(events)  # B's interface: it ran in B's namespace
    assert of_type(events, "TOOL_START")[0]["data"]["machine"] == "B"
    assert of_type(events, "TOOL_END")[0]["data"]["machine"] == "B"
    assert not of_type(events, "TOOL_END")[0]["data"]["is_error"]

    here = run(home, "run `cat /proc/net/dev`")  # not aimed: the host's own executor
    assert of_type(here, "TOOL_END")[0]["data"]["machine"] == "local"
    assert b.iface not in where(here)

    status = subprocess.run([*OPLOOP, "status", "--json"], env=_env(home), capture_output=True,
                            text=True, timeout=60, check=True)
    listed = {m["name"]: m for m in json.loads(status.stdout)["machines"]}
    assert listed["B"]["state"] == "up" and listed["B"]["address"] == b.address
    assert listed["B"]["workers"] == {"tool": 1} and listed["B"]["key"] == "worker:B"
    assert listed["B"]["last_heartbeat_ago_s"] < 30
    assert listed["local"]["workers"] == {"tool": 1, "llm": 1}
    cli = subprocess.run([*OPLOOP, "run", "--machine", "B", "run `cat /proc/net/dev`"],
                         env=_env(home), capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "(on B)" in cli.stdout, cli.stdout + cli.stderr
    text = subprocess.run([*OPLOOP, "status"], env=_env(home), capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert any(line.split()[:2] == ["B", b.address] and line.endswith("up")
               for line in text.splitlines()), text


def test_no_executor_on_the_machine_fails_the_call_at_once(lab):
    lab, home, _ = lab
    events = run(home, "run `echo never`", machine="C")
    end = of_type(events, "TOOL_END")[0]["data"]
    assert end["is_error"] and end["output"] == "machine C has no executor connected"
    assert end["machine"] == "C"
    assert events[-1]["type"] == "DONE"  # the model was told, and answered
    bad = subprocess.run([*OPLOOP, "run", "--machine", "no/such", "run `true`"],
                         env=_env(home), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "machine name 'no/such'" in bad.stderr


def test_a_machine_lost_mid_tool_fails_that_call_then_serves_again(lab):
    lab, home, worker = lab
    mark = "oploop-lost-tool-7731"

    async def scenario():
        async with Client.connect(Path(home)) as client:
            started = await client.start(f"run `sleep 300; echo {mark}`", machine="B")
            events = []
            async for event in client.events(started.session, stop_at="first"):
                events.append(event)
                if event["type"] == "TOOL_START":
                    # On B, in its namespace: cut its link under the running tool.
                    await asyncio.to_thread(wait_until, lambda: processes_with(mark),
                                            "the tool on B")
                    lab.cut("B")
            return events

    try:
        events = asyncio.run(scenario())
        assert_one_run(events)
        end = of_type(events, "TOOL_END")[0]["data"]
        assert end["is_error"] and end["output"].startswith("machine B lost"), end
        assert events[-1]["type"] == "DONE"  # the session went on
        # B noticed the silence too: it stopped the tool, which is never run again.
        wait_until(lambda: not processes_with(mark), "B to stop the lost tool")
        assert asyncio.run(wait_machine(home, "B", "lost"))["workers"] == {}
    finally:
        lab.restore("B")
    asyncio.run(wait_machine(home, "B", "up", tools=1))
    again = run(home, "run `cat /proc/net/dev`", machine="B")
    assert lab.machines["B"].iface in where(again)
    assert worker.alive()  # the worker machine rode it out


def test_a_dead_worker_of_a_machine_is_restarted(lab):
    lab, home, worker = lab
    [executor] = worker.workers()
    executor.kill()
    wait_until(lambda: [p.pid for p in worker.workers()] not in ([], [executor.pid]),
               "the worker machine to restart its executor")
    [new] = worker.workers()

    async def served_by_the_new_one():
        while True:
            ids = (await wait_machine(home, "B", "up", tools=1))["worker_ids"]
            if [i.split("-")[1] for i in ids] == [str(new.pid)]:
                return
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(served_by_the_new_one(), 60))
    assert lab.machines["B"].iface in where(run(home, "run `cat /proc/net/dev`", machine="B"))


ATTEMPTS = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from bus.client import Client
    from bus.endpoints import Endpoints

    async def attempt(what):
        ends = Endpoints.elsewhere(sys.argv[1], Path(sys.argv[2]))
        try:
            async with Client.connect(endpoints=ends) as client:
                if what == "start":
                    await client.start("run `echo never`", timeout=90)
                elif what == "cancel":
                    await client.cancel("0" * 12, timeout=90)
                else:
                    await client.last_seq("0" * 12, timeout=90)
        except Exception as exc:
            return type(exc).__name__ + ": " + str(exc)
        return "allowed"

    async def main():
        print(json.dumps({w: await attempt(w) for w in ("start", "cancel", "watch")}))

    asyncio.run(main())
""")


def test_a_worker_key_serves_jobs_only(lab):
    lab, home, _ = lab
    b = lab.machines["B"]
    keys = Path(home) / "keys" / "issued" / "B"  # the key machine B serves with

    async def session_ids() -> set[str]:
        async with Client.connect(Path(home)) as client:
            return {s["session"] for s in await client.sessions()}
    before = asyncio.run(session_ids())
    done = subprocess.run(
        [*lab.in_ns(b.ns), sys.executable, "-c", ATTEMPTS, f"tcp://{b.hub_address}:{PORT}",
         str(keys)], env=_env(home), capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout)
    assert verdicts["start"].startswith("AccessDenied"), verdicts
    assert verdicts["cancel"].startswith("RemoteError") and "forbidden" in verdicts["cancel"]
    assert verdicts["watch"].startswith("AccessDenied"), verdicts

    # (other tests of the module start sessions too, one of them "run `echo never`")
    assert asyncio.run(session_ids()) == before  # the refused start made none


def test_a_refused_key_stops_oploop_worker_with_one_line(lab):
    lab, home, _ = lab
    eyes = issue_key(home, "eyes-for-d", "viewer")  # a real key, of the wrong role
    d = lab.machines["D"]
    far = Path(make_home("opd-"))
    try:
        done = oploop_in(lab, d.ns, far, "worker", "--connect",
                         f"tcp://{d.hub_address}:{PORT}", "--keys", str(eyes),
                         "--machine", "D", timeout=120)
        assert done.returncode == 1, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith("oploop:")]
        assert len(lines) == 1 and "refused the key" in lines[0], done.stderr
        assert "D" not in asyncio.run(machines(home))
    finally:
        remove_home(far)


def test_a_worker_key_serves_its_own_machine_only(lab):
    """B's key claiming machine C: refused by the supervisor, and `oploop worker`
    exits with one line, never saying it serves."""
    lab, home, _ = lab
    keys = Path(home) / "keys" / "issued" / "B"  # B's key, claiming to be machine C
    c = lab.machines["C"]
    far = Path(make_home("opc-"))
    try:
        done = oploop_in(lab, c.ns, far, "worker", "--connect",
                         f"tcp://{c.hub_address}:{PORT}", "--keys", str(keys),
                         "--machine", "C", timeout=120)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("oploop: "), done.stderr
        assert "refused machine C" in lines[0] and "serving" not in done.stderr
        log = (Path(home) / "host.log").read_text()
        assert "may serve machine 'B', not 'C'" in log
        assert "C" not in asyncio.run(machines(home))
        events = run(home, "run `cat /proc/net/dev`", machine="C")
        end = of_type(events, "TOOL_END")[0]["data"]
        assert end["output"] == "machine C has no executor connected"
        assert c.iface not in end["output"]
    finally:
        remove_home(far)


def test_an_unnamed_worker_with_a_worker_key_is_refused(lab):
    """An executor started by hand with B's key and no machine (it would serve as
    `local`, taking the host's own unaimed calls): refused, exit status 78; the
    host's unaimed calls still run on its own executor."""
    lab, home, _ = lab
    d = lab.machines["D"]
    keys = Path(home) / "keys" / "issued" / "B"
    far = Path(make_home("ope-"))
    try:
        env = {"OPLOOP_CONNECT": f"tcp://{d.hub_address}:{PORT}", "OPLOOP_KEYS": str(keys)}
        done = subprocess.run([*lab.in_ns(d.ns), sys.executable, "-m", "actors.executor"],
                              env=_env(far, env), capture_output=True, text=True,
                              timeout=120, cwd=Path(__file__).parents[2])
        assert done.returncode == 78, done.stderr  # EXIT_MACHINE_REFUSED
        assert "serves machine 'B' only" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert set(asyncio.run(machines(home))) == {"local", "B"}
        for _ in range(4):
            here = run(home, "run `cat /proc/net/dev`")
            assert of_type(here, "TOOL_END")[0]["data"]["machine"] == "local"
            assert d.iface not in where(here)
    finally:
        remove_home(far)
