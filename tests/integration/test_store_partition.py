"""A host cut off from the store (`actors/supervisor/ownership.py`): hosts in network
namespaces, for real.

The cluster listens on TCP at the outer end of a veth pair (and on its unix socket);
host A runs inside the namespace and reaches the store over the veth, host B outside
over the unix socket. A runs a session in a tool call; the link is cut (the veth's far
end down: packets dropped, no RST). A cannot renew: it stops the session's work (its
tool killed) before its lease can lapse in the store, while still cut off; B claims
the session when the lease lapses and resumes it. Once the link is mended, A finds the
lease gone and writes nothing: in the table no record of a stale epoch after the
claim, no seq twice.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from homes import make_home, remove_home
from hostkit import of_type, oploop, running_host, unique_mark, until, workspace
from peerkit import Namespace, host_in, namespaces_usable
from ports import free_ports
from test_failover import assert_resumed_as_after_a_restart, check_the_table, watch_to_the_end

from bench import pgcluster
from bus.client import Client

pytestmark = pytest.mark.timeout(300)

MARK = unique_mark()
OK = {"reply": "carried on", "stop_reason": "end_turn"}
TOOL = {"reply": [{"type": "tool_use", "name": "shell",
                   "input": {"command": f"touch started; exec sleep {MARK}0"}}]}


def marked() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(MARK in part for part in p.info["cmdline"] or ())]


@pytest.fixture
def lab(tmp_path):
    """A namespace joined by a veth pair, a cluster listening on its outer end, and the
    two homes' environments (A: over TCP, from inside; B: the unix socket)."""
    why = pgcluster.unavailable() or namespaces_usable()
    if why:
        pytest.skip(why)
    with Namespace() as ns:
        cluster = pgcluster.PgCluster.start(listen=ns.outer, port=free_ports(ns.outer, 1))
        homes = [make_home("opna-"), make_home("opnb-")]
        envs = []
        for home, url, script in ((homes[0], cluster.tcp_url, [TOOL, OK]),
                                  (homes[1], cluster.url, [OK])):
            scenario = Path(home) / "scenario.json"
            scenario.write_text(json.dumps({"scripts": {"tool": script}}))
            envs.append({"OPLOOP_STORE": url, "OPLOOP_OFFLINE_SCENARIO": str(scenario)})
        try:
            yield ns, cluster, homes, envs
        finally:
            cluster.stop()
            for home in homes:
                remove_home(Path(home))


def logged_at(line: str) -> float:
    """The Unix time of a host.log line."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_host_cut_off_from_the_store_stops_and_writes_nothing_after(lab, tmp_path):
    ns, cluster, (a, b), (env_a, env_b) = lab
    log_a = Path(a) / "host.log"
    with running_host(b, env_b), host_in(ns, a, env_a):
        async def tool_started() -> str:
            async with Client.connect(Path(a)) as client:
                run = await client.start("#tool go", cwd=str(tmp_path),
                                         host=(Path(a) / "host-id").read_text().strip())
                async for event in client.events(run.session, 1, stop_at="first"):
                    if event["type"] == "TOOL_START":
                        return run.session
            raise AssertionError("the run ended before its tool started")

        sid = asyncio.run(tool_started())
        asyncio.run(until(lambda: (workspace(a, sid) / "started").exists() and marked(),
                          what="the tool"))
        ns.cut()
        cut_at = time.time()
        try:
            events = asyncio.run(watch_to_the_end(b, sid))
            # Still cut off: A has stopped the session's work (its tool is gone).
            asyncio.run(until(lambda: "session(s) stop here" in log_a.read_text()
                              and not marked(), what="A to stop the session"))
        finally:
            ns.mend()
        assert_resumed_as_after_a_restart(events)
        (stopped,) = [logged_at(line) for line in log_a.read_text().splitlines()
                      if "session(s) stop here" in line]
        claimed = float(re.search(r"claimed at ([\d.]+)",
                                  (Path(b) / "host.log").read_text()).group(1))
        (resumed,) = of_type(events, "RESUMED")
        print(f"cut 0.00 s, A stops its session +{stopped - cut_at:.2f} s, B claims "
              f"+{claimed - cut_at:.2f} s, RESUMED +{resumed['ts'] - cut_at:.2f} s")
        # A renews again over the mended link (then it has tried its pending commit).
        asyncio.run(until(lambda: json.loads(oploop(a, "status", "--json", env=env_a).stdout)
                          ["store"].get("renewing"), what="A to renew again"))
        epochs = check_the_table(cluster.url, sid, events)
        assert epochs[0] < epochs[-1]  # A's records, then B's: none of A's after the claim
