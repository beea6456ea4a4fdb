"""The commands about the host itself: up, down, status, keys."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from actors import memorytool
from actors.cli.errors import EXIT_OK, CliError, fail
from actors.cli.hosting import offline_notice, spawn_host
from actors.config import ConfigError
from actors.host.actor import read_state
from actors.mcp.config import NAME_RE, names_a_server_tool
from actors.sessionlog import JournalError, SessionLog
from actors.settings import CONFIG_ENV, Settings, load_settings
from actors.storage import SESSIONS_FILE
from actors.usage import describe
from bus.client import Client
from bus.endpoints import oploop_home
from bus.errors import BusError, RemoteError
from bus.security import CredentialError, Keyring


def check_settings() -> Settings:
    """Load and check `oploop.toml` and the environment now (raises `ConfigError`), and
    pin the file's path in `OPLOOP_CONFIG` so every actor of the host reads the very
    file checked here."""
    settings = load_settings()
    source = settings.config.source
    if settings.config.hidden:  # a safety setting must not silently do nothing
        from actors.tools import BUILTIN

        for (platform, mode), names in settings.config.hidden.items():
            unknown = sorted(n for n in set(names) - set(BUILTIN) - {memorytool.NAME}
                             if not names_a_server_tool(n, settings.config.mcp))
            if unknown:
                raise ConfigError(f"{source}: hidden.{platform}.{mode}: no tool named "
                                  f"{', '.join(map(repr, unknown))} (the tools: "
                                  f"{', '.join(sorted({*BUILTIN, memorytool.NAME}))})")
    rules = {name: a.permissions for name, a in settings.config.agents.items() if a.permissions}
    if rules:  # a rule naming no tool would silently never match
        from actors.permissions import check_tools
        from actors.tools import BUILTIN

        for name, agent_rules in rules.items():
            # An MCP server's tools are known once it runs: a rule may name them ahead.
            known = set(BUILTIN) | {memorytool.NAME} | {rule[1] for rule in agent_rules
                                    if names_a_server_tool(rule[1], settings.config.mcp)}
            problem = check_tools(agent_rules, known)
            if problem:
                raise ConfigError(f"{source}: agents.{name}.permissions.{problem}")
    if source != "<defaults>":
        os.environ[CONFIG_ENV] = str(Path(source).resolve())
    return settings


def cmd_up(args: argparse.Namespace) -> int:
    """Start a host (in the foreground, or detached until `oploop down`). It resumes
    the runs a stopped host left open in this home (an embedded host never does)."""
    state = read_state()
    if state is not None:  # what was asked for is so: said, and not an error
        how = " (the embedded host of an `oploop run`)" if state.get("embedded") else ""
        print(f"oploop: a host is already running in {oploop_home()} (pid {state.get('pid')})"
              f"{how}")
        return EXIT_OK
    try:
        check_settings()
    except ConfigError as exc:
        raise CliError(f"bad configuration: {exc}") from None
    if not args.detach:
        from actors.host.actor import main as host_main

        # The host says "ready" on stderr; Ctrl-C reaches it alone (its actors run in
        # sessions of their own) and it stops them in order.
        host_main()
        return EXIT_OK
    home = oploop_home()
    started_at = time.perf_counter()
    started = asyncio.run(spawn_host(home, embedded=False))
    elapsed = time.perf_counter() - started_at
    print(f"oploop: host {started.pid} ready in {home} ({elapsed:.2f} s)")
    offline_notice(started.state)
    _say_servers_down()
    return EXIT_OK


def _say_servers_down() -> None:
    """After `up`: each MCP server that could not list its tools, and why (the executors
    are ready once every server has listed them or failed to start once)."""
    try:
        servers = asyncio.run(_host_view())[2]
    except BusError:
        return
    for server in servers:
        if server.get("state") != "ready":
            print(f"oploop: MCP server {server['name']} is not ready ({server['state']}): "
                  f"{server.get('error') or 'not started'}; its tools are not offered until "
                  f"it starts (tried again with its backoff; `oploop status`, `oploop logs "
                  f"mcp:{server['name']}`)", file=sys.stderr)


def cmd_worker(args: argparse.Namespace) -> int:
    """Run this machine's workers for a host elsewhere (`actors.host.workers`)."""
    from actors.host.workers import WorkerMachineError, WorkerMachineSpec, run_worker_machine

    spec = WorkerMachineSpec(args.connect, Path(args.keys).expanduser(), args.machine,
                             args.executors, args.llm_callers)
    try:
        return run_worker_machine(spec, oploop_home())
    except WorkerMachineError as exc:
        raise CliError(f"worker: {exc}") from None


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the running host and wait until it is gone (`--unmount`: then unmount
    the workspaces, which a stopped host keeps mounted where an operator looks)."""
    state = read_state()
    if state is None:
        if args.unmount:  # e.g. after a crash: what is left mounted can still go
            return _unmount_workspaces()
        print(f"oploop: no host is running in {oploop_home()}: nothing to stop")
        return EXIT_OK
    # First thing: on a shared store the other hosts take its runs at once.
    if not stop_process(state["pid"], DOWN_TIMEOUT_S):
        return fail(f"host {state['pid']} did not stop within {DOWN_TIMEOUT_S:g} s")
    print("oploop: host stopped")
    _say_where_runs_go(shared=bool(state.get("shared_store")))
    return _unmount_workspaces() if args.unmount else EXIT_OK


#: How long `oploop down` waits for the host to exit (it stops its actors in ~0.3 s).
DOWN_TIMEOUT_S = 15.0


def stop_process(pid: int, timeout_s: float) -> bool:
    """SIGTERM process `pid` and wait until it has exited: True once it has (or if it
    was gone), False if it still runs after `timeout_s`.

    The wait is on a pidfd, readable the moment the process exits, whoever its parent
    is and whenever that parent reaps it: the host of `up --detach` is the init's
    child, and waiting for the pid to vanish waited out the init's reaping (1.5 s
    more per `down` where init reaps late, as in many containers). The signal goes
    through that pidfd: it reaches the process waited for, never one given the pid
    after it."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:  # no pidfds (a kernel before 5.3): wait for the pid to vanish
        return _stop_by_pid(pid, timeout_s)
    try:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except ProcessLookupError:  # it has exited already
            return True
        ready, _, _ = select.select([pidfd], [], [], timeout_s)
        return bool(ready)
    finally:
        os.close(pidfd)


def _stop_by_pid(pid: int, timeout_s: float) -> bool:
    """`stop_process` without pidfds: a zombie counts as gone, and so does a pid given
    to another process since (`is_running` compares the start)."""
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        deadline = time.monotonic() + timeout_s
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
    except psutil.NoSuchProcess:
        pass
    return True


def _say_where_runs_go(*, shared: bool) -> None:
    """After `down`: the runs the stopped host left open, and where they go on. Read
    from the session log once the host is gone (asking the host first would delay
    the stop, and with it a shared store's hand-over)."""
    if shared:  # runs are journaled, not ended: another host of the store resumes them
        print("oploop: its running sessions go on on the other hosts of the shared store "
              "(or at the next `oploop up` if there is none)")
        return
    path = oploop_home() / SESSIONS_FILE
    if not path.exists():
        return
    try:
        log = SessionLog(path, reserve_mb=0, readonly=True)
    except JournalError:
        return
    try:
        running = log.running()
    finally:
        log.close()
    if running:  # runs are journaled, not ended: say so, since they go on at `up`
        print(f"oploop: {len(running)} running session(s) will resume at the next "
              f"`oploop up` in this home ({', '.join(running)}); to end a run instead, "
              "`oploop cancel` it before `oploop down`")


def _unmount_workspaces() -> int:
    """Unmount every workspace of this home (the images stay in `workspaces/.images`)."""
    from actors.sandbox.workspaces import release_all  # the sandbox only when asked

    count = release_all(oploop_home())
    print(f"oploop: {count} workspace(s) unmounted")
    return EXIT_OK


def actor_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Each actor with pid, restarts, state, CPU and RSS (from psutil)."""
    rows = [{"name": "host", "pid": state["pid"], "restarts": 0, "state": state["state"]}]
    rows += [dict(a) for a in state["actors"]]
    procs = {}
    for row in rows:
        if not row["pid"]:
            continue  # not running (psutil.Process(None) would be this very process)
        with contextlib.suppress(psutil.Error, TypeError):
            p = psutil.Process(row["pid"])
            p.cpu_percent(None)
            procs[row["name"]] = p
    time.sleep(0.1)  # cpu_percent needs an interval to measure over
    for row in rows:
        p = procs.get(row["name"])
        try:
            row["cpu_percent"] = p.cpu_percent(None) if p else None
            row["cpu_s"] = round(sum(p.cpu_times()[:2]), 2) if p else None
            row["rss_mb"] = round(p.memory_info().rss / 2**20, 1) if p else None
        except psutil.Error:
            row.update(cpu_percent=None, cpu_s=None, rss_mb=None)
        row.pop("started", None)
    helpers = _helpers([p.pid for p in procs.values()])
    if helpers:  # the sandbox's fork servers and tools: memory the host's too
        rows.append({"name": "helpers", "pid": None, "restarts": 0,
                     "state": f"{len(helpers)} proc", "cpu_percent": None,
                     "cpu_s": None, "rss_mb": round(sum(helpers) / 2**20, 1)})
    return rows


def _helpers(actor_pids: list[int]) -> list[int]:
    """The RSS of every process the actors started (not the actors themselves)."""
    seen, sizes = set(actor_pids), []
    for pid in actor_pids:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=True):
                if child.pid in seen:
                    continue
                seen.add(child.pid)
                with contextlib.suppress(psutil.Error):
                    sizes.append(child.memory_info().rss)
    return sizes


async def _host_view(wait_s: float = 5.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                list[dict[str, Any]], dict[str, Any]]:
    """The sessions, the worker machines, the MCP servers (their states) and the shared
    store (its hosts and leases; {} for the home's own file) of the host in
    `$OPLOOP_HOME`."""
    async with Client.connect(oploop_home()) as client:
        sessions = await client.sessions(timeout=wait_s)
        stats = await client.stats(timeout=wait_s)
    return sessions, stats.get("machines", []), stats.get("mcp", []), stats.get("store", {})


def _store_lines(store: dict[str, Any]) -> list[str]:
    """`oploop status`'s shared store: this host, the hosts on it, who holds what."""
    if not store:
        return []
    lines = [f"store {store['url']}: this host is {store['host']}, leases of "
             f"{store['lease_s']:g} s" + ("" if store.get("renewing", True)
                                          else " (NOT renewing: the store is unreachable)")]
    down = store.get("unavailable")
    if down:  # (supervisor/outage.py: the sessions wait for the store)
        waiting = down.get("sessions", [])
        return [*lines, f"  the store is UNAVAILABLE for {down['down_s']:.1f} s "
                        f"({down['error']}): {len(waiting)} session(s) wait for it"
                        + (f": {', '.join(waiting[:10])}" if waiting else "")]
    if store.get("error"):
        return [*lines, f"  cannot read the hosts and leases: {store['error']}"]
    held: dict[str, list[str]] = {}
    for lease in store.get("leases", []):
        held.setdefault(lease["owner"], []).append(lease["session"])
    lines.append(f"{'host':<14}{'last heard':>12}  {'sessions held':<14}name")
    for h in store.get("hosts", []):
        heard = "down" if h["down"] else f"{h['seen_s_ago']:.1f} s ago"
        reached = f" (other machines: {h['tcp']})" if h.get("tcp") else ""
        lines.append(f"{h['id']:<14}{heard:>12}  {len(held.get(h['id'], [])):<14}{h['name']}"
                     + reached)
    for lease in store.get("leases", []):
        left = lease["expires_in_s"]
        lines.append(f"  {lease['session']} held by {lease['owner']} (epoch {lease['epoch']}), "
                     + (f"{left:.1f} s left" if left > 0 else f"lapsed {-left:.1f} s ago"))
    return lines


def _machine_lines(machines: list[dict[str, Any]]) -> list[str]:
    """`oploop status`'s machines: name, address, workers by role, last beat, state."""
    lines = [f"{'machine':<16}{'address':<18}{'executors':>10}{'llm':>5}"
             f"{'last beat':>11}  state"]
    for m in machines:
        ago = m.get("last_heartbeat_ago_s")
        workers = m.get("workers", {})
        lines.append(f"{m['name']:<16}{m.get('address') or '-':<18}"
                     f"{workers.get('tool', 0):>10}{workers.get('llm', 0):>5}"
                     f"{'-' if ago is None else f'{ago:.1f} s ago':>11}  {m['state']}")
    return lines


def cmd_status(args: argparse.Namespace) -> int:
    """Actors (name, pid, restarts, CPU, RSS) and sessions."""
    state = read_state()
    if state is None:
        return fail(f"no host is running in {oploop_home()} (`oploop up --detach` starts one)")
    rows = actor_rows(state)
    try:
        sessions, machines, servers, store = asyncio.run(_host_view())
    except BusError as exc:
        sessions, machines, servers, store = [], [], [], {}
        print(f"oploop: supervisor not answering: {exc}", file=sys.stderr)
    from actors.sandbox import layers_report  # only status needs it

    layers = layers_report()
    agents = _agent_modes()
    if args.json:
        print(json.dumps({"host": state["pid"], "state": state["state"], "home": state["home"],
                          "offline_model": state["offline"], "actors": rows,
                          "sessions": sessions, "machines": machines, "mcp": servers,
                          "sandbox": layers, "agents": agents, "store": store}))
        return EXIT_OK
    print(f"host {state['pid']} {state['state']} in {state['home']}"
          + (" (offline model)" if state["offline"] else "")
          + (" (embedded: stops when its last `oploop run` ends)" if state.get("embedded")
             else ""))
    if state.get("listen"):
        print(f"listening on {state['listen']} (+4 ports), "
              + ("CURVE: authorised keys only" if state.get("curve")
                 else "plain TCP on loopback: any local user can connect"))
    print(f"{'actor':<15}{'pid':>8}{'state':>11}{'restarts':>10}{'cpu%':>7}{'cpu s':>8}"
          f"{'rss MB':>8}")
    for r in rows:
        print(f"{r['name']:<15}{r['pid'] or '-':>8}{r['state']:>11}{r['restarts']:>10}"
              f"{_fmt(r['cpu_percent']):>7}{_fmt(r['cpu_s']):>8}{_fmt(r['rss_mb']):>8}")
    total = sum(r["rss_mb"] or 0 for r in rows)
    print(f"{'total':<15}{'':>44}{total:>8.1f}")
    for r in rows:
        if r["state"] == "waiting":  # (the gateway, `actors.host.actor._gateway_on_demand`)
            print(f"{r['name']} starts at the first connection to the web view "
                  "(`oploop web`)")
        if r["state"] == "failed":
            print(f"{r['name']} FAILED: it kept dying, so the host stopped restarting it "
                  f"(the others go on; see {state['home']}/host.log, then `oploop down` "
                  f"and `oploop up`)")
    for line in _machine_lines(machines):
        print(line)
    for line in _store_lines(store):
        print(line)
    running = sum(1 for s in sessions if s["state"] == "running")
    print(f"sessions: {len(sessions)} ({running} running)")
    for s in sessions:
        print(f"  {s['session']}  {s['state']:<8} runs {s['runs']}  turns {s['turns']}"
              f"  events {s['last_seq']}  {describe(s.get('usage'))}".rstrip())
    if servers:
        print("MCP servers:")
    for m in servers:
        on = f" (on {m['machine']})" if m.get("machine", "local") != "local" else ""
        print(f"  {m['name'] + on:<16}{m['transport']:<6}{m['state']:<9}restarts {m['restarts']}"
              f"  tools {m['tools']}" + (f"  {m['error']}" if m.get("error") else ""))
        if m["state"] == "failed":
            print(f"  {m['name']} FAILED: it kept failing (a crash loop); calls to it fail "
                  f"at once until it is tried again, a minute later")
    print("agents (where their tools act):")
    for name, a in agents.items():
        where = a["cwd"] or "the directory each run starts in"
        extra = f"; also writable: {', '.join(a['write_paths'])}" if a["write_paths"] else ""
        print(f"  {name:<14}sandbox {a['sandbox']:<16}{where}{extra}")
    print("sandbox layers:")
    for layer, how in layers.items():
        print(f"  {layer:<14}{how}")
    return EXIT_OK


def _agent_modes() -> dict[str, dict[str, Any]]:
    """Each agent's sandbox mode, working directory and extra writable paths, as this
    home's configuration says (`oploop.toml`, `OPLOOP_SANDBOX`)."""
    try:
        agents = load_settings().config.agents
    except ConfigError:
        return {}
    return {name: {"sandbox": a.sandbox_mode,
                   "cwd": a.cwd if a.sandbox_mode != "scratch" else "a workspace per session",
                   "write_paths": list(a.write_paths)}
            for name, a in agents.items()}


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _reachable_at() -> str:
    """The address other machines reach this host at, as far as `oploop.toml` says."""
    try:
        network = load_settings().config.network
    except ConfigError:
        network = None
    if network is None:
        return "tcp://THIS-HOST:PORT (set [network] listen in oploop.toml)"
    host = network.host if network.host not in ("0.0.0.0", "*", "::") else "THIS-HOST"
    return f"tcp://{host}:{network.port}"


def cmd_keys(args: argparse.Namespace) -> int:
    """CURVE keys for TCP: issue one to a remote worker, client, viewer or peer host; list;
    revoke."""
    keyring = Keyring.for_home(oploop_home())
    try:
        keyring.ensure()
        if args.action == "add":
            if not args.name:
                return fail("keys add: name the key (oploop keys add NAME --role ROLE)")
            folder = keyring.issue(args.name, args.role, args.agent or "")
            if args.role == "peer":  # another host's ask_machine uses it
                print(f"oploop: key {args.name!r} (peer) authorised for agent "
                      f"{keyring.peer_agent(args.name)!r}; copy {folder} to the "
                      "other host (then delete it here) and name it in that host's "
                      f"oploop.toml:\n  [peers.NAME]\n  connect = \"{_reachable_at()}\"\n"
                      "  keys = \"<that folder>\"")
            else:
                print(f"oploop: key {args.name!r} ({args.role}) authorised; copy {folder} to "
                      "the other machine (then delete it here) and run there with\n"
                      f"  OPLOOP_CONNECT={_reachable_at()} OPLOOP_KEYS=<that folder>")
        elif args.action == "revoke":
            if not args.name or not keyring.revoke(args.name):
                return fail(f"keys revoke: no key named {args.name!r}")
            print(f"oploop: key {args.name!r} revoked (new connections with it are refused)")
        else:
            for role, names in keyring.names().items():
                print(f"{role:<8} {', '.join(names) or '-'}")
    except (CredentialError, OSError) as exc:
        return fail(str(exc))
    return EXIT_OK


def cmd_web(args: argparse.Namespace) -> int:
    """`oploop web [SESSION] [--no-open]`: the web view's address with its token, opened
    in a browser when there is a display (`actors.gateway.urls.show`)."""
    from actors.gateway.urls import page_url, show

    if args.session and page_url(oploop_home()) is not None:
        try:  # an address for a session the host does not have would show only an error
            asyncio.run(_inspect(args.session))
        except RemoteError as exc:
            return fail(exc.message)
        except BusError as exc:
            return fail(f"the host did not answer: {exc}")
    return show(oploop_home(), args.session, open_browser=not args.no_open)


async def _inspect(session: str) -> None:
    """Ask the host in `$OPLOOP_HOME` about `session` (`RemoteError` if it has none)."""
    async with Client.connect(oploop_home()) as client:
        await client.inspect(session)


#: The names the actors log under (`runtime.run_actor`), as `oploop logs ACTOR` takes them.
ACTORS = frozenset({"host", "supervisor", "executor", "llm", "broadcaster", "gateway",
                    "netproxy"})
#: Other names a user may give for one of them (the llm caller logs as "llm").
ACTOR_ALIASES = {"llm_caller": "llm", "llm-caller": "llm"}


def _is_mcp_log(actor: str) -> bool:
    """`mcp:NAME`: the stderr lines of MCP server NAME (logged as `mcp:NAME[pid]`)."""
    prefix, _, name = actor.partition(":")
    return prefix == "mcp" and NAME_RE.match(name) is not None


def cmd_logs(args: argparse.Namespace) -> int:
    """Print `$OPLOOP_HOME/host.log` (the host's and its actors' log), or only the lines
    of one actor; `--follow` goes on printing what is added (Ctrl-C ends)."""
    log = oploop_home() / "host.log"
    try:
        f = open(log, encoding="utf-8", errors="replace")  # noqa: SIM115 - followed below
    except FileNotFoundError:
        return fail(f"no log yet in {oploop_home()} (a host started by `oploop up --detach` "
                    "or `oploop run` writes host.log)")
    actor = ACTOR_ALIASES.get(args.actor, args.actor) if args.actor else ""
    if actor and actor not in ACTORS and not _is_mcp_log(actor):
        return fail(f"no actor {args.actor!r} (actors: {', '.join(sorted(ACTORS))}; "
                    f"mcp:NAME for MCP server NAME's stderr)")
    mark = f" {actor}[" if actor else ""
    with f:
        if args.lines is not None:
            tail = f.readlines()[-args.lines:] if args.lines else []
            lines = iter(tail)
        else:
            lines = iter(f.readline, "")
        for line in lines:
            if not mark or mark in line or line.startswith(f"{actor}["):
                sys.stdout.write(line)
        sys.stdout.flush()
        while args.follow:
            line = f.readline()
            if not line:
                time.sleep(0.2)  # a file has no readiness to wait on
                continue
            if not mark or mark in line:
                sys.stdout.write(line)
                sys.stdout.flush()
    return EXIT_OK
