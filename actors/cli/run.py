"""`oploop run`: start a run and stream it; Ctrl-C and SIGTERM at any moment.

A signal while the command starts (imports, the loop) is held until `Interrupts`
takes over, which then exits before anything is started (`interrupts.held`).
Before the run exists (the embedded host starting), a signal stops what was
started and exits; while the start request is in flight it waits for the answer
(a start cannot be taken back, only cancelled); once the run exists, the first
signal cancels it (UI cancel) and the command exits when `CANCELLED` arrives;
a second exits at once. Ctrl-C exits 130, SIGTERM 143.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import signal
import sys
from pathlib import Path

from actors.cli.approvals import decide_here, interactive
from actors.cli.errors import (
    EXIT_CANCELLED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    CliError,
    quiet_pipe,
)
from actors.cli.hosting import attach, host_watch
from actors.cli.interrupts import take_over
from actors.mcp.prompts import PromptRefError, parse_ref, prompt_text
from actors.render import Renderer
from actors.settings import Settings
from bus.client import Client
from bus.errors import BusError
from bus.vocab import CancelMode, EventType

#: How long a cancelled run may take to say `CANCELLED` before the CLI leaves anyway.
CANCEL_WAIT_S = 5.0


def read_prompt(arg: str) -> str:
    """The prompt: the argument itself, `-` for standard input, `@FILE` for a file's
    contents (for prompts beyond the shell's argument limit). Must be UTF-8.

    Read in start-up (before the command's loop takes the signals over), so that a
    Ctrl-C while a pipe or FIFO has not said it all yet is start-up's quiet exit:
    the read waits in `poll` beside a signal wakeup pipe (`read_woken`)."""
    if arg == "-":
        try:
            data = read_woken(sys.stdin.buffer.fileno())
        except OSError as exc:
            raise CliError(f"cannot read the prompt from standard input: "
                           f"{exc.strerror or exc}", EXIT_USAGE) from None
        source = "standard input"
    elif arg.startswith("@") and len(arg) > 1:
        path = Path(arg[1:]).expanduser()
        try:
            # (O_NONBLOCK: a FIFO's open would wait for its writer, outside the poll.)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                data = read_woken(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise CliError(f"cannot read the prompt file {path}: {exc.strerror or exc}",
                           EXIT_USAGE) from None
        source = str(path)
    else:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise CliError("the prompt is not valid UTF-8 (check the terminal's or the "
                           "file's encoding)", EXIT_USAGE) from None
        return arg
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"the prompt from {source} is not valid UTF-8 (byte {exc.start})",
                       EXIT_USAGE) from None


def read_woken(fd: int) -> bytes:
    """All of `fd` up to its end, never blocked in `read` itself: each read follows a
    `poll` that also waits on a signal wakeup pipe.

    A Python signal handler runs between bytecodes, after the C handler has only set
    a flag. A signal that lands just before a blocking `read` begins (inside
    `FileIO.readall`, past its last check) interrupts nothing, and the read then
    waits for the writer, the handler with it: a Ctrl-C lost while a FIFO's writer
    had not written (seen under load). The C handler also writes to the wakeup fd,
    whenever the signal comes, so the `poll` returns and the handler runs.
    Main thread only (`signal.set_wakeup_fd`).
    """
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        old = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            return _read_until_end(fd, wake_r)
        finally:
            signal.set_wakeup_fd(old)
    finally:
        os.close(wake_r)
        os.close(wake_w)


def _read_until_end(fd: int, wake_r: int) -> bytes:
    # (poll, not select: an fd past 1024 is fine.)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    chunks: list[bytes] = []
    while True:
        ready = {ready_fd for ready_fd, _ in poller.poll()}
        if wake_r in ready:  # the handler has run (or the signal was ignored)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        if fd not in ready:
            continue
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:  # (another reader of the same pipe took it)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class Interrupts:
    """SIGINT/SIGTERM while a run is being started or streamed."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.count = 0
        self.session: str | None = None
        self.client: Client | None = None
        self.starting = False
        self.cancelled = asyncio.Event()
        self._cancel: asyncio.Task[None] | None = None  # (held: a task only the loop holds may go)
        self._main = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._taken: list[int] = []

    def __enter__(self) -> Interrupts:
        self._taken, came = take_over(self._loop, self._on_signal)
        for sig in came:  # while start-up held them, before anything was started
            self.signal = self.signal or sig
            self.count += 1
        return self

    def __exit__(self, *exc: object) -> None:
        # From here the command only returns: a signal now ends it at once, with the
        # status asked for, not with a KeyboardInterrupt (or a death by SIGINT); blocked
        # while the handlers change hands, so that none falls between them.
        both = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, both)
        try:
            for sig in self._taken:
                self._loop.remove_signal_handler(sig)
                signal.signal(sig, self._exit_now)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, both)

    def _exit_now(self, sig: int, _frame: object) -> None:
        self.signal = self.signal or sig
        os._exit(self.status)

    @property
    def status(self) -> int:
        """The exit status the signal asks for."""
        return EXIT_TERMINATED if self.signal == signal.SIGTERM else EXIT_CANCELLED

    def _on_signal(self, sig: int) -> None:
        self.signal = self.signal or sig
        self.count += 1
        if self.count > 1 or (self.session is None and not self.starting):
            # Nothing to cancel yet (the host is starting), or asked twice: leave now.
            if self._main is not None:
                self._main.cancel()
            return
        if self.session is None:
            return  # the start is in flight: its answer names the session to cancel
        self.cancel_session()

    def cancel_session(self) -> None:
        """Ask the host to cancel our session (once), then give it `CANCEL_WAIT_S`."""
        if self.cancelled.is_set() or self.client is None or self.session is None:
            return
        self.cancelled.set()
        why = "SIGTERM" if self.signal == signal.SIGTERM else "Ctrl-C"
        if sys.stderr.isatty():
            print("\noploop: cancelling (Ctrl-C again to quit now)", file=sys.stderr)
        self._cancel = self._loop.create_task(_cancel_quietly(self.client, self.session, why))
        self._loop.call_later(CANCEL_WAIT_S, self._give_up)

    def _give_up(self) -> None:
        if self._main is not None and not self._main.done():
            self._main.cancel()


async def _tick(render: Renderer) -> None:
    """The progress line of a running tool, on a terminal."""
    while True:
        await asyncio.sleep(0.25)
        render.tick()


async def _cancel_quietly(client: Client, session: str, reason: str) -> None:
    with contextlib.suppress(BusError):
        await client.cancel(session, mode=CancelMode.UI, reason=reason)


#: `--prompt SERVER/PROMPT key=value ...`: (server, prompt, arguments).
McpPrompt = tuple[str, str, dict[str, str]]


def prompt_of(args: argparse.Namespace) -> str | McpPrompt:
    """The prompt `oploop run` was given: PROMPT (`read_prompt`), or an MCP prompt's
    reference and arguments (`--prompt`). CliError when it cannot be read."""
    if args.mcp_prompt:
        try:
            return parse_ref(args.mcp_prompt, args.prompt)
        except PromptRefError as exc:
            raise CliError(str(exc)) from None
    if len(args.prompt) != 1:
        raise CliError("give one PROMPT (quote it), or --prompt SERVER/PROMPT key=value ...")
    return read_prompt(args.prompt[0])


async def run(args: argparse.Namespace, settings: Settings) -> int:
    """`oploop run PROMPT`: 0 done, 1 error, 130 cancelled (143 on SIGTERM). The prompt:
    `args.prompt_given` when read already (`prompt_of`), else read now."""
    given = getattr(args, "prompt_given", None)
    prompt = prompt_of(args) if given is None else given
    render = Renderer(json_lines=args.json, quiet=args.quiet,
                      tool_output=not args.quiet_tools)
    with Interrupts() as stop:
        if stop.signal is not None:  # held while start-up handed it over: nothing started
            print(file=sys.stderr)  # the terminal's "^C" ends its line
            return stop.status
        try:
            return await _run(args, settings, prompt, render, stop)
        except asyncio.CancelledError:
            if stop.signal is None:
                raise
            return stop.status


def working_directory(args: argparse.Namespace, settings: Settings) -> str:
    """Where the run's tools act: `--cwd`, else the agent's `cwd`, else here; checked
    for the agent's sandbox mode (CliError, one line, when it cannot be one). ""
    for a follow-up: its session keeps the directory it has."""
    if args.session:
        if args.cwd:
            raise CliError("--cwd: a session keeps the working directory it started in")
        return ""
    from actors.sandbox.modes import SCRATCH, WorkdirRefused, check_workdir

    agent = settings.config.agent(args.agent or "")
    if agent is not None and agent.cwd and args.cwd:
        raise CliError(f"--cwd: agent {agent.name!r} works in its own cwd {agent.cwd} "
                       "(oploop.toml)")
    chosen = args.cwd or (os.path.expanduser(agent.cwd) if agent is not None and agent.cwd
                          else os.getcwd())
    chosen = os.path.abspath(os.path.expanduser(chosen))
    mode = agent.sandbox_mode if agent is not None else "workspace-write"
    if mode == SCRATCH:
        return chosen
    secret = (str(settings.home),) + ((settings.keys,) if settings.keys else ())
    try:
        check_workdir(chosen, mode, secret)
    except WorkdirRefused as exc:
        raise CliError(f"{exc}") from None
    return chosen


async def _run(args: argparse.Namespace, settings: Settings, prompt: str | McpPrompt,
               render: Renderer, stop: Interrupts) -> int:
    cwd = working_directory(args, settings)
    async with attach(settings, start=True) as host, host_watch(host.host_pid, settings.home):
        stop.client = host.client
        if not isinstance(prompt, str):  # an MCP prompt: its messages are the first message
            server, name, arguments = prompt
            prompt = prompt_text(await host.client.prompt(server, name, arguments,
                                                          agent=args.agent or ""))
        stop.starting = True
        started = await host.client.start(
            prompt, session=args.session or "", agent=args.agent or "",
            max_turns=args.max_turns, deadline_s=args.deadline or 0.0,
            machine=args.machine or "", cwd=cwd or None, host=args.host or "")
        stop.session = started.session
        if stop.signal is not None:  # a signal came while the start was in flight
            stop.cancel_session()
        if not args.json and not args.quiet:
            print(f"session {started.session} (run {started.run})", file=sys.stderr)
        ticker = asyncio.create_task(_tick(render)) if render.progress else None
        ask = args.yes or interactive(args.json)
        try:
            async for event in host.client.events(started.session, started.from_seq,
                                                  stop_at="first"):
                render.event(event)
                if ask and event["type"] == EventType.APPROVAL_REQUESTED:
                    await decide_here(host.client, started.session, event["data"],
                                      yes=args.yes)
        except BrokenPipeError:
            # Nobody reads the run any more: end it rather than leave it running.
            await _cancel_quietly(host.client, started.session, "output closed")
            return quiet_pipe()
        finally:
            if ticker is not None:
                ticker.cancel()
    if stop.signal is not None:
        return stop.status
    return render.exit_status()
