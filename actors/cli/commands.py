"""The commands that talk to a running host: watch, cancel, say, sessions, prune, rm,
tools, inspect. With no host they answer at once (`hosting.attach`), as `status` does."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from actors.cli.approvals import decide_here, interactive
from actors.cli.errors import EXIT_ERROR, EXIT_OK, CliError, fail
from actors.cli.hosting import attach, host_watch
from actors.render import Renderer
from actors.settings import Settings
from actors.usage import describe
from bus.client import Lag
from bus.errors import AccessDenied
from bus.vocab import EventType


async def watch(args: argparse.Namespace, settings: Settings) -> int:
    """Replay a session, then follow it live; the status is its last run's."""
    render = Renderer(json_lines=args.json, quiet=args.quiet, prompts=True,
                      tool_output=not args.quiet_tools)
    async with attach(settings, start=False) as host, host_watch(host.host_pid, settings.home):
        client = host.client
        # The broadcaster keeps finished sessions' logs; a session just started may
        # not have reached it yet. Unknown to both: a clear error, not a hang.
        last = await client.last_seq(args.session)
        if last is None:
            await client.inspect(args.session)
        elif args.from_seq > last:
            info = await client.inspect(args.session)
            if info.summary.get("state") != "running":
                raise CliError(f"session {args.session} has {last} event(s) and is not "
                               f"running: nothing from --from-seq {args.from_seq} on")

        def on_lag(lag: Lag) -> None:  # on stderr, so that --json output stays pure
            print(f"oploop: {lag.describe()}", file=sys.stderr, flush=True)

        ask = args.yes or interactive(args.json)
        async for event in client.events(args.session, args.from_seq,
                                         follow=not args.no_follow, on_lag=on_lag):
            render.event(event)
            kind, data = event["type"], event["data"]
            if ask and kind == EventType.APPROVAL_REQUESTED:
                await _ask_if_open(client, args, data)
    return render.exit_status() if render.terminal else EXIT_OK


async def _ask_if_open(client: Any, args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Ask about a call a replay shows waiting, unless it was decided since (the
    session's live state says)."""
    info = await client.inspect(args.session)
    if data["call_id"] in (info.summary.get("waiting_approval") or ()):
        await decide_here(client, args.session, data, yes=args.yes)


async def cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel a running session (`ui`: now; `operation`: at the next boundary)."""
    async with attach(settings, start=False) as host:
        ack = await host.client.cancel(args.session, mode=args.mode)
    print(f"oploop: cancel of {ack.session} accepted ({args.mode})")
    return EXIT_OK


async def say(args: argparse.Namespace, settings: Settings) -> int:
    """Send a message into a session (taken at its next boundary, or a new run)."""
    from actors.cli.run import read_prompt

    text = read_prompt(args.text)
    async with attach(settings, start=False) as host:
        try:
            ack = await host.client.say(args.session, text)
        except AccessDenied as exc:
            raise CliError(f"{exc}: sending messages needs a control key (a viewer key may "
                           "only watch)") from None
    if ack.state == "started":
        print(f"oploop: session {ack.session} was idle: run {ack.run} started on the message")
    else:
        print(f"oploop: message queued in {ack.session} (run {ack.run}): it is taken before "
              f"the next model call")
    return EXIT_OK


async def decide(args: argparse.Namespace, settings: Settings) -> int:
    """Approve or deny calls waiting for approval (`oploop approve|deny SESSION ...`)."""
    if not args.call_ids and not args.all:
        return fail(f"name the calls to {args.decision} (CALL_ID ...) or --all")
    if args.call_ids and args.all:
        return fail("either CALL_IDs or --all, not both")
    async with attach(settings, start=False) as host:
        if args.decision == "approve":
            ack = await host.client.approve(args.session, args.call_ids, all=args.all)
        else:
            ack = await host.client.deny(args.session, args.call_ids, all=args.all,
                                         reason=args.reason)
    done = "approved" if args.decision == "approve" else "denied"
    print(f"oploop: {done} {', '.join(ack.decided)} in {ack.session} (by {ack.by})")
    return EXIT_OK


def session_row(s: dict[str, Any]) -> str:
    """One line of `oploop sessions` (the one place its columns are made)."""
    row = (f"{s['session']}  {s['state']:<8} agent {s['agent']}  runs {s['runs']}  "
           f"turns {s['turns']}  events {s['last_seq']}  {describe(s.get('usage'))}")
    return row.rstrip()


async def sessions(args: argparse.Namespace, settings: Settings) -> int:
    """List the host's sessions."""
    async with attach(settings, start=False) as host:
        found = await host.client.sessions()
    for s in found:
        print(json.dumps(s) if args.json else session_row(s))
    return EXIT_OK


async def inspect(args: argparse.Namespace, settings: Settings) -> int:
    """One session: state, agent, runs, turns, last event, history size."""
    async with attach(settings, start=False) as host:
        info = await host.client.inspect(args.session)
    summary, history = info.summary, info.history
    size = len(json.dumps(history, ensure_ascii=False).encode())
    if args.json:
        print(json.dumps({"summary": summary, "history_messages": len(history),
                          "history_bytes": size, "history": history}, default=repr))
        return EXIT_OK
    print(f"session {summary.get('session', args.session)}")
    for key in ("state", "agent", "runs", "turns", "last_seq", "last_end", "cwd"):
        if key in summary:
            label = {"last_seq": "last event", "last_end": "last run ended"}.get(key, key)
            print(f"  {label:<15}{summary[key]}")
    for key, value in summary.items():
        if key == "usage":
            print(f"  {'usage':<15}{describe(value)}")
        elif key not in ("session", "state", "agent", "runs", "turns", "last_seq", "last_end",
                         "cwd"):
            print(f"  {key:<15}{value}")
    print(f"  {'history':<15}{len(history)} message(s), {size:,} bytes")
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


async def prune(args: argparse.Namespace, settings: Settings) -> int:
    """Delete finished sessions now by the host's retention rules."""
    async with attach(settings, start=False) as host:
        done = await host.client.prune(older_than_s=args.older_than, keep=args.keep)
    return _report_removed(done.removed, done.refused, args.json)


async def rm(args: argparse.Namespace, settings: Settings) -> int:
    """Delete the sessions named."""
    async with attach(settings, start=False) as host:
        done = await host.client.remove(args.sessions)
    return _report_removed(done.removed, done.refused, args.json)


#: How long `oploop tools` waits for a first executor to announce the catalogue.
TOOLS_WAIT_S = 10.0


async def tools(args: argparse.Namespace, settings: Settings) -> int:
    """The tools an agent sees (on turn 1 and later)."""
    async with attach(settings, start=True) as host:
        found = await host.client.tools(args.agent or "")
        # The catalogue is what the executors announce in `Ready`: a host just up may
        # not have heard from one yet (an empty list, never a real one: the built-ins
        # are always there). Ask again for a while rather than show nothing.
        deadline = time.monotonic() + TOOLS_WAIT_S
        while not found and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            found = await host.client.tools(args.agent or "")
    if not found:
        print(f"oploop: no executor has announced its tools within {TOOLS_WAIT_S:.0f} s "
              "(`oploop status` shows the actors)", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        for t in found:
            print(json.dumps(t))
        return EXIT_OK
    rows = []
    for t in found:
        flags = ",".join(f for f, on in (("core", t.get("core")), ("risky", t.get("risky"))) if on)
        seen = ("turn 1 and later" if t["turn1"] and t["later"] else
                "turn 1 only" if t["turn1"] else "after turn 1" if t["later"] else "hidden")
        first = t["description"].splitlines()[0] if t["description"] else ""
        if t.get("server"):  # an MCP server's tool: which, and how it is doing
            first = f"(MCP {t['server']}: {t.get('state', 'unknown')}) {first}"
        rows.append((t["name"], f"[{', '.join(t.get('tags', []))}]", flags or "-", seen,
                     t.get("rule", "allow"), first))
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(5)]
    for r in rows:
        print("  ".join(f"{r[i]:<{widths[i]}}" for i in range(5)) + f"  {r[5]}")
    return EXIT_OK
