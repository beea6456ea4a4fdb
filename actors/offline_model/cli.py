"""`python -m actors.offline_model`: serve until SIGTERM/SIGINT, port in a file.

Run alone, it binds `--port` (0: an ephemeral one) and writes the port to
`--port-file`, atomically (tmp file + `os.replace`) so a reader never sees half
a number. The host instead hands it a listening socket it bound itself and
keeps (`--fd`): every incarnation of the offline model then serves the same
port, so the llm callers' `ANTHROPIC_BASE_URL` stays right across a restart,
and a connection made while it is down waits in the socket's backlog for the
next one instead of being refused.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections.abc import Sequence

from actors.config import ConfigError
from actors.nossl import import_uvloop
from actors.offline_model.scenario import Scenario, ScenarioError, load_scenario
from actors.offline_model.server import start_server
from actors.runtime import join_host, notify_ready
from actors.settings import load_settings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m actors.offline_model",
        description="A local server speaking the Anthropic Messages API, answered by rules "
        "or a scripted scenario.",
    )
    parser.add_argument("--port-file", required=True, help="where to write the bound port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = an ephemeral port")
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket "
                        "instead of binding --host/--port")
    parser.add_argument("--scenario", help="a scenario JSON file (format: see the package doc)")
    parser.add_argument(
        "--delta-delay-ms", type=float, default=0.0, help="pause between streamed deltas"
    )
    parser.add_argument("--context-window", type=int, default=None,
                        help="refuse requests over this many tokens (default: "
                        "OPLOOP_OFFLINE_CONTEXT, else 200000; 0: no limit)")
    return parser.parse_args(argv)


def write_port_file(path: str, port: int) -> None:
    """Write the port atomically: readers see no file or the whole number."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


async def serve(args: argparse.Namespace, scenario: Scenario | None) -> None:
    """Run the server until SIGTERM or SIGINT, then close it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    server = await start_server(
        args.host, args.port, scenario, delta_delay_s=args.delta_delay_ms / 1000, sock=sock,
        context_window=args.context_window,
    )
    try:
        write_port_file(args.port_file, server.port)
        what = f"scenario {scenario.source} ({len(scenario.turns)} turns)" if scenario else "rules"
        print(
            f"offline model: listening on http://{server.host}:{server.port} ({what}), "
            f"pid {os.getpid()}",
            file=sys.stderr,
            flush=True,
        )
        notify_ready()
        await stop.wait()
    finally:
        await server.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 after a clean stop, 2 on a bad scenario)."""
    args = parse_args(argv)
    try:
        settings = load_settings()
        join_host(settings)
    except ConfigError as exc:
        print(f"offline model: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.context_window is None:
        args.context_window = settings.offline_context
    try:
        scenario = load_scenario(args.scenario) if args.scenario else None
    except ScenarioError as exc:
        print(f"offline model: bad scenario: {exc}", file=sys.stderr)
        return 2
    try:
        import_uvloop().run(serve(args, scenario))
    except OSError as exc:  # e.g. the port is taken, or the port file's folder is missing
        print(f"offline model: cannot serve: {exc}", file=sys.stderr)
        return 1
    return 0
