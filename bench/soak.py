"""The soak: many sessions on a real host while its actors are killed at random.

    python -m bench.soak [--sessions 200] [--duration 60] [--kill-every 3] [--seed N]
                         [--json PATH]

A host is started as a user starts one (`oploop up --detach`, a fresh short
`$OPLOOP_HOME` under /tmp, the offline model), then `sessions` sessions are
started over `duration` seconds, a mix of tool calls (shell, read, list, write,
several at once, a slow shell call) and plain or long streamed replies. Every
session is followed by `viewers` independent clients (one `Client` each) from
its `from_seq` to its first terminal event. Meanwhile a killer SIGKILLs a
random actor every `kill_every` seconds (about), and waits for the host to
bring it back before the next kill, so that the restart-storm cap is not what
is tested.

Checked at the end (`problems` in the report; exit status 1 if any; the checks
live in `bench.soak_verdict`):
- every session has exactly one terminal event, and it is the last;
- each viewer's events of a session are contiguous in seq from `from_seq`, and
  every viewer's list is identical, and identical to the broadcaster's stored log;
- no session ends in ERROR, unless for a cause `bench.soak_verdict.explained_error`
  knows to be legitimate (a model call whose llm callers were all killed under it,
  more times than the dispatcher re-issues it); every ERROR is listed with its trace;
- every failed tool call is explained (`bench.soak_verdict.explained_tool_error`):
  the driver's cancel of a "cancel" session, or the supervisor or the call's
  executor killed while the session ran; the tools' data is in the sessions'
  working directory, named relative to it;
- every killed actor came back, and none was marked failed;
- after `oploop down`, no process the host ever had under it is left (the
  tree is sampled all along: actors, their children, sandboxed tool processes),
  nor a sandbox cgroup of any executor it ran;
- the RSS of the host process after the run is within `rss_tolerance` of before
  (measured after start-up and a warm-up session of each kind; the sum over
  every process is reported beside it);
- with retention on (`retention_max_sessions`, 20 by default, checked every
  second), the host's files on disk (journal and event store) stay within a
  bound set by the sessions kept, not by the sessions run
  (`bench.soak_verdict.disk_bound`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import uvloop

from actors.restarts import RestartPolicy
from actors.sandbox.workspaces import remove_home
from actors.storage import private_files
from bench.soak_verdict import Kill, SessionRun, SoakConfig, report, summary
from bus.client import Client


def victims(llm_callers: int, executors: int) -> list[str]:
    """Every actor of a host with the offline model, by the name the host gives it."""
    return ["supervisor", "broadcaster", "offline-model",
            *(f"llm-{i + 1}" for i in range(llm_callers)),
            *(f"executor-{i + 1}" for i in range(executors))]


#: The host marks an actor failed after `storm` deaths in `window_s` (`RestartPolicy`):
#: the killer keeps each actor well below that.
STORM_WINDOW_S, MAX_KILLS_IN_WINDOW = RestartPolicy.window_s, RestartPolicy.storm - 2

#: Words of the long streamed reply (`#talk` sessions), paced by the offline model.
TALK_WORDS = 200




# -- the workload ----------------------------------------------------------------------------


def prompt(kind: str, i: int, data: Path) -> str:
    """The prompt of session `i` of `kind` (the offline model's rules, or `#talk`)."""
    return {
        "shell": f"run `echo soak-{i}`",
        "slow_shell": f"run `sleep 0.8; echo slow-{i}`",
        "read": f"read {data}/notes.txt",
        "list": f"list {data}",
        "write": f"write soak-{i} to out-{i}.txt",
        "multi": f"list {data} and read {data}/notes.txt, then run `echo multi-{i}`",
        "talk": f"#talk {i}",
        "plain": f"hello number {i}",
        # cancelled (UI cancel) by the driver once its tool has started
        "cancel": f"run `sleep 30; echo never-{i}`",
    }[kind]


def write_workload(directory: Path, delta_delay_s: float) -> tuple[Path, Path]:
    """The files the sessions read and list, and the offline model's scenario: the
    rules answer every turn, streamed at `delta_delay_s` per delta so that kills land
    mid-stream; `#talk` sessions stream a long reply instead."""
    data = directory / "data"
    data.mkdir()
    (data / "notes.txt").write_text("".join(f"line {n} of the soak's notes\n" for n in range(20)))
    for name in ("a.txt", "b.txt", "c.txt"):
        (data / name).write_text(name)
    paced = {"reply": "rules", "delay_s": delta_delay_s}
    words = " ".join(f"word{n}" for n in range(TALK_WORDS))
    scenario = directory / "scenario.json"
    scenario.write_text(json.dumps({
        "description": "the soak: rules, paced; #talk streams a long reply",
        "turns": [paced] * 4,
        "scripts": {"talk": [{"reply": words, "delay_s": delta_delay_s}]},
    }))
    return data, scenario


# -- the host --------------------------------------------------------------------------------


class SoakHost:
    """A detached host in a fresh short `$OPLOOP_HOME`, and every process ever under it."""

    def __init__(self, directory: Path, scenario: Path, config: SoakConfig) -> None:
        # Unix socket paths are limited to ~107 bytes: the home stays short.
        self.home = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("ANTHROPIC_", "OPLOOP_"))}
        self.env.update(OPLOOP_HOME=str(self.home), OPLOOP_OFFLINE_SCENARIO=str(scenario),
                        OPLOOP_LLM_CALLERS=str(config.llm_callers),
                        OPLOOP_EXECUTORS=str(config.executors))
        self.directory = directory
        if config.retention_max_sessions is not None:
            (self.home / "oploop.toml").write_text(
                f"[retention]\nmax_sessions = {config.retention_max_sessions}\n"
                f'every = "{config.retention_every_s:g}s"\n')
        #: (pid, create_time) -> what it was, for every process seen under the host.
        self.seen: dict[tuple[int, float], str] = {}

    def oploop(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the CLI against this home."""
        return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)

    def up(self) -> None:
        """`oploop up --detach`; raises with the host's log when it fails."""
        done = self.oploop("up", "--detach")
        if done.returncode != 0:
            raise RuntimeError(f"oploop up failed: {done.stderr.strip()}\n{self.log_tail()}")
        self.sample()

    def down(self) -> None:
        """`oploop down` (once more the tree is sampled just before)."""
        self.sample()
        done = self.oploop("down")
        if done.returncode != 0:
            raise RuntimeError(f"oploop down failed: {done.stderr.strip()}")

    def remove(self) -> None:
        """Remove the home (after `down`)."""
        remove_home(Path(self.home))

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the host's log (every actor's stderr)."""
        path = self.home / "host.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def state(self) -> dict[str, Any]:
        """The host's state file (`{}` while it is being replaced or after down)."""
        try:
            data: dict[str, Any] = json.loads((self.home / "run" / "host.json").read_text())
        except (OSError, ValueError):
            return {}
        return data

    def actor(self, name: str) -> dict[str, Any]:
        """One actor's entry in the state file (`{}` if absent)."""
        return next((a for a in self.state().get("actors", []) if a["name"] == name), {})

    def sample(self) -> None:
        """Remember every process now under the host."""
        pid = self.state().get("pid")
        if not pid:
            return
        try:
            host = psutil.Process(pid)
            procs = [host, *host.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                key = (proc.pid, proc.create_time())
                if key not in self.seen:
                    self.seen[key] = " ".join(proc.cmdline())[:160]

    def orphans(self) -> list[dict[str, Any]]:
        """Processes seen under the host that still live (same pid and start time)."""
        left = []
        for (pid, created), what in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append({"pid": pid, "cmdline": what, "ppid": proc.ppid()})
            except psutil.Error:
                continue
        return left + self.cgroups_left()

    def cgroups_left(self) -> list[dict[str, Any]]:
        """Per-call sandbox cgroups (`<cgroup>/oploop-sandbox/ex-<pid>-<start>`) still there
        for an executor pid seen under the host (a killed executor's must go too)."""
        pids = {pid for pid, _ in self.seen}
        root = Path("/sys/fs/cgroup")
        left = []
        for depth in range(5):
            for path in root.glob("/".join(["*"] * depth + ["oploop-sandbox", "ex-*"])):
                with contextlib.suppress(ValueError, IndexError):
                    if int(path.name.split("-")[1]) in pids:
                        left.append({"cgroup": str(path)})
        return left

    def disk(self) -> dict[str, Any]:
        """Bytes of each of the host's database files (the session log, its WAL, its reserve),
        and the size each database has with its WAL folded in (`pages`: what its file
        holds once checkpointed; pages freed by deletions are reused, not returned)."""
        files = {path.name: path.stat().st_size for path in private_files(self.home)
                 if path.exists()}
        pages = {}
        for name in ("sessions.db",):
            path = self.home / name
            if not path.exists():
                continue
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                count = db.execute("PRAGMA page_count").fetchone()[0]
                size = db.execute("PRAGMA page_size").fetchone()[0]
            finally:
                db.close()
            pages[name] = count * size
        return {"files": files, "pages": pages}

    def rss(self) -> dict[str, Any]:
        """RSS of the host process, of each actor (by name), and their sum (bytes)."""
        state = self.state()
        names = {a["pid"]: a["name"] for a in state.get("actors", []) if a.get("pid")}
        names[state.get("pid")] = "host"
        per: dict[str, int] = {}
        for pid, name in names.items():
            with contextlib.suppress(psutil.Error, TypeError, ValueError):
                proc = psutil.Process(pid)
                # An actor with its children (an executor's sandboxes); the host alone.
                kids = proc.children(recursive=True) if name != "host" else []
                per[name] = proc.memory_info().rss + sum(c.memory_info().rss for c in kids)
        return {"host": per.get("host", 0), "total": sum(per.values()), "per_actor": per}


# -- the run ---------------------------------------------------------------------------------


async def follow(client: Client, run: SessionRun, patience_s: float,
                 canceller: bool = False) -> list[dict[str, Any]]:
    """One viewer's events of `run` from its `from_seq` to the first terminal event;
    the `canceller` cancels a "cancel" run once its tool has started."""
    events: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(patience_s):
            async for ev in client.events(run.session, run.from_seq, stop_at="first"):
                events.append(ev)
                if canceller and run.kind == "cancel" and ev["type"] == "TOOL_START":
                    await cancel(client, run)
    except TimeoutError:
        run.view_errors.append(f"no terminal event within {patience_s:g} s "
                               f"(last: {events[-1]['type'] if events else 'none'})")
    except Exception as exc:  # a viewer failing is a finding, not the end of the soak
        run.view_errors.append(f"viewer failed: {type(exc).__name__}: {exc}")
    return events


async def one_session(clients: list[Client], run: SessionRun, cwd: Path,
                      patience_s: float) -> None:
    """Start `run` through the first client, then follow it with every client at once."""
    run.started_at = time.monotonic()
    try:
        started = await clients[0].start(run.prompt, cwd=str(cwd))
    except Exception as exc:  # counted and reported: a start lost to a kill is a finding
        run.start_error = f"{type(exc).__name__}: {exc}"
        return
    run.session, run.from_seq = started.session, started.from_seq
    run.views = list(await asyncio.gather(*(follow(c, run, patience_s, canceller=n == 0)
                                            for n, c in enumerate(clients))))
    run.ended_at = time.monotonic()
    # Read back at once: with retention on, a finished session is deleted once enough
    # newer ones have run (the end of the soak would find most of them gone).
    with contextlib.suppress(Exception):  # a broadcaster killed now: retried at the end
        async with asyncio.timeout(patience_s):
            run.stored = await stored_log(clients[0], run)


async def cancel(client: Client, run: SessionRun) -> None:
    """UI-cancel `run`; what the supervisor said is kept for the verdict."""
    try:
        ack = await client.cancel(run.session)
        run.cancel = f"ack: {ack.state}"
    except Exception as exc:  # a lost cancel is a finding
        run.cancel = f"{type(exc).__name__}: {exc}"


class Killer:
    """SIGKILLs actors of `host`, one at a time, each after the previous one is back."""

    def __init__(self, host: SoakHost, config: SoakConfig, rng: random.Random) -> None:
        self.host, self.config, self.rng = host, config, rng
        self.names = victims(config.llm_callers, config.executors)
        self.kills: list[Kill] = []
        self.problems: list[str] = []

    def _plan(self) -> list[tuple[float, str | None]]:
        if self.config.kill_plan is not None:
            return list(self.config.kill_plan)
        every, out, t = self.config.kill_every_s, [], self.config.kill_every_s / 2
        while t < self.config.duration_s:
            out.append((t, None))
            t += every * self.rng.uniform(0.7, 1.3)
        return out

    def _pick(self, now: float) -> str | None:
        """A random actor not killed too often lately (None: every one was)."""
        recent = Counter(k.actor for k in self.kills if k.at_s > now - STORM_WINDOW_S)
        allowed = [n for n in self.names if recent[n] < MAX_KILLS_IN_WINDOW]
        return self.rng.choice(allowed) if allowed else None

    async def run(self, t0: float) -> None:
        """Follow the plan (times from `t0`, monotonic)."""
        for at_s, name in self._plan():
            await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
            now = time.monotonic() - t0
            name = name or self._pick(now)
            if name is None:
                continue
            pid = self.host.actor(name).get("pid")
            if not pid:
                self.problems.append(f"{name} has no pid to kill at {now:.1f} s")
                continue
            self.host.sample()  # the tree as it is, children of the victim included
            os.kill(pid, signal.SIGKILL)
            kill = Kill(round(now, 2), name, pid)
            self.kills.append(kill)
            if not await self.wait_back(name, pid):
                self.problems.append(f"{name} (killed at {now:.1f} s) did not come back: "
                                     f"{self.host.actor(name)}")
                return
            kill.back_s = round(time.monotonic() - t0 - now, 2)

    async def wait_back(self, name: str, old_pid: int, patience_s: float = 30.0) -> bool:
        """Wait until the host has restarted `name` (a new pid, running)."""
        end = time.monotonic() + patience_s
        while time.monotonic() < end:
            actor = self.host.actor(name)
            if actor.get("pid") not in (None, old_pid) and actor.get("state") == "running":
                return True
            if actor.get("state") == "failed":
                return False
            await asyncio.sleep(0.05)
        return False


async def sampler(host: SoakHost, stop: asyncio.Event) -> None:
    """Sample the host's process tree every 0.25 s until `stop` (short-lived tool
    processes may escape it; the executor's own children are what matters)."""
    while not stop.is_set():
        await asyncio.to_thread(host.sample)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def stored_log(client: Client, run: SessionRun) -> list[dict[str, Any]]:
    """The broadcaster's stored events of `run`, from its `from_seq` (no live part)."""
    out: list[dict[str, Any]] = []
    async for ev in client.events(run.session, run.from_seq, follow=False):
        out.append(ev)
    return out


async def why_gone(client: Client, session: str) -> str:
    """What the supervisor says of a session whose log is gone ("" if it still holds it)."""
    try:
        await client.inspect(session)
    except Exception as exc:  # RemoteError "no such session ... (pruned)", or a failure
        return f"{type(exc).__name__}: {exc}"
    return ""


async def drive(host: SoakHost, config: SoakConfig, data: Path) -> dict[str, Any]:
    """Warm up, measure, run the sessions under the killer, and collect everything."""
    rng = random.Random(config.seed)
    kinds = list(config.kinds)
    cwd = host.directory  # relative tool paths resolve here
    # The data as the tools name it: relative to the sessions' working directory (the
    # sandbox hides the host's /tmp, and binds only the working directory back in).
    data = data.relative_to(cwd)
    measure = config.rss_tolerance is not None
    out: dict[str, Any] = {"warmup": []}
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client.connect(host.home))
                   for _ in range(max(1, config.viewers))]
        if measure:
            # Warm-up: one session of each kind, so that one-off costs (imports, first
            # sandbox, caches) are paid before RSS is measured.
            warm = [SessionRun(-1 - n, k, prompt(k, 10_000 + n, data))
                    for n, k in enumerate(kinds)]
            await asyncio.gather(*(one_session(clients, w, cwd, config.session_timeout_s)
                                   for w in warm))
            out["warmup"] = [w.terminal() or (w.start_error or "none") for w in warm]
            await asyncio.sleep(1.0)  # let the warm-up's garbage go before measuring
        out["rss_before"] = host.rss()
        # Every kind as often as the others, in a random order.
        assigned = [kinds[i % len(kinds)] for i in range(config.sessions)]
        rng.shuffle(assigned)
        runs = [SessionRun(i, kind, prompt(kind, i, data)) for i, kind in enumerate(assigned)]
        killer = Killer(host, config, rng)
        stop = asyncio.Event()
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sampler(host, stop))
            kill_task = tg.create_task(killer.run(t0))
            tasks = []
            for r in runs:
                at = t0 + r.index * config.duration_s / max(1, config.sessions)
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                tasks.append(tg.create_task(
                    one_session(clients, r, cwd, config.session_timeout_s)))
            await asyncio.gather(*tasks)
            out["sessions_s"] = time.monotonic() - t0
            out["t0"] = t0  # the kills' clock (`Kill.at_s` counts from it)
            await kill_task
            stop.set()
        out["run_s"] = time.monotonic() - t0
        for r in runs:
            if r.session and not r.stored:
                r.stored = await stored_log(clients[0], r)
                if not r.stored:  # pruned since? the supervisor says so; the verdict reads it
                    r.stored_error = await why_gone(clients[0], r.session)
        out["disk"] = host.disk()
        if measure:
            await asyncio.sleep(1.0)  # restarted actors settle as the first ones did
        out["rss_after"] = host.rss()
        out["stats"] = {"supervisor": await clients[0].stats(),
                        "broadcaster": await clients[0].broadcaster_stats()}
    out["runs"], out["kills"], out["kill_problems"] = runs, killer.kills, killer.problems
    out["actors"] = host.state().get("actors", [])
    return out


def soak(config: SoakConfig) -> dict[str, Any]:
    """Run the whole soak (host up, drive, host down) and return the report."""
    directory = Path(tempfile.mkdtemp(prefix="oploop-soak-"))
    data, scenario = write_workload(directory, config.delta_delay_s)
    host = SoakHost(directory, scenario, config)
    try:
        host.up()
        try:
            got = uvloop.run(drive(host, config, data))
        finally:
            log = host.log_tail(10_000_000)
            host.down()
        orphans = host.orphans()
        rep = report(config, got, orphans)
        rep["home"] = str(host.home)
        rep["host_log_tail"] = log[-4000:] if not rep["ok"] else ""
        rep["host_log"] = log
        return rep
    finally:
        host.remove()
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.soak`: run, print the summary, write `--json`; 1 on any problem."""
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to start them over")
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--viewers", type=int, default=2)
    parser.add_argument("--llm-callers", type=int, default=2)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the report here (and the host's "
                        "log beside it, as .host.log)")
    args = parser.parse_args(argv)
    config = SoakConfig(
        sessions=args.sessions, duration_s=args.duration, kill_every_s=args.kill_every,
        seed=args.seed if args.seed is not None else int(time.time()), viewers=args.viewers,
        llm_callers=args.llm_callers, executors=args.executors,
    )
    rep = soak(config)
    print(summary(rep))
    if not rep["ok"] and rep.get("host_log_tail"):
        print("\nhost log (tail):\n" + rep["host_log_tail"], file=sys.stderr)
    if args.json:
        log = rep.pop("host_log")
        args.json.write_text(json.dumps(rep, indent=1, default=str))
        args.json.with_suffix(".host.log").write_text(log)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
