"""`oploop`'s arguments, and how each command is run: the home checked first, every
error one line (`errors.guarded`), bus errors named for what the user can do."""

from __future__ import annotations

import argparse
import difflib
import re
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from actors.cli import commands, hostcmds, mcpcmds
from actors.cli.errors import EXIT_HELP, EXIT_USAGE, CliError, check_home, guarded
from actors.cli.interrupts import exit_with, held, interruptible
from actors.config import ConfigError, parse_duration
from actors.settings import Settings
from bus.endpoints import EndpointError, oploop_home
from bus.errors import AccessDenied, BusError, RemoteError, RequestTimeout
from bus.security import ROLES, CredentialError
from bus.vocab import CANCEL_MODES, CancelMode

AsyncCommand = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


def _async(fn: AsyncCommand, *, creates_home: bool = False,
           prepare: Callable[[argparse.Namespace], None] | None = None,
           ) -> Callable[[argparse.Namespace], int]:
    """A command that talks to a host, on uvloop, its errors turned into one line.
    Until its loop takes SIGINT and SIGTERM over (`interruptible`, `run.Interrupts`), a
    Ctrl-C is start-up's quiet exit (nothing is started before), through `prepare(args)`
    (reading the prompt, say); then they are `held`, through the loop's start."""
    def run(args: argparse.Namespace) -> int:
        import uvloop

        check_home(oploop_home(), create=creates_home)
        try:
            settings = hostcmds.check_settings()
        except ConfigError as exc:
            raise CliError(f"bad configuration: {exc}") from None
        if prepare is not None:
            prepare(args)
        try:
            with held():
                return int(uvloop.run(_command(fn, args, settings)))
        except RemoteError as exc:
            raise CliError(exc.message) from None
        except AccessDenied as exc:
            raise CliError(f"{exc} (is OPLOOP_KEYS a folder from `oploop keys add` with the "
                           "role this needs, and not revoked?)") from None
        except RequestTimeout:
            raise CliError(f"no host answering at {settings.connect or settings.home} "
                           "(is `oploop up` running? see host.log in OPLOOP_HOME)") from None
        except (EndpointError, BusError, CredentialError) as exc:
            raise CliError(str(exc)) from None
    _TAKE_SIGNALS.add(run)
    return run


#: The commands (`_async`) that keep start-up's quiet Ctrl-C until their loop takes the
#: signals over: no `KeyboardInterrupt` raised anywhere in between, where one raised in a
#: finaliser (an import's module-lock callback, say) is printed and dropped, the Ctrl-C
#: lost: seen under load, a run that went on to its end.
_TAKE_SIGNALS: set[Callable[[argparse.Namespace], int]] = set()


async def _command(fn: AsyncCommand, args: argparse.Namespace, settings: Settings) -> int:
    """`fn`, ended by a Ctrl-C or SIGTERM with 130 or 143 (`run` handles its own)."""
    if fn is _run_command:
        return await fn(args, settings)
    return await interruptible(fn(args, settings))


def _home_checked(fn: Callable[[argparse.Namespace], int], *, create: bool
                  ) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        check_home(oploop_home(), create=create)
        return fn(args)
    return run


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _seq(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an event number >= 1, got {text!r}")
    return int(text)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("oploop")
    except PackageNotFoundError:
        return "0.1.0 (source tree)"


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped command, choice or option (the
    closest known word, by `difflib`), as git and cargo say it."""

    def error(self, message: str) -> NoReturn:
        """Exit 2 with the usage and `message`, plus a suggestion where one is close."""
        choice = _INVALID_CHOICE.search(message)
        if choice:
            given, allowed = choice.group(1), _QUOTED.findall(choice.group(2))
            message += _suggestion(given, allowed)
        super().error(message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """Parse; an unknown option is refused naming the closest option of the command."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            known = _options(self, parsed)
            hints = "".join(_suggestion(e.split("=", 1)[0], known)
                            for e in extras if e.startswith("-"))
            self.error(f"unrecognized arguments: {' '.join(extras)}{hints}")
        return parsed


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_QUOTED = re.compile(r"'([^']*)'")


def _suggestion(given: str, known: list[str]) -> str:
    close = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _options(p: argparse.ArgumentParser, parsed: argparse.Namespace) -> list[str]:
    """The option strings of `p` and of the (sub)commands `parsed` chose."""
    found = [o for a in p._actions for o in a.option_strings]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(parsed, action.dest or "", None)
            sub = action.choices.get(chosen) if chosen else None
            if sub is not None:
                found += _options(sub, parsed)
    return found


def parser() -> argparse.ArgumentParser:
    """The argument parser of `oploop`."""
    p = Parser(prog="oploop", description="A local operator host for LLM agents.",
                                epilog=EXIT_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"oploop {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    up = sub.add_parser("up", help="start a host in $OPLOOP_HOME (resumes runs a stopped "
                                   "host left open)")
    up.add_argument("--detach", action="store_true", help="run in the background until "
                                                          "`oploop down`")
    up.set_defaults(fn=_home_checked(hostcmds.cmd_up, create=True))
    down = sub.add_parser("down", help="stop the host")
    down.add_argument("--unmount", action="store_true",
                      help="also unmount the sessions' workspaces (kept mounted otherwise; "
                           "their images stay and the next call mounts them again), so "
                           "that `rm -r $OPLOOP_HOME` can remove the home")
    down.set_defaults(fn=_home_checked(hostcmds.cmd_down, create=False))
    st = sub.add_parser("status", help="actors, worker machines and sessions")
    st.add_argument("--json", action="store_true", help="one JSON object")
    st.set_defaults(fn=_home_checked(hostcmds.cmd_status, create=False))
    wk = sub.add_parser(
        "worker", help="serve a host elsewhere as a worker machine (its executors, llm callers)",
        description="Start this machine's workers for the host at --connect (TCP + CURVE, "
                    "the worker key in --keys), keep them alive, and stop on Ctrl-C/SIGTERM. "
                    "Sessions aimed at --machine NAME run their tools here.")
    wk.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                    help="the host's [network] listen address")
    wk.add_argument("--keys", required=True, metavar="DIR",
                    help="the folder of `oploop keys add NAME --role worker` on the host")
    wk.add_argument("--machine", required=True, metavar="NAME", help="this machine's name")
    wk.add_argument("--executors", type=_count, default=1, metavar="N",
                    help="executor processes (32 tool calls at once each; default 1)")
    wk.add_argument("--llm-callers", type=_count, default=0, metavar="N",
                    help="llm caller processes (they need this machine's model settings; "
                         "default 0)")
    wk.set_defaults(fn=_home_checked(hostcmds.cmd_worker, create=True))
    keys = sub.add_parser("keys", help="CURVE keys of TCP workers, clients and viewers")
    keys.add_argument("action", choices=("add", "list", "revoke"))
    keys.add_argument("name", nargs="?")
    keys.add_argument("--role", choices=ROLES, default="control",
                      help="control: start, cancel, say, watch; worker: serve jobs; viewer: "
                           "watch only; peer: another host's ask_machine (new runs, its own "
                           "cancels)")
    keys.add_argument("--agent", help="peer keys: the one agent of this host the key may "
                                      "start runs on (default: the default agent)")
    keys.set_defaults(fn=_home_checked(hostcmds.cmd_keys, create=True))
    run = sub.add_parser(
        "run", help="run a session and stream it (starts an embedded host if none is up)",
        description="Run PROMPT and stream its events. With no host up, an embedded one is "
                    "started in the background and stops when the last `oploop run` using "
                    "it ends. Ctrl-C cancels the run (exit 130), SIGTERM too (143).")
    run.add_argument("prompt", metavar="PROMPT", nargs="*",
                     help="the prompt; - reads it from standard input, @FILE from a file "
                          "(with --prompt: its key=value arguments)")
    run.add_argument("--prompt", dest="mcp_prompt", metavar="SERVER/PROMPT",
                     help="start from an MCP server's prompt (see `oploop prompts`), filled "
                          "with the key=value words given")
    run.add_argument("--agent", help="an agent of oploop.toml (default: the default agent)")
    run.add_argument("--session", help="continue this session with a follow-up message")
    run.add_argument("--max-turns", type=_count, default=0, metavar="N",
                     help="stop after N model turns (0: the agent's limit)")
    run.add_argument("--deadline", type=_seconds, metavar="SECONDS",
                     help="cancel the run (mode deadline) if not done in this many seconds")
    run.add_argument("--machine", metavar="NAME",
                     help="run the session's tools on worker machine NAME only "
                          "(see `oploop worker`)")
    run.add_argument("--host", metavar="NAME",
                     help="on a store several hosts share: run on host "
                          "NAME (its id or name in `oploop status`; default: the "
                          "least-loaded)")
    run.add_argument("--cwd", metavar="DIR",
                     help="the session's working directory, where its tools act "
                          "(default: the agent's cwd, else this directory)")
    out = run.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one event object per line")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="print only the final answer")
    run.set_defaults(fn=_async(_run_command, creates_home=True, prepare=_read_prompt))
    watch = sub.add_parser("watch", help="attach a viewer: full replay, then live (later "
                                         "runs too) until Ctrl-C")
    watch.add_argument("session")
    wout = watch.add_mutually_exclusive_group()
    wout.add_argument("--json", action="store_true", help="one event object per line")
    wout.add_argument("-q", "--quiet", action="store_true", help="only the final answers")
    watch.add_argument("--from-seq", type=_seq, default=1, metavar="N",
                       help="start at event N (1: everything)")
    wfollow = watch.add_mutually_exclusive_group()
    wfollow.add_argument("--no-follow", action="store_true",
                         help="stop at the end of the log (the replay only)")
    wfollow.add_argument("--until-idle", action="store_true",
                         help="stop when the run in progress ends (default: follow the "
                              "session's later runs too, until Ctrl-C)")
    watch.set_defaults(fn=_async(commands.watch))
    for parser in (run, watch):
        parser.add_argument("--quiet-tools", action="store_true",
                            help="do not show what running tools print (TOOL_OUTPUT events; "
                                 "their results still show)")
        parser.add_argument("--yes", action="store_true",
                            help="approve every call that waits for approval (the agent's "
                                 "`ask` rules) while this command follows the run, unasked")
    cancel = sub.add_parser("cancel", help="cancel a session")
    cancel.add_argument("session")
    cancel.add_argument("--mode", choices=CANCEL_MODES, default=CancelMode.UI,
                        help="ui (default): end the run now, killing its tool; operation: "
                             "let the model call or tool in flight finish, then stop")
    cancel.set_defaults(fn=_async(commands.cancel))
    say = sub.add_parser(
        "say", help="send a message into a session",
        description="Send TEXT to SESSION as a user message. A running session takes it "
                    "at its next boundary (after the current tool results, before the next "
                    "model call); an idle one starts a run on it. `oploop watch` shows it.")
    say.add_argument("session")
    say.add_argument("text", metavar="TEXT",
                     help="the message; - reads it from standard input, @FILE from a file")
    say.set_defaults(fn=_async(commands.say, prepare=_read_message))
    compact = sub.add_parser(
        "compact", help="compact a session's context (summary of its older turns)",
        description="Shrink what SESSION's next requests send: every tool result is "
                    "cleared and the turns before the last are summarised by a model call "
                    "(the session log keeps everything). A running session compacts before "
                    "its next model call. `oploop watch` shows the COMPACTED event.")
    compact.add_argument("session")
    compact.set_defaults(fn=_async(commands.compact))
    for verb, what in (("approve", "run"), ("deny", "answer with an error (the model goes on)")):
        decide = sub.add_parser(verb, help=f"{verb} tool calls waiting for approval "
                                f"(they {what})" if verb == "deny" else
                                "approve tool calls waiting for approval (they run)")
        decide.add_argument("session")
        decide.add_argument("call_ids", nargs="*", metavar="CALL_ID",
                            help="the calls (APPROVAL_REQUESTED's call_id)")
        decide.add_argument("--all", action="store_true", help="every call waiting")
        if verb == "deny":
            decide.add_argument("--reason", default="", help="what the model is told")
        decide.set_defaults(fn=_async(commands.decide), decision=verb)
    ans = sub.add_parser("answer", help="answer an MCP server's question "
                                        "(ELICITATION_REQUESTED)")
    ans.add_argument("session")
    ans.add_argument("id", metavar="ID", help="the question (ELICITATION_REQUESTED's id)")
    ans.add_argument("values", nargs="*", metavar="KEY=VALUE", help="the form's answers")
    no = ans.add_mutually_exclusive_group()
    no.add_argument("--decline", action="store_true", help="refuse to answer")
    no.add_argument("--cancel", action="store_true", help="dismiss the question")
    ans.set_defaults(fn=_async(commands.answer))
    ses = sub.add_parser("sessions", help="list sessions (or prune them)")
    ses.add_argument("--json", action="store_true", help="one object per session")
    ses.set_defaults(fn=_async(commands.sessions))
    ses_sub = ses.add_subparsers(dest="action")
    prune = ses_sub.add_parser(
        "prune", help="delete finished sessions now by [retention] (running ones never)")
    prune.add_argument("--older-than", type=_duration, default=-1.0, metavar="DURATION",
                       help="delete those idle for longer (30d, 12h, 15m, 90s)")
    prune.add_argument("--keep", type=_count, default=-1, metavar="N",
                       help="keep only the N most recently active")
    prune.add_argument("--json", action="store_true", help="one JSON object")
    prune.set_defaults(fn=_async(commands.prune))
    ins = sub.add_parser("inspect", help="one session: state, agent, turns, last event, "
                                         "history size")
    ins.add_argument("session")
    ins.add_argument("--json", action="store_true", help="summary and history as JSON")
    ins.set_defaults(fn=_async(commands.inspect))
    rm = sub.add_parser("rm", help="delete sessions: history, events, everything")
    rm.add_argument("sessions", nargs="+", metavar="SESSION")
    rm.add_argument("--json", action="store_true", help="one JSON object")
    rm.set_defaults(fn=_async(commands.rm))
    web = sub.add_parser("web", help="the web view's address (with its token); opens it")
    web.add_argument("session", nargs="?", default="")
    web.add_argument("--no-open", action="store_true", help="print it only")
    web.set_defaults(fn=_home_checked(hostcmds.cmd_web, create=False))
    tools = sub.add_parser("tools", help="list tools as an agent sees them")
    tools.add_argument("--agent", help="an agent of oploop.toml (default: the default agent)")
    tools.add_argument("--json", action="store_true", help="one tool object per line")
    tools.set_defaults(fn=_async(commands.tools, creates_home=True))
    prompts = sub.add_parser("prompts", help="the prompts of the MCP servers "
                                             "(for `oploop run --prompt SERVER/PROMPT`)")
    prompts.add_argument("--json", action="store_true", help="one prompt object per line")
    prompts.set_defaults(fn=_async(commands.prompts, creates_home=True))
    mcp = sub.add_parser("mcp", help="MCP servers: `mcp login NAME` (OAuth)")
    mcp_sub = mcp.add_subparsers(dest="action", required=True)
    log_in = mcp_sub.add_parser("login", help="authorize oploop for an HTTP server that "
                                              "wants OAuth (prints the URL to open)")
    log_in.add_argument("name", metavar="NAME", help="the server ([mcp.NAME])")
    log_in.add_argument("--timeout", type=_seconds, default=300.0, metavar="SECONDS",
                        help="how long to wait for the browser's redirect (default 300)")
    log_in.set_defaults(fn=_async(mcpcmds.login, creates_home=True))
    comp = sub.add_parser("completion", help="print a shell completion script: "
                                             "eval \"$(oploop completion bash)\"")
    comp.add_argument("shell", choices=("bash", "zsh"))
    comp.set_defaults(fn=lambda args: _completion(args.shell))
    mem = sub.add_parser("memory", help="the memory folders of `memory = \"NAME\"` agents: "
                                        "names, one folder, or one file")
    mem.add_argument("name", nargs="?", default="", help="a memory name (none: list them)")
    mem.add_argument("path", nargs="?", default="", help="a file under /memories to show")
    mem.set_defaults(fn=_home_checked(_memory, create=False))
    store = sub.add_parser("store", help="the session log's store (SQLite file, PostgreSQL)")
    store_sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)
    copy = store_sub.add_parser(
        "copy", help="copy the home's sessions (sessions.db) to a PostgreSQL store")
    copy.add_argument("--to", required=True, metavar="URL", help="postgresql://...")
    copy.set_defaults(fn=_home_checked(_store_copy, create=False))
    logs = sub.add_parser("logs", help="the host's log ($OPLOOP_HOME/host.log)")
    logs.add_argument("actor", nargs="?", help="only this actor's lines (host, supervisor, "
                                               "executor, llm, broadcaster, gateway, netproxy; "
                                               "mcp:NAME: MCP server NAME's stderr)")
    logs.add_argument("-f", "--follow", action="store_true", help="go on printing what is added")
    logs.add_argument("-n", "--lines", type=_count, metavar="N", help="only the last N lines")
    logs.set_defaults(fn=_home_checked(hostcmds.cmd_logs, create=False))
    return p


def _memory(args: argparse.Namespace) -> int:
    from actors.cli.memorycmd import cmd_memory

    return cmd_memory(args)


def _completion(shell: str) -> int:
    """Print a completion script for `shell` (commands and each command's options)."""
    p = parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for name, cmd in sub.choices.items():
        opts = sorted(o for a in cmd._actions for o in a.option_strings)
        nested = [a for a in cmd._actions if isinstance(a, argparse._SubParsersAction)]
        words = opts + [w for n in nested for w in n.choices]
        cases.append(f'    {name}) opts="{" ".join(words)}" ;;')
    script = "\n".join([
        "_oploop() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" opts',
        "  if [ \"$COMP_CWORD\" -eq 1 ]; then",
        f'    COMPREPLY=($(compgen -W "{" ".join(sub.choices)} --help --version" -- "$cur"))',
        "    return",
        "  fi",
        '  case "${COMP_WORDS[1]}" in',
        *cases,
        '    *) opts="" ;;',
        "  esac",
        '  COMPREPLY=($(compgen -W "$opts" -f -- "$cur"))',
        "}",
        "complete -F _oploop oploop",
    ])
    if shell == "zsh":
        script = "autoload -Uz bashcompinit && bashcompinit\n" + script
    print(script)
    return 0


def _store_copy(args: argparse.Namespace) -> int:
    from actors.cli.storecmds import cmd_store_copy  # (psycopg only for this command)

    return cmd_store_copy(args)


def _read_prompt(args: argparse.Namespace) -> None:
    from actors.cli.run import prompt_of  # (and so the module, before the signals are held)

    args.prompt_given = prompt_of(args)


def _read_message(args: argparse.Namespace) -> None:
    from actors.cli.run import read_prompt

    args.text_given = read_prompt(args.text)


async def _run_command(args: argparse.Namespace, settings: Settings) -> int:
    from actors.cli.run import run

    return await run(args, settings)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `oploop` console script (`actors.cli.main`, which makes a
    Ctrl-C before the command begins a quiet exit 130)."""
    try:
        p = parser()
        args = p.parse_args(argv)
    except KeyboardInterrupt:
        sys.exit(130)
    if getattr(args, "fn", None) is None:
        p.print_help()
        sys.exit(EXIT_USAGE)
    fn: Any = args.fn
    if fn in _TAKE_SIGNALS:
        exit_with(guarded(lambda: fn(args)))
    exit_with(guarded(lambda: _with_sigint(fn, args)))


def _with_sigint(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command that does not talk to a host with Python's own SIGINT handling (a
    `KeyboardInterrupt`, for its clean-up), and the quiet exit again after it: a Ctrl-C
    now is one `guarded` turns into 130, never a traceback."""
    from actors.cli import quiet_interrupt

    quiet = signal.getsignal(signal.SIGINT) is quiet_interrupt  # (else: ignored, kept so)
    if quiet:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fn(args)
    finally:
        if quiet:
            signal.signal(signal.SIGINT, quiet_interrupt)
