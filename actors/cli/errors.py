"""Exit statuses and the one place where an error becomes one line on stderr.

No Python traceback reaches a user unless `OPLOOP_DEBUG=1`: every command runs
under `guarded`, which turns what it raises into a line naming the cause and
what to do, and a status (see `EXIT_*`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from actors.settings import debug_wanted

EXIT_OK = 0
#: Something failed (the line on stderr says what).
EXIT_ERROR = 1
#: Bad usage: a flag, a prompt that cannot be read, `OPLOOP_HOME`.
EXIT_USAGE = 2
#: Cancelled (Ctrl-C, or the run ended `CANCELLED`); SIGTERM gives 143.
EXIT_CANCELLED = 130
#: Whoever read our output went away (a closed pipe: `| head`), as a shell reports SIGPIPE.
EXIT_PIPE = 141
EXIT_TERMINATED = 143

EXIT_HELP = """exit status: 0 done; 1 failed (the line on stderr says why: no host, a bad
configuration, ...); 2 bad usage or a bad OPLOOP_HOME; 130 cancelled (Ctrl-C, or the
run ended CANCELLED); 141 the output was closed (| head); 143 SIGTERM.

environment: OPLOOP_HOME (default ~/.oploop), OPLOOP_CONFIG, OPLOOP_CONNECT and
OPLOOP_KEYS (a host elsewhere), ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL (else the
offline model), OPLOOP_LLM_BACKEND=scripted, NO_COLOR, OPLOOP_DEBUG=1 (tracebacks);
every setting is listed in actors/settings.py."""


class CliError(Exception):
    """An error to show as one line (`oploop: <message>`) and exit with `status`."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


class HostGone(CliError):
    """The host we were talking to died under us."""


def fail(message: str, status: int = EXIT_ERROR) -> int:
    """Print one clear line on stderr; return `status`."""
    print(f"oploop: {message}", file=sys.stderr, flush=True)
    return status


def debug() -> bool:
    """Whether `OPLOOP_DEBUG=1` asks for tracebacks (`actors.settings.debug_wanted`)."""
    return debug_wanted()


def quiet_pipe() -> int:
    """Our reader went away: point stdout at /dev/null (so that the interpreter's
    final flush cannot fail again) and exit as a SIGPIPE'd program would, silently."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_PIPE


def check_home(home: Path, *, create: bool) -> None:
    """Raise `CliError` (exit 2) naming what is wrong with `OPLOOP_HOME`, before any
    command trips over it: a file, a folder we may not write, one we cannot create."""
    where = f"OPLOOP_HOME={home}"
    if home.exists():
        if not home.is_dir():
            raise CliError(f"{where} is not a directory; point OPLOOP_HOME at a folder "
                           "(it is created if missing)", EXIT_USAGE)
        if create:
            _probe(home, where)
            if (home / "run").is_dir():
                _probe(home / "run", f"{home / 'run'}")
        return
    if not create:
        return
    try:
        home.mkdir(parents=True, mode=0o700)
    except OSError as exc:
        raise CliError(f"cannot create {where}: {exc.strerror or exc}; choose another "
                       "OPLOOP_HOME", EXIT_USAGE) from None


def _probe(folder: Path, where: str) -> None:
    """Write and delete a file in `folder` (an access check would pass for root on a
    read-only file system)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise CliError(f"{where} is not writable ({exc.strerror or exc}); fix its "
                       "permissions or choose another OPLOOP_HOME", EXIT_USAGE) from None


def guarded(command: Callable[[], int]) -> int:
    """Run `command`; whatever it raises becomes one line and an exit status."""
    try:
        return command()
    except BrokenPipeError:
        return quiet_pipe()
    except KeyboardInterrupt:  # before a command took SIGINT over (start-up, imports)
        print(file=sys.stderr)
        return EXIT_CANCELLED
    except CliError as exc:
        if debug():
            traceback.print_exc()
        return fail(str(exc), exc.status)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if debug():
            traceback.print_exc()
        return fail(f"{_describe(exc)} (set OPLOOP_DEBUG=1 for the traceback)")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        name = f" {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{name}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
