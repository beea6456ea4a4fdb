"""The built-in tools: `read_file`, `list_dir`, `write_file`, `shell` (DESIGN.md §5).

Expected failures (a missing file, a non-zero exit) are error outcomes with a
message the model can act on, not exceptions. Blocking file I/O runs in a thread
so an executor's event loop keeps serving its control socket meanwhile.

Every tool takes its runner as a parameter: `make_shell(spawn)`,
`make_write_file(writer)`, `make_read_file(reader)`, `make_list_dir(lister)`;
the executor passes the sandbox's (actors.sandbox: the file operations run in
a locked-down process, the formatting and the messages the model reads stay
here), and `BUILTIN` holds the local, unsandboxed ones for embedding and tests.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# The file operations, shared with the sandbox launcher (which runs them after its lockdown).
from actors.fileops import list_capped, read_capped, write_atomic

from .process import CommandResult, Spawner, ToolRefused, run_command, spawn_local
from .registry import Catalogue, Tool, ToolContext, ToolOutcome, tool

READ_CAP = 256 * 1024
"""Bytes of a file `read_file` returns at most."""
LIST_CAP = 1000
"""Entries `list_dir` returns at most."""
SHELL_OUTPUT_CAP = 64 * 1024
"""Bytes of combined stdout+stderr `shell` returns at most (head and tail kept)."""
SHELL_DEFAULT_TIMEOUT_S = 30.0
SHELL_MAX_TIMEOUT_S = 600.0

# The input schemas, written by hand (no pydantic in an executor: `plain.PlainInput`);
# identical to what pydantic derived from the signatures before (test_tool_schemas.py).
_PATH = {"description": "Path; a relative path is taken from the working directory.",
         "type": "string"}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"additionalProperties": False, "properties": properties, "required": required,
            "type": "object"}


PATH_SCHEMA = _object({"path": _PATH}, ["path"])
"""The input of `read_file` and `list_dir`."""
WRITE_FILE_SCHEMA = _object({
    "path": _PATH,
    "content": {"description": "The complete new contents of the file.", "type": "string"},
}, ["path", "content"])
"""The input of `write_file`."""
SHELL_SCHEMA = _object({
    "command": {"description": "The command line, run by /bin/sh -c.", "type": "string"},
    "timeout_s": {"default": SHELL_DEFAULT_TIMEOUT_S,
                  "description": "Seconds before the command and all its children are killed.",
                  "exclusiveMinimum": 0, "maximum": SHELL_MAX_TIMEOUT_S, "type": "number"},
}, ["command"])
"""The input of `shell`."""


def resolve_path(ctx: ToolContext[Any], path: str) -> Path:
    """`path` as the tools see it: `~` expanded, relative paths against `ctx.cwd`."""
    if path.startswith("~"):  # (by $HOME or the password file as they are now)
        p = Path(path).expanduser()
        return p if p.is_absolute() else ctx.cwd / p
    return _resolved(path, ctx.cwd)


@functools.lru_cache(maxsize=1024)
def _resolved(path: str, cwd: Path) -> Path:
    # (Kept: a session reads the same paths call after call, and a Path made once also
    # keeps its string for the checks that follow; pathlib's parsing was ~5% of an
    # executor's CPU per read.)
    p = Path(path)
    return p if p.is_absolute() else cwd / p


@functools.lru_cache(maxsize=64)
def _prefixes(roots: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """`roots` as a set, and as the prefixes of what lies beneath them (kept: a call's
    hidden paths are the same long tuple call after call)."""
    return frozenset(roots), tuple(r.rstrip("/") + "/" for r in roots)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    """Whether `path` is one of `roots` or lies beneath one (by name: no I/O)."""
    if not roots:
        return False
    same, beneath = _prefixes(roots)
    return path in same or path.startswith(beneath)


def hidden_error(tool_name: str, ctx: ToolContext[Any], target: Path,
                 resolve: bool = False) -> ToolOutcome | None:
    """The error for a path the sandbox hides from this call (`ctx.hidden`, less what it
    binds back), or None. `resolve`: also by its real path, as the host sees it (a
    link to a hidden path; asked only after the sandbox failed, for the message)."""
    if not ctx.hidden:
        return None
    paths = [os.path.normpath(target)]
    if resolve:
        paths.append(os.path.realpath(target))
    for path in paths:
        if _under(path, ctx.hidden) and not _under(path, ctx.kept):
            return ToolOutcome.error(f"{tool_name}: hidden by the sandbox: "
                                     f"{shown_name(str(target))} (mode {ctx.mode})")
    return None


def _os_error(tool_name: str, path: Path, exc: OSError | ValueError) -> ToolOutcome:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    is_dir = isinstance(exc, IsADirectoryError)
    hint = " (use list_dir)" if is_dir and tool_name == "read_file" else ""
    # shown_name: a path that is not UTF-8 must not make the output unencodable.
    return ToolOutcome.error(f"{tool_name}: {shown_name(str(path))}: {reason}{hint}")


# --- read_file -------------------------------------------------------------------


FileReader = Callable[[Path, Path, tuple[str, ...]], Awaitable[tuple[bytes, bool, int, str]]]
"""Reads at most READ_CAP bytes of `target` for a call whose workspace is `cwd` and which
may also see `readable`; (data, more?, st_size, real path). Raises OSError or ToolRefused."""


async def read_local(target: Path, cwd: Path, readable: tuple[str, ...]) -> tuple[
    bytes, bool, int, str
]:
    """The unsandboxed `FileReader`: the same non-blocking read, in a thread."""
    return await asyncio.to_thread(read_capped, str(target), READ_CAP)


def make_read_file(reader: FileReader = read_local) -> Tool:
    """Build the `read_file` tool around `reader`, so the sandbox can supply its own."""

    @tool(tags=("fs", "core"), risky=False, core=True, name="read_file", schema=PATH_SCHEMA)
    async def read_file(ctx: ToolContext[Any], path: str) -> str | ToolOutcome:
        """Read a text file and return its contents (UTF-8, undecodable bytes replaced;
        at most 256 KiB, with a note saying how much was cut)."""
        target = resolve_path(ctx, path)
        if (hidden := hidden_error("read_file", ctx, target)) is not None:
            return hidden
        try:
            data, more, size, real = await reader(target, ctx.workspace or ctx.cwd,
                                                  ctx.read_paths)
        except ToolRefused as exc:
            return ToolOutcome.error(f"read_file: {exc}")
        except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in the path
            return _failed("read_file", ctx, target, exc)
        if _is_private(real, ctx.private):
            return _os_error("read_file", target, PermissionError(
                13, "oploop's own files are not readable by tools"))
        text = data.decode("utf-8", "replace")
        if not more:
            return text or "(empty file)"
        # st_size is 0 for /proc-style files: then the true remainder is unknown.
        rest = f"{size - READ_CAP} bytes more" if size > READ_CAP else "more bytes not shown"
        return f"{text}\n[truncated: {rest}]"

    return read_file


# --- list_dir --------------------------------------------------------------------


DirLister = Callable[
    [Path, Path, tuple[str, ...]], Awaitable[tuple[list[tuple[bytes, str]], int, str]]
]
"""Lists at most LIST_CAP entries of `target` (as `FileReader` takes its arguments);
(the first entries in byte order as (raw name, mark), the entry count, real path)."""


async def list_local(target: Path, cwd: Path, readable: tuple[str, ...]) -> tuple[
    list[tuple[bytes, str]], int, str
]:
    """The unsandboxed `DirLister`: the same listing, in a thread."""
    return await asyncio.to_thread(list_capped, str(target), LIST_CAP)


def make_list_dir(lister: DirLister = list_local) -> Tool:
    """Build the `list_dir` tool around `lister`, so the sandbox can supply its own."""

    @tool(tags=("fs", "core"), risky=False, core=True, name="list_dir", schema=PATH_SCHEMA)
    async def list_dir(ctx: ToolContext[Any], path: str) -> str | ToolOutcome:
        """List a directory's entries, sorted, one per line: directories end in "/",
        symbolic links in "@" (at most 1000 entries)."""
        target = resolve_path(ctx, path)
        if (hidden := hidden_error("list_dir", ctx, target)) is not None:
            return hidden
        try:
            entries, total, real = await lister(target, ctx.workspace or ctx.cwd,
                                                ctx.read_paths)
        except ToolRefused as exc:
            return ToolOutcome.error(f"list_dir: {exc}")
        except (OSError, ValueError) as exc:
            return _failed("list_dir", ctx, target, exc)
        if _is_private(real, ctx.private):
            return _os_error("list_dir", target, PermissionError(
                13, "oploop's own files are not listable by tools"))
        if not entries:
            return "(empty directory)"
        lines = [shown_name(name) + mark for name, mark in entries]
        if total > len(entries):
            lines.append(f"[truncated: {total - len(entries)} more entries]")
        return "\n".join(lines)

    return list_dir


def shown_name(name: str | bytes) -> str:
    """A file name as the model and viewers see it: readable, one line, encodable.

    `name` is the raw name (bytes, or str with surrogate escapes as `os` gives it):
    bytes that are not UTF-8 show as `\\xff`, control and other unprintable
    characters as `\\n`-style escapes, so that one odd name can neither make the
    result unencodable nor split one entry into two lines.
    """
    if isinstance(name, bytes):
        raw = name
    else:
        try:
            raw = os.fsencode(name)
        except UnicodeEncodeError:  # a lone surrogate no file system gave: show its bytes
            raw = name.encode("utf-8", "surrogatepass")
    text = raw.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _failed(tool_name: str, ctx: ToolContext[Any], target: Path,
            exc: OSError | ValueError) -> ToolOutcome:
    """The error for a failed file operation: "hidden by the sandbox" when the path
    leads into a hidden one (through a link), else the OS's reason."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
        try:
            hidden = hidden_error(tool_name, ctx, target, resolve=True)
        except (OSError, ValueError):
            hidden = None
        if hidden is not None:
            return hidden
    return _os_error(tool_name, target, exc)


def _is_private(real: str, private: tuple[Path, ...]) -> bool:
    """Whether the file read (by its real path, as the reader opened it) lies in one of
    the `private` directories: a second layer behind the sandbox, which hides them."""
    if not private:
        return False
    # By name, as `Path` compares them: `real` normalized as a Path would be, each
    # private directory's own name, and whether one is `real` or a parent of it. (The
    # reader's real path is normalized already: then it is its own Path's name.)
    if "//" in real or "/." in real or real.endswith("/") or not real.startswith("/"):
        real = str(Path(real))
    return _under(real, _names(private))


@functools.lru_cache(maxsize=64)
def _names(paths: tuple[Path, ...]) -> tuple[str, ...]:
    """Each path's name (kept: an executor's private directories are the same call
    after call)."""
    return tuple(map(str, paths))


# --- write_file ------------------------------------------------------------------


FileWriter = Callable[[Path, bytes, Path], Awaitable[str]]
"""Writes `data` to `target` (resolved against `cwd`) atomically; returns the real
path written. Raises OSError (strerror: why) or ToolRefused (never ran)."""


async def write_local(target: Path, data: bytes, cwd: Path) -> str:
    """The unsandboxed `FileWriter`: an atomic write in a thread."""
    return await asyncio.to_thread(write_atomic, str(target), data)


def make_write_file(writer: FileWriter = write_local) -> Tool:
    """Build the `write_file` tool around `writer`, so the sandbox can supply its own."""

    @tool(tags=("fs",), risky=True, name="write_file", schema=WRITE_FILE_SCHEMA)
    async def write_file(ctx: ToolContext[Any], path: str, content: str) -> str | ToolOutcome:
        """Write text (UTF-8) to a file, replacing it whole if it exists and creating
        missing parent directories."""
        target = resolve_path(ctx, path)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON may carry a lone surrogate ("\ud800")
            return ToolOutcome.error(
                f"write_file: the content is not valid UTF-8 text (a lone surrogate at "
                f"character {exc.start}); nothing written")
        if (hidden := hidden_error("write_file", ctx, target)) is not None:
            return hidden
        try:
            real = await writer(target, data, ctx.cwd)
        except ToolRefused as exc:
            return ToolOutcome.error(f"write_file: {exc}")
        except (OSError, ValueError) as exc:
            return _failed("write_file", ctx, target, exc)
        return f"wrote {len(data)} bytes to {shown_name(real)}"

    return write_file


# --- shell -----------------------------------------------------------------------


def make_shell(spawn: Spawner = spawn_local, *, cap: int = SHELL_OUTPUT_CAP) -> Tool:
    """Build the `shell` tool around `spawn`, so a sandboxing launcher can supply its own."""

    @tool(tags=("exec",), risky=True, name="shell", schema=SHELL_SCHEMA)
    async def shell(ctx: ToolContext[Any], command: str,
                    timeout_s: float = SHELL_DEFAULT_TIMEOUT_S) -> ToolOutcome:
        """Run a shell command in the working directory and return its stdout and
        stderr interleaved as they came (stdin is empty; at most 64 KiB of output, start and end
        kept). A non-zero exit status is reported as an error. Default timeout 30 s,
        max 600 s; background processes are killed when the command ends."""
        try:
            result = await run_command(command, ctx.cwd, timeout_s=timeout_s, cap=cap,
                                       spawn=spawn, on_output=ctx.on_output)
        except ToolRefused as exc:
            return ToolOutcome.error(f"shell: {exc}")
        except OSError as exc:  # only starting the shell touches the OS here
            return ToolOutcome.error(f"shell: cannot start in {ctx.cwd}: {exc.strerror or exc}")
        if result.refused:
            return ToolOutcome.error(f"shell: refused by the sandbox: {result.refused}")
        return _shell_outcome(result, timeout_s)

    return shell


def _shell_outcome(result: CommandResult, timeout_s: float) -> ToolOutcome:
    text = result.output or "(no output)"
    rc = result.returncode
    if result.timed_out:
        return ToolOutcome.error(_with_note(text, f"timed out after {timeout_s:g} s"))
    if rc == 0:
        return ToolOutcome.ok(text)
    if rc is not None and rc < 0:
        return ToolOutcome.error(_with_note(text, f"killed by {_signal_name(-rc)}"))
    return ToolOutcome.error(_with_note(text, f"exit status {rc}"))


def _with_note(text: str, note: str) -> str:
    sep = "" if text.endswith("\n") else "\n"
    return f"{text}{sep}[{note}]"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


shell = make_shell()
"""The `shell` tool with the local, unsandboxed spawner."""

read_file = make_read_file()
"""The `read_file` tool with the local, unsandboxed reader."""

list_dir = make_list_dir()
"""The `list_dir` tool with the local, unsandboxed lister."""

write_file = make_write_file()
"""The `write_file` tool with the local, unsandboxed writer."""

BUILTIN = Catalogue([read_file, list_dir, write_file, shell])
"""The four built-in tools."""
