"""The commands that talk to a running host: watch, cancel, say, sessions, prune, rm,
tools, inspect. With no host they answer at once (`hosting.attach`), as `status` does."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from actors.cli import listing
from actors.cli.approvals import decide_here, interactive
from actors.cli.errors import EXIT_ERROR, EXIT_OK, CliError, fail
from actors.cli.hosting import attach, host_watch
from actors.render import Renderer
from actors.settings import Settings
from actors.usage import describe
from bus.client import Lag
from bus.errors import AccessDenied, RemoteError, SessionRemoved
from bus.vocab import EventType


async def watch(args: argparse.Namespace, settings: Settings) -> int:
    """Replay a session, then follow it live, its later runs too, until Ctrl-C
    (`--until-idle`: until the run in progress ends; `--no-follow`: the replay only);
    the status is its last run's."""
    render = Renderer(json_lines=args.json, quiet=args.quiet, prompts=True,
                      tool_output=not args.quiet_tools)
    async with attach(settings, start=False) as host, host_watch(host.host_pid, settings.home):
        client = host.client
        # The broadcaster keeps finished sessions' logs; a session just started may
        # not have reached it yet. Unknown to both: a clear error, not a hang.
        last = await client.last_seq(args.session)
        summary = None
        if last is None or args.from_seq > last or args.no_follow:
            summary = await _summary(client, args.session, required=last is None)
        # What the supervisor has committed: the broadcaster's log may not hold it all
        # yet (the run's last events on their way to it, a moment after it ended).
        committed = summary.get("last_seq") if summary is not None else None
        known = max(last or 0, committed or 0)
        if summary is not None and args.from_seq > known and summary.get("state") != "running":
            raise CliError(f"session {args.session} has {known} event(s) and is not "
                           f"running: nothing from --from-seq {args.from_seq} on")

        def on_lag(lag: Lag) -> None:  # on stderr, so that --json output stays pure
            print(f"oploop: {lag.describe()}", file=sys.stderr, flush=True)

        ask = args.yes or interactive(args.json)
        follow = not args.no_follow
        next_seq = args.from_seq
        # `--no-follow`: every event the session has now, waited for if the replay's log
        # is behind (None: a session the broadcaster alone keeps, its log is all there is).
        until = committed if args.no_follow else None
        stream = client.events(args.session, next_seq, follow=follow or until is not None,
                               until_seq=until, on_lag=on_lag)
        while True:  # one pass per run: the next one (a follow-up, a message) follows
            async for event in stream:
                render.event(event)
                next_seq = event["seq"] + 1
                kind, data = event["type"], event["data"]
                if ask and kind == EventType.APPROVAL_REQUESTED:
                    await _ask_if_open(client, args, data)
            if not follow or args.until_idle:
                break
            if not args.json and sys.stderr.isatty():
                print(f"oploop: {args.session} is idle: following its next run "
                      "(Ctrl-C ends)", file=sys.stderr, flush=True)
            stream = await _next_pass(client, args.session, next_seq, on_lag)
    return render.exit_status() if render.terminal else EXIT_OK


async def _summary(client: Any, sid: str, *, required: bool) -> dict[str, Any] | None:
    """`sid`'s summary from the supervisor; None for a session it does not hold (unless
    `required`: then its error, a session unknown to the broadcaster as well)."""
    try:
        return (await client.inspect(sid, history=False)).summary
    except RemoteError as exc:
        if required or exc.code != "unknown_session":
            raise
        return None


#: While `watch` waits for a session's next run, how often it asks whether the session
#: still exists.
GONE_CHECK_S = 2.0


async def _next_pass(client: Any, sid: str, next_seq: int,
                     on_lag: Any) -> AsyncIterator[dict[str, Any]]:
    """The events of `sid`'s next run, from `next_seq` on, live.

    A deletion is noticed by the client once it has seen an event of the pass (or by
    the live notice); until the first one comes, the session is asked after every
    `GONE_CHECK_S` (deleted meanwhile: `SessionRemoved`, as the client raises it).
    """
    stream = client.events(sid, next_seq, on_lag=on_lag)
    first = asyncio.ensure_future(anext(stream))
    try:
        while not (await asyncio.wait({first}, timeout=GONE_CHECK_S))[0]:
            if await client.last_seq(sid) is None:
                raise SessionRemoved(sid)
    finally:
        if not first.done():
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await first
    try:
        head = [first.result()]
    except StopAsyncIteration:  # (a stream that follows ends after an event, never before)
        head = []

    async def joined() -> AsyncIterator[dict[str, Any]]:
        for event in head:
            yield event
        async for event in stream:
            yield event

    return joined()


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
    """Send a message into a session (taken at its next boundary, or a new run): its
    text read in start-up (`args.text_given`, `app._read_message`)."""
    text = args.text_given
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


async def compact(args: argparse.Namespace, settings: Settings) -> int:
    """Compact a session's requests (`oploop compact SESSION`): idle, now (a summary
    call); running, before its next model call."""
    async with attach(settings, start=False) as host:
        try:
            ack = await host.client.compact(args.session)
        except AccessDenied as exc:
            raise CliError(f"{exc}: compacting needs a control key") from None
    if ack.state == "queued":
        print(f"oploop: {ack.session} is running: it compacts before its next model call")
        return EXIT_OK
    note = f" ({ack.note})" if ack.note else ""
    print(f"oploop: {ack.session} compacted: {ack.before_tokens} → {ack.after_tokens} "
          f"tokens{note}; its next run starts from the summary")
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


async def answer(args: argparse.Namespace, settings: Settings) -> int:
    """Answer an MCP server's question (`oploop answer SESSION ID key=value ...`)."""
    action = "decline" if args.decline else "cancel" if args.cancel else "accept"
    content: dict[str, str] = {}
    for pair in args.values:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            return fail(f"expected key=value, got {pair!r}")
        content[key] = value
    if content and action != "accept":
        return fail(f"--{action} takes no key=value")
    async with attach(settings, start=False) as host:
        ack = await host.client.answer(args.session, args.id, content, action=action)
    print(f"oploop: {action} sent for {ack.id} in {ack.session} (by {ack.by})")
    return EXIT_OK


async def sessions(args: argparse.Namespace, settings: Settings) -> int:
    """List the host's sessions, newest first: a header and the web list's columns."""
    async with attach(settings, start=False) as host:
        found = await host.client.sessions()
    if args.json:
        for s in listing.newest_first(found):
            print(json.dumps(s))
    elif not found:
        print("oploop: no sessions yet (`oploop run PROMPT` starts one)", file=sys.stderr)
    else:
        print("\n".join(listing.table(found)))
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
    for label, value in inspect_lines(summary, args.session):
        print(f"  {label:<16}{value}" if label else value)
    print(f"  {'history':<16}{len(history)} message(s), {size:,} bytes")
    return EXIT_OK


#: `inspect`'s lines: (summary key, label, how it is shown), in this order; the other
#: keys of the summary follow as they are.
_INSPECTED: tuple[tuple[str, str, Any], ...] = (
    ("title", "title", str), ("state", "state", str), ("agent", "agent", str),
    ("runs", "runs", str), ("turns", "turns", str), ("last_seq", "last event", str),
    ("started", "started", listing.when), ("run_started", "last run began", listing.when),
    ("ended", "last run ended", listing.when), ("last_end", "ended by", str),
    ("duration_s", "run time", listing.took), ("usage", "usage", describe),
    ("cwd", "cwd", str))
#: Summary keys `inspect` leaves out: said above in another form.
_UNSHOWN = frozenset({"session", "created"})


def inspect_lines(summary: dict[str, Any], sid: str) -> list[tuple[str, str]]:
    """`oploop inspect`'s lines: (label, value), times as dates and ages."""
    out = [("", f"session {summary.get('session', sid)}")]
    for key, label, show in _INSPECTED:
        if key in summary and summary[key] not in (None, ""):
            out.append((label, show(summary[key])))
    shown = {key for key, _, _ in _INSPECTED} | _UNSHOWN
    out += [(key, str(value)) for key, value in summary.items() if key not in shown]
    return out


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


async def prompts(args: argparse.Namespace, settings: Settings) -> int:
    """The prompts the MCP servers list (each server's status carries them)."""
    async with attach(settings, start=True) as host:
        servers = (await host.client.stats()).get("mcp", [])
    found = [dict(prompt, server=s.get("name", "?"), machine=s.get("machine", ""))
             for s in servers for prompt in s.get("prompts") or []]
    seen: set[tuple[str, str, str]] = set()  # (several executors list the same server)
    unique = []
    for p in found:
        key = (p["machine"], p["server"], p.get("name", ""))
        if key not in seen:
            seen.add(key)
            unique.append(p)
    if args.json:
        for p in unique:
            print(json.dumps(p))
        return EXIT_OK
    if not unique:
        print("no MCP server lists a prompt (`oploop status` shows the servers)")
    for p in unique:
        words = " ".join(f"{a['name']}=..." if a.get("required") else f"[{a['name']}=...]"
                         for a in p.get("arguments", []))
        print(f"{p['server']}/{p.get('name', '')} {words}".rstrip()
              + (f"  — {p['description']}" if p.get("description") else ""))
    return EXIT_OK


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
