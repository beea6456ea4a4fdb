"""The processes of an oploop host, one module or small package per role.

host · supervisor (the turn loop) · llm_caller · executor · broadcaster ·
offline_model — plus `cli`, the user's side, and `tools`, the tool catalogue.
"""

# `_signal`, the interpreter's built-in C module, not `signal`: that one builds its enums
# first (tens of ms on a busy machine, a window in which a Ctrl-C printed a traceback).
import _signal
import os as _os
import sys as _sys


def quiet_interrupt(signum: int, frame: object) -> None:
    """SIGINT before an `oploop` command has begun (imports, argument parsing): nothing
    has been started, so exit 130 at once, without the `KeyboardInterrupt` traceback an
    import interrupted half-way would print."""
    _os.write(2, b"\n")
    _os._exit(130)


def _is_the_cli() -> bool:
    """Whether this process is the `oploop` command (its console script, or
    `python -m actors.cli`), known before any of its modules is imported."""
    argv = getattr(_sys, "orig_argv", [])
    by_module = any(a == "-m" and b == "actors.cli" for a, b in zip(argv, argv[1:], strict=False))
    script = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return by_module or script == "oploop"


# The first of our code the command runs: a Ctrl-C from here on is a quiet exit until
# the command takes SIGINT over (`actors.cli.app`). Only the interpreter's own start-up
# comes before.
if _is_the_cli() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, quiet_interrupt)
