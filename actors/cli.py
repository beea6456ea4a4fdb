"""The `oploop` command: the user's side of a host.

Every subcommand talks to the host through `bus.client.Client`, the same
client a program would embed. `run` uses the running host, or starts an
embedded one for this one call and tears it down afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil

from actors.config import ConfigError, parse_duration
from actors.host.actor import HostError, host_for, read_state
from actors.render import Renderer
from actors.settings import CONFIG_ENV, Settings, load_settings
from bus.client import Client, Lag
from bus.endpoints import EndpointError, oploop_home
from bus.errors import AccessDenied, BusError, RemoteError, RequestTimeout
from bus.security import ROLES, CredentialError, Keyring

EXIT_OK, EXIT_ERROR, EXIT_CANCELLED = 0, 1, 130


def fail(message: str) -> int:
    """Print one clear line on stderr; return the error exit status."""
    print(f"oploop: {message}", file=sys.stderr)
    return EXIT_ERROR


# -- up / down / status -------------------------------------------------------------------


def check_settings() -> Settings:
    """Load and check `oploop.toml` and the environment now (raises `ConfigError`), and
    pin the file's path in `OPLOOP_CONFIG` so every actor of the host reads the very
    file checked here."""
    settings = load_settings()
    source = settings.config.source
    if source != "<defaults>":
        os.environ[CONFIG_ENV] = str(Path(source).resolve())
    return settings


def cmd_up(args: argparse.Namespace) -> int:
    """Start a host (in the foreground, or detached until `oploop down`)."""
    if read_state() is not None:
        return fail(f"a host is already running in {oploop_home()}")
    try:
        check_settings()
    except ConfigError as exc:
        return fail(f"bad configuration: {exc}")
    if not args.detach:
        from actors.host.actor import main as host_main

        host_main()
        return EXIT_OK
    home = oploop_home()
    home.mkdir(parents=True, exist_ok=True)
    rfd, wfd = os.pipe()
    started = time.perf_counter()
    # The log may quote prompts and tool output: this user's eyes only.
    log_fd = os.open(home / "host.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(log_fd, 0o600)
    with os.fdopen(log_fd, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.host"], stdin=subprocess.DEVNULL, stdout=logf,
            stderr=logf, start_new_session=True, pass_fds=(wfd,),
            env={**os.environ, "OPLOOP_HOME": str(home), "OPLOOP_READY_FD": str(wfd)},
        )
    os.close(wfd)
    with os.fdopen(rfd, "rb") as ready:
        line = ready.readline()
    if line != b"ready\n":
        proc.wait()
        return fail(f"the host did not start (exit {proc.returncode}); see {home / 'host.log'}")
    elapsed = time.perf_counter() - started
    print(f"oploop: host {proc.pid} ready in {home} ({elapsed:.2f} s)")
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the running host and wait until it is gone."""
    state = read_state()
    if state is None:
        return fail(f"no host is running in {oploop_home()}")
    try:
        running = [s["session"] for s in asyncio.run(_sessions(timeout=2.0))
                   if s["state"] == "running"]
    except BusError:  # a supervisor that does not answer is stopped all the same
        running = []
    try:
        proc = psutil.Process(state["pid"])
        proc.terminate()
        proc.wait(timeout=15)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return fail(f"host {state['pid']} did not stop within 15 s")
    print("oploop: host stopped")
    if running:
        # Runs are journaled, not ended: say so, since they go on at the next `up`.
        print(f"oploop: {len(running)} running session(s) will resume at the next "
              f"`oploop up` in this home ({', '.join(running)}); to end a run instead, "
              "`oploop cancel` it before `oploop down`")
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
    return rows


async def _sessions(timeout: float = 5.0) -> list[dict[str, Any]]:
    """The sessions of the host in `$OPLOOP_HOME` (this machine's, whatever
    OPLOOP_CONNECT says: status and down are about it)."""
    async with Client.connect(oploop_home()) as client:
        return await client.sessions(timeout=timeout)


def cmd_status(args: argparse.Namespace) -> int:
    """Actors (name, pid, restarts, CPU, RSS) and sessions."""
    state = read_state()
    if state is None:
        return fail(f"no host is running in {oploop_home()}")
    rows = actor_rows(state)
    try:
        sessions = asyncio.run(_sessions())
    except BusError as exc:
        sessions = []
        print(f"oploop: supervisor not answering: {exc}", file=sys.stderr)
    from actors.sandbox import layers_report  # only status needs it

    layers = layers_report()
    if args.json:
        print(json.dumps({"host": state["pid"], "state": state["state"], "home": state["home"],
                          "offline_model": state["offline"], "actors": rows,
                          "sessions": sessions, "sandbox": layers}))
        return EXIT_OK
    print(f"host {state['pid']} {state['state']} in {state['home']}"
          + (" (offline model)" if state["offline"] else ""))
    if state.get("listen"):
        print(f"listening on {state['listen']} (+4 ports), "
              + ("CURVE: authorised keys only" if state.get("curve") else "plain TCP on loopback: any local user can connect"))
    print(f"{'actor':<15}{'pid':>8}{'state':>11}{'restarts':>10}{'cpu%':>7}{'cpu s':>8}{'rss MB':>8}")
    for r in rows:
        print(f"{r['name']:<15}{r['pid'] or '-':>8}{r['state']:>11}{r['restarts']:>10}"
              f"{_fmt(r['cpu_percent']):>7}{_fmt(r['cpu_s']):>8}{_fmt(r['rss_mb']):>8}")
    total = sum(r["rss_mb"] or 0 for r in rows)
    print(f"{'total':<15}{'':>44}{total:>8.1f}")
    for r in rows:
        if r["state"] == "failed":
            print(f"{r['name']} FAILED: it kept dying, so the host stopped restarting it "
                  f"(the others go on; see {state['home']}/host.log, then `oploop down` "
                  f"and `oploop up`)")
    running = sum(1 for s in sessions if s["state"] == "running")
    print(f"sessions: {len(sessions)} ({running} running)")
    for s in sessions:
        print(f"  {s['session']}  {s['state']:<8} runs {s['runs']}  turns {s['turns']}"
              f"  events {s['last_seq']}")
    print("sandbox layers:")
    for layer, how in layers.items():
        print(f"  {layer:<14}{how}")
    return EXIT_OK


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


def cmd_web(args: argparse.Namespace) -> int:
    """`oploop web [SESSION] [--no-open]` (the gateway's `urls.show`)."""
    from actors.gateway.urls import show

    return show(check_settings().home, args.session, open_browser=not args.no_open)


def cmd_keys(args: argparse.Namespace) -> int:
    """CURVE keys for TCP: issue one to a remote worker, client or viewer; list; revoke."""
    keyring = Keyring.for_home(oploop_home())
    try:
        keyring.ensure()
        if args.action == "add":
            if not args.name:
                return fail("keys add: name the key (oploop keys add NAME --role ROLE)")
            folder = keyring.issue(args.name, args.role)
            print(f"oploop: key {args.name!r} ({args.role}) authorised; copy {folder} to the "
                  "other machine (then delete it here) and run there with\n"
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


# -- run / watch / cancel / sessions / tools ----------------------------------------------


@contextlib.asynccontextmanager
async def host_client() -> AsyncIterator[Client]:
    """A client of the running host, or of an embedded host started for this call."""
    host = None
    settings = check_settings()
    if read_state() is None and not settings.connect:
        host = host_for(settings)
        await host.start()
    try:
        async with Client.connect() as client:
            yield client
    finally:
        if host is not None:
            await host.stop()


async def _run(args: argparse.Namespace) -> int:
    render = Renderer(json_lines=args.json)
    async with host_client() as client:
        started = await client.start(args.prompt, session=args.session or "", agent=args.agent or "",
                                     max_turns=args.max_turns, deadline_s=args.deadline or 0.0)
        if not args.json:
            print(f"session {started.session} (run {started.run})", file=sys.stderr)
        loop = asyncio.get_running_loop()
        interrupts = 0
        main = asyncio.current_task()
        assert main is not None

        def on_sigint() -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1:  # first Ctrl-C: UI cancel, wait for CANCELLED
                print("\noploop: cancelling (Ctrl-C again to quit now)", file=sys.stderr)
                loop.create_task(_cancel_quietly(client, started.session))
            else:
                os._exit(EXIT_CANCELLED)

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            async for event in client.events(started.session, started.from_seq, stop_at="first"):
                render.event(event)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        return render.exit_status()


async def _cancel_quietly(client: Client, session: str) -> None:
    with contextlib.suppress(BusError):
        await client.cancel(session, mode="ui", reason="Ctrl-C")


async def _watch(args: argparse.Namespace) -> int:
    render = Renderer(json_lines=args.json)
    async with Client.connect() as client:
        # The broadcaster keeps finished sessions' logs; a session just started may
        # not have reached it yet. Unknown to both: a clear error, not a hang.
        if await client.last_seq(args.session) is None:
            await client.inspect(args.session)

        def on_lag(lag: Lag) -> None:  # on stderr, so that --json output stays pure
            print(f"oploop: {lag.describe()}", file=sys.stderr, flush=True)

        async for event in client.events(args.session, args.from_seq,
                                         follow=not args.no_follow, on_lag=on_lag):
            render.event(event)
    return EXIT_OK


async def _cancel(args: argparse.Namespace) -> int:
    async with Client.connect() as client:
        ack = await client.cancel(args.session, mode=args.mode)
    print(f"oploop: cancel of {ack.session} accepted ({args.mode})")
    return EXIT_OK


async def _list_sessions(args: argparse.Namespace) -> int:
    async with Client.connect() as client:
        sessions = await client.sessions()
    for s in sessions:
        print(json.dumps(s) if args.json else
              f"{s['session']}  {s['state']:<8} agent {s['agent']}  runs {s['runs']}  "
              f"turns {s['turns']}  events {s['last_seq']}")
    return EXIT_OK


def _report_removed(removed: list[str], refused: dict[str, str], as_json: bool) -> int:
    if as_json:
        print(json.dumps({"removed": removed, "refused": refused}))
    else:
        print(f"oploop: deleted {len(removed)} session(s)"
              + (f": {', '.join(removed)}" if removed else ""))
        for why in refused.values():
            print(f"oploop: {why}", file=sys.stderr)
    return EXIT_ERROR if refused else EXIT_OK


async def _prune(args: argparse.Namespace) -> int:
    async with Client.connect() as client:
        done = await client.prune(older_than_s=args.older_than, keep=args.keep)
    return _report_removed(done.removed, done.refused, args.json)


async def _rm(args: argparse.Namespace) -> int:
    async with Client.connect() as client:
        done = await client.remove(args.sessions)
    return _report_removed(done.removed, done.refused, args.json)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


async def _tools(args: argparse.Namespace) -> int:
    async with host_client() as client:
        tools = await client.tools(args.agent or "")
    for t in tools:
        if args.json:
            print(json.dumps(t))
            continue
        flags = ",".join(f for f, on in (("core", t.get("core")), ("risky", t.get("risky"))) if on)
        seen = ("turn 1 and later" if t["turn1"] and t["later"] else
                "turn 1 only" if t["turn1"] else "after turn 1" if t["later"] else "hidden")
        print(f"{t['name']:<12} [{', '.join(t.get('tags', []))}] {flags:<11} {seen}: "
              f"{t['description'].splitlines()[0] if t['description'] else ''}")
    return EXIT_OK


def _async(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        import uvloop

        try:
            return int(uvloop.run(fn(args)))
        except RemoteError as exc:
            return fail(exc.message)
        except AccessDenied as exc:
            return fail(f"{exc} (is OPLOOP_KEYS a folder from `oploop keys add` with the "
                        "role this needs, and not revoked?)")
        except RequestTimeout:
            return fail(f"no host answering at {_where()} (is `oploop up` running?)")
        except ConfigError as exc:
            return fail(f"bad configuration: {exc}")
        except (HostError, EndpointError, BusError, OSError) as exc:
            return fail(str(exc))
    return run


def _where() -> str:
    """Where the CLI looks for a host (`OPLOOP_CONNECT`, else this home)."""
    try:
        settings = load_settings()
    except ConfigError:
        return str(oploop_home())
    return settings.connect or str(settings.home)


def parser() -> argparse.ArgumentParser:
    """The argument parser of `oploop`."""
    p = argparse.ArgumentParser(prog="oploop", description="A local operator host for LLM agents.")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a host in $OPLOOP_HOME")
    up.add_argument("--detach", action="store_true", help="run in the background")
    up.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop the host").set_defaults(fn=cmd_down)
    st = sub.add_parser("status", help="actors and sessions")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_status)
    keys = sub.add_parser("keys", help="CURVE keys of TCP workers, clients and viewers")
    keys.add_argument("action", choices=("add", "list", "revoke"))
    keys.add_argument("name", nargs="?")
    keys.add_argument("--role", choices=ROLES, default="control",
                      help="control: start, cancel, watch; worker: serve jobs; viewer: watch only")
    keys.set_defaults(fn=cmd_keys)
    run = sub.add_parser("run", help="run a session and stream it")
    run.add_argument("prompt")
    run.add_argument("--agent")
    run.add_argument("--session", help="continue this session with a follow-up message")
    run.add_argument("--max-turns", type=int, default=0)
    run.add_argument("--deadline", type=float, help="seconds the run may take")
    run.add_argument("--json", action="store_true", help="one event object per line")
    run.set_defaults(fn=_async(_run))
    watch = sub.add_parser("watch", help="attach a viewer: full replay, then live")
    watch.add_argument("session")
    watch.add_argument("--json", action="store_true")
    watch.add_argument("--from-seq", type=int, default=1)
    watch.add_argument("--no-follow", action="store_true", help="stop at the end of the log")
    watch.set_defaults(fn=_async(_watch))
    cancel = sub.add_parser("cancel", help="cancel a session")
    cancel.add_argument("session")
    cancel.add_argument("--mode", choices=("ui", "operation"), default="ui")
    cancel.set_defaults(fn=_async(_cancel))
    ses = sub.add_parser("sessions", help="list sessions (or prune them)")
    ses.add_argument("--json", action="store_true")
    ses.set_defaults(fn=_async(_list_sessions))
    ses_sub = ses.add_subparsers(dest="action")
    prune = ses_sub.add_parser(
        "prune", help="delete finished sessions now by [retention] (running ones never)")
    prune.add_argument("--older-than", type=_duration, default=-1.0, metavar="DURATION",
                       help="delete those idle for longer (30d, 12h, 15m, 90s)")
    prune.add_argument("--keep", type=_count, default=-1, metavar="N",
                       help="keep only the N most recently active")
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(fn=_async(_prune))
    rm = sub.add_parser("rm", help="delete sessions: history, events, everything")
    rm.add_argument("sessions", nargs="+", metavar="SESSION")
    rm.add_argument("--json", action="store_true")
    rm.set_defaults(fn=_async(_rm))
    web = sub.add_parser("web", help="the web view's address (with its token); opens it")
    web.add_argument("session", nargs="?", default="")
    web.add_argument("--no-open", action="store_true", help="print it only")
    web.set_defaults(fn=cmd_web)
    tools = sub.add_parser("tools", help="list tools as an agent sees them")
    tools.add_argument("--agent")
    tools.add_argument("--json", action="store_true")
    tools.set_defaults(fn=_async(_tools))
    return p


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `oploop` console script."""
    args = parser().parse_args(argv)
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
