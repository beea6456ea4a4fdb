"""The built-in tools: `read_file`, `list_dir`, `write_file`, `shell` (DESIGN.md §5).

Expected failures (a missing file, a non-zero exit) are error outcomes with a
message the model can act on, not exceptions. Blocking file I/O runs in a thread
so an executor's event loop keeps serving its control socket meanwhile.

The risky tools take their runner as a parameter: `make_shell(spawn)` and
`make_write_file(writer)`; the executor passes the sandbox's (actors.sandbox),
and `BUILTIN` holds the local, unsandboxed ones for embedding and tests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

# The one atomic writer, shared with the sandbox launcher (which runs it after its lockdown).
from actors.fileops import write_atomic

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

PathArg = Annotated[
    str, Field(description="Path; a relative path is taken from the working directory.")
]


def resolve_path(ctx: ToolContext[Any], path: str) -> Path:
    """`path` as the tools see it: `~` expanded, relative paths against `ctx.cwd`."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else ctx.cwd / p


def _os_error(tool_name: str, path: Path, exc: OSError | ValueError) -> ToolOutcome:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    is_dir = isinstance(exc, IsADirectoryError)
    hint = " (use list_dir)" if is_dir and tool_name == "read_file" else ""
    return ToolOutcome.error(f"{tool_name}: {path}: {reason}{hint}")


# --- read_file -------------------------------------------------------------------


@tool(tags=("fs", "core"), risky=False, core=True)
async def read_file(ctx: ToolContext[Any], path: PathArg) -> str | ToolOutcome:
    """Read a text file and return its contents (UTF-8, undecodable bytes replaced;
    at most 256 KiB, with a note saying how much was cut)."""
    target = resolve_path(ctx, path)
    try:
        return await asyncio.to_thread(_read_text, target, READ_CAP, ctx.private)
    except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in the path
        return _os_error("read_file", target, exc)


def _read_text(target: Path, cap: int, private: tuple[Path, ...] = ()) -> str | ToolOutcome:
    st = os.stat(target)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, os.strerror(21), str(target))
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or a terminal would block the reading thread, possibly forever.
        return ToolOutcome.error(f"read_file: {target}: not a regular file")
    with open(target, "rb") as f:
        if _is_private(f.fileno(), private):
            raise PermissionError(13, "oploop's own files are not readable by tools", str(target))
        data = f.read(cap)
        more = bool(f.read(1))
    text = data.decode("utf-8", "replace")
    if not more:
        return text or "(empty file)"
    # st_size is 0 for /proc-style files: then the true remainder is unknown.
    rest = f"{st.st_size - cap} bytes more" if st.st_size > cap else "more bytes not shown"
    return f"{text}\n[truncated: {rest}]"


# --- list_dir --------------------------------------------------------------------


@tool(tags=("fs", "core"), risky=False, core=True)
async def list_dir(ctx: ToolContext[Any], path: PathArg) -> str | ToolOutcome:
    """List a directory's entries, sorted, one per line: directories end in "/",
    symbolic links in "@" (at most 1000 entries)."""
    target = resolve_path(ctx, path)
    try:
        return await asyncio.to_thread(_list_entries, target, LIST_CAP, ctx.private)
    except (OSError, ValueError) as exc:
        return _os_error("list_dir", target, exc)


def _list_entries(target: Path, cap: int, private: tuple[Path, ...] = ()) -> str:
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _is_private(fd, private):
            raise PermissionError(13, "oploop's own files are not listable by tools", str(target))
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    finally:
        os.close(fd)
    if not entries:
        return "(empty directory)"
    lines = [e.name + _entry_mark(e) for e in entries[:cap]]
    if len(entries) > cap:
        lines.append(f"[truncated: {len(entries) - cap} more entries]")
    return "\n".join(lines)


def _is_private(fd: int, private: tuple[Path, ...]) -> bool:
    """Whether the file open at `fd` lies in one of the `private` directories.

    Judged by the open file's own path (its /proc link), not the path asked for,
    so that no symbolic link, `..` or swap between a check and the open gets by.
    """
    if not private:
        return False
    real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    return any(real == p or p in real.parents for p in private)


def _entry_mark(entry: os.DirEntry[str] | os.DirEntry[bytes]) -> str:
    # Checked first: a link to a directory is shown as a link, not followed.
    if entry.is_symlink():
        return "@"
    return "/" if entry.is_dir(follow_symlinks=False) else ""


# --- write_file ------------------------------------------------------------------


FileWriter = Callable[[Path, bytes, Path], Awaitable[str]]
"""Writes `data` to `target` (resolved against `cwd`) atomically; returns the real
path written. Raises OSError (strerror: why) or ToolRefused (never ran)."""


async def write_local(target: Path, data: bytes, cwd: Path) -> str:
    """The unsandboxed `FileWriter`: an atomic write in a thread."""
    return await asyncio.to_thread(write_atomic, str(target), data)


def make_write_file(writer: FileWriter = write_local) -> Tool:
    """Build the `write_file` tool around `writer`, so the sandbox can supply its own."""

    @tool(tags=("fs",), risky=True, name="write_file")
    async def write_file(
        ctx: ToolContext[Any],
        path: PathArg,
        content: Annotated[str, Field(description="The complete new contents of the file.")],
    ) -> str | ToolOutcome:
        """Write text (UTF-8) to a file, replacing it whole if it exists and creating
        missing parent directories."""
        target = resolve_path(ctx, path)
        data = content.encode("utf-8")
        try:
            real = await writer(target, data, ctx.cwd)
        except ToolRefused as exc:
            return ToolOutcome.error(f"write_file: {exc}")
        except (OSError, ValueError) as exc:
            return _os_error("write_file", target, exc)
        return f"wrote {len(data)} bytes to {real}"

    return write_file


# --- shell -----------------------------------------------------------------------


def make_shell(spawn: Spawner = spawn_local, *, cap: int = SHELL_OUTPUT_CAP) -> Tool:
    """Build the `shell` tool around `spawn`, so a sandboxing launcher can supply its own."""

    @tool(tags=("exec",), risky=True, name="shell")
    async def shell(
        ctx: ToolContext[Any],
        command: Annotated[str, Field(description="The command line, run by /bin/sh -c.")],
        timeout_s: Annotated[
            float,
            Field(
                gt=0,
                le=SHELL_MAX_TIMEOUT_S,
                description="Seconds before the command and all its children are killed.",
            ),
        ] = SHELL_DEFAULT_TIMEOUT_S,
    ) -> ToolOutcome:
        """Run a shell command in the working directory and return its stdout and
        stderr interleaved (stdin is empty; at most 64 KiB of output, start and end
        kept). A non-zero exit status is reported as an error. Default timeout 30 s,
        max 600 s; background processes are killed when the command ends."""
        try:
            result = await run_command(command, ctx.cwd, timeout_s=timeout_s, cap=cap, spawn=spawn)
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

write_file = make_write_file()
"""The `write_file` tool with the local, unsandboxed writer."""

BUILTIN = Catalogue([read_file, list_dir, write_file, shell])
"""The four built-in tools."""
