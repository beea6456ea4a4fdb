"""The memory tool's commands on a memory folder: view, create, str_replace, insert,
delete, rename (the Messages API's `memory` tool, `memory_20250818`).

The model names paths under `/memories`; they map to one folder (`$OPLOOP_HOME/
memory/NAME`). The wording of results and errors follows Anthropic's reference
implementation (the SDK's `BetaLocalFilesystemMemoryTool`): a directory view lists
two levels with sizes, a file view numbers its lines, `str_replace` needs exactly
one match, `create` refuses an existing file, `insert` takes a line in [0, lines].

Confinement does not rest on string checks alone: every path is walked one name
at a time from the folder's descriptor with `O_NOFOLLOW` (`openat`), so neither a
`..` (refused before), nor an absolute path, nor a symlink planted in the folder
can lead out of it; a symlink met anywhere is refused. Sizes are bounded: a file
(`FILE_MAX`), the folder in all (`FOLDER_MAX`) and its entries (`ENTRIES_MAX`).

Run by the sandbox launcher after its lockdown (the folder is the call's working
directory, the only writable path), imported as a top-level module as `fileops`
is: only the standard library. The CLI (`oploop memory`) uses `execute` directly.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # `typing` costs an import on every sandboxed call
if TYPE_CHECKING:
    from typing import Any

ROOT = "/memories"
"""The prefix of every path the model names."""
FILE_MAX = 256 * 1024
"""Bytes of one memory file at most (create, edit; a larger file is not shown)."""
FOLDER_MAX = 8 * 1024 * 1024
"""Bytes of all the files of one memory folder together."""
ENTRIES_MAX = 1000
"""Files and directories in one memory folder."""
DEPTH_MAX = 16
"""Directories below /memories a path may name."""
LINE_NUMBER_WIDTH = 6
"""As the reference implementation pads line numbers."""
COMMANDS = ("view", "create", "str_replace", "insert", "delete", "rename")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REPLY_FD = 1  # the tool process's stdout: the executor reads the reply there


class MemoryRefused(Exception):
    """A command that cannot be carried out; the message is the tool's error result."""


def execute(root: str, command: dict[str, Any]) -> tuple[bool, str]:
    """Run one memory command on the folder `root`: (is_error, text for the model)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        return False, run_command(fd, command)
    except MemoryRefused as exc:
        return True, str(exc)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return True, f"memory: {reason}"
    finally:
        os.close(fd)


def read(root: str, path: str) -> tuple[bool, str]:
    """A file of the folder `root` as it is (no line numbers; a directory is viewed):
    (is_error, text). For `oploop memory NAME PATH`."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        with _Entry(fd, path) as entry:
            if entry.st is not None and stat.S_ISDIR(entry.st.st_mode):
                return False, view(fd, {"command": "view", "path": path})
            return False, entry.read_text()
    except MemoryRefused as exc:
        return True, str(exc)
    except (OSError, ValueError) as exc:
        return True, f"memory: {exc.strerror if isinstance(exc, OSError) else exc}"
    finally:
        os.close(fd)


def run_memory(job: dict[str, Any]) -> int:
    """The sandboxed entry (launcher): the folder is the working directory; the reply
    on stdout is "E" or "O" (error or not), then the text (UTF-8); the exit code."""
    is_error, text = execute(".", job["input"])
    data = (b"E" if is_error else b"O") + text.encode("utf-8", "backslashreplace")
    view = memoryview(data)
    while view:
        view = view[os.write(_REPLY_FD, view):]
    return 0


def run_command(root: int, command: dict[str, Any]) -> str:
    """One command on the folder open as `root`; raises MemoryRefused."""
    if not isinstance(command, dict):
        raise MemoryRefused("memory: the input must be an object with a command")
    name = command.get("command")
    handler = _HANDLERS.get(name) if isinstance(name, str) else None
    if handler is None:
        raise MemoryRefused(f"memory: unknown command {name!r}: expected one of "
                            f"{', '.join(COMMANDS)}")
    return handler(root, command)


# --- paths ------------------------------------------------------------------------------


def parts_of(path: object) -> list[str]:
    """The names below /memories of `path`; refused: not under /memories, `..`, NUL,
    too deep or too long a name."""
    if not isinstance(path, str):
        raise MemoryRefused(f"memory: a path must be a string, got {type(path).__name__}")
    if path != ROOT and not path.startswith(ROOT + "/"):
        raise MemoryRefused(f"Path must start with /memories, got: {path}")
    if "\x00" in path:
        raise MemoryRefused(f"Path {path!r} holds a NUL byte")
    parts = [p for p in path[len(ROOT):].split("/") if p not in ("", ".")]
    if ".." in parts:
        raise MemoryRefused(f"Path {path} would escape /memories directory")
    if len(parts) > DEPTH_MAX:
        raise MemoryRefused(f"Path {path} is deeper than {DEPTH_MAX} directories")
    if any(len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts):
        raise MemoryRefused(f"Path {path} has a name longer than 255 bytes")
    return parts


def _link_refused(path: str) -> MemoryRefused:
    return MemoryRefused(f"Path {path} goes through a symbolic link: refused (a link "
                         "could lead out of /memories)")


def _open_dir(root: int, parts: list[str], path: str, *, create: bool = False) -> int:
    """The directory `parts` below `root`, walked name by name without following any
    link (made, 0700, where missing and `create`); a descriptor the caller closes."""
    fd = os.dup(root)
    try:
        for name in parts:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise MemoryRefused(f"The path {path} does not exist. Please provide "
                                        "a valid path.") from None
                os.mkdir(name, 0o700, dir_fd=fd)
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                # ELOOP: a link; ENOTDIR: a file where a directory is named
                if _is_link(fd, name):
                    raise _link_refused(path) from None
                raise MemoryRefused(f"The path {path} does not exist. Please provide a "
                                    "valid path.") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class _Entry:
    """One path of a command: its parent directory open, its name, what it is now."""

    def __init__(self, root: int, path: object, *, create_parent: bool = False) -> None:
        parts = parts_of(path)
        self.path: str = path  # type: ignore[assignment]  (parts_of checked it)
        self.name = parts[-1] if parts else ""
        self.parent = _open_dir(root, parts[:-1], self.path, create=create_parent) \
            if parts else os.dup(root)
        self.st = _lstat(self.parent, self.name) if parts else os.fstat(root)
        if self.st is not None and stat.S_ISLNK(self.st.st_mode):
            os.close(self.parent)
            raise _link_refused(self.path)

    @property
    def is_root(self) -> bool:
        return not self.name

    def close(self) -> None:
        os.close(self.parent)

    def __enter__(self) -> _Entry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def missing(self) -> MemoryRefused:
        return MemoryRefused(f"The path {self.path} does not exist. Please provide a "
                             "valid path.")

    def read_text(self) -> str:
        """The file's text; refused when not a regular file or over FILE_MAX."""
        if self.st is None:
            raise self.missing()
        if not stat.S_ISREG(self.st.st_mode):
            raise MemoryRefused(f"The path {self.path} is not a file.")
        fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=self.parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced meanwhile
                raise MemoryRefused(f"The path {self.path} is not a file.")
            chunks, size = [], 0
            while chunk := os.read(fd, 64 * 1024):
                chunks.append(chunk)
                size += len(chunk)
                if size > FILE_MAX:
                    raise MemoryRefused(f"File {self.path} is larger than {FILE_MAX // 1024} "
                                        "KiB, the most a memory file may hold: not shown")
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", "replace")

    def write_text(self, root: int, text: str) -> None:
        """Replace the file atomically (a temporary file, then rename), within the bounds."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON may carry a lone surrogate ("\ud800")
            raise MemoryRefused(f"memory: {self.path}: the text is not valid UTF-8 (a lone "
                                f"surrogate at character {exc.start}): nothing written"
                                ) from None
        if len(data) > FILE_MAX:
            raise MemoryRefused(f"memory: {self.path}: {len(data)} bytes is more than a "
                                f"memory file may hold ({FILE_MAX // 1024} KiB): nothing "
                                "written")
        old = self.st.st_size if self.st is not None else 0
        used, entries = usage(root)
        if used - old + len(data) > FOLDER_MAX:
            raise MemoryRefused(f"memory: the memory folder would hold {used - old + len(data)} "
                                f"bytes, more than its {FOLDER_MAX // (1024 * 1024)} MiB: "
                                "delete or shorten other memories first; nothing written")
        if self.st is None and entries >= ENTRIES_MAX:
            raise MemoryRefused(f"memory: the memory folder holds {ENTRIES_MAX} entries "
                                "already: delete some first; nothing written")
        tmp = f".{self.name[:200]}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                     dir_fd=self.parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.rename(tmp, self.name, src_dir_fd=self.parent, dst_dir_fd=self.parent)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            try:  # noqa: SIM105 - contextlib would be one more import in the launcher
                os.unlink(tmp, dir_fd=self.parent)
            except OSError:
                pass
            raise


def usage(root: int) -> tuple[int, int]:
    """(bytes of the regular files, entries) of the folder open as `root`, links not
    followed; stops counting entries a little past ENTRIES_MAX."""
    total, entries = 0, 0
    todo = [os.dup(root)]
    while todo:
        fd = todo.pop()
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    entries += 1
                    if entries > ENTRIES_MAX + 16:
                        return total, entries
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        total += st.st_size
                    elif stat.S_ISDIR(st.st_mode):
                        try:  # noqa: SIM105 - as above
                            todo.append(os.open(entry.name, _DIR_FLAGS, dir_fd=fd))
                        except OSError:
                            pass
        finally:
            os.close(fd)
    return total, entries


# --- the commands -----------------------------------------------------------------------


def _text_arg(command: dict[str, Any], key: str) -> str:
    value = command.get(key)
    if not isinstance(value, str):
        raise MemoryRefused(f"memory {command.get('command')}: '{key}' must be a string")
    return value


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{str(i + first).rjust(LINE_NUMBER_WIDTH)}\t{line}"
                     for i, line in enumerate(lines))


def _size(n: int) -> str:
    """A size as the reference shows it: 0B, 512B, 4K, 1.5K, 2M."""
    if n == 0:
        return "0B"
    i = min((n.bit_length() - 1) // 10, 3)
    value = n / (1024 ** i)
    unit = "BKMG"[i]
    return f"{int(value)}{unit}" if value == int(value) else f"{value:.1f}{unit}"


def view(root: int, command: dict[str, Any]) -> str:
    """A directory: its entries two levels deep with sizes (hidden ones and links left
    out); a file: its lines numbered (`view_range` [first, last], last -1: the end)."""
    with _Entry(root, command.get("path")) as entry:
        if entry.st is None:
            raise entry.missing()
        if stat.S_ISDIR(entry.st.st_mode):
            fd = os.open(entry.name, _DIR_FLAGS, dir_fd=entry.parent) if entry.name \
                else os.dup(root)
            try:
                items = _listing(fd, "", 1)
            finally:
                os.close(fd)
            lines = [f"{_size(entry.st.st_size)}\t{entry.path}"]
            lines += [f"{size}\t{entry.path.rstrip('/')}/{rel}" for size, rel in items]
            return (f"Here're the files and directories up to 2 levels deep in {entry.path}, "
                    "excluding hidden items:\n" + "\n".join(lines))
        lines = entry.read_text().split("\n")
        first, shown = 1, lines
        wanted = command.get("view_range")
        if wanted is not None:
            if (not isinstance(wanted, list) or len(wanted) != 2
                    or not all(isinstance(n, int) and not isinstance(n, bool) for n in wanted)):
                raise MemoryRefused("memory view: 'view_range' must be two integers "
                                    "[first, last] (last -1: to the end)")
            start = max(1, wanted[0]) - 1
            end = len(lines) if wanted[1] == -1 else wanted[1]
            first, shown = start + 1, lines[start:end]
        return (f"Here's the content of {entry.path} with line numbers:\n"
                + _numbered(shown, first))


def _listing(fd: int, rel: str, depth: int) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return items
    for entry in entries[:ENTRIES_MAX]:
        if entry.name.startswith("."):
            continue
        path = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            items.append((_size(st.st_size), path + "/"))
            if depth < 2:
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    items += _listing(sub, path, depth + 1)
                finally:
                    os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            items.append((_size(st.st_size), path))
    return items


def create(root: int, command: dict[str, Any]) -> str:
    """A new file with `file_text` (missing directories made); an existing one is refused."""
    text = _text_arg(command, "file_text")
    with _Entry(root, command.get("path"), create_parent=True) as entry:
        if entry.is_root or entry.st is not None:
            raise MemoryRefused(f"File {entry.path} already exists")
        entry.write_text(root, text)
        return f"File created successfully at: {entry.path}"


def str_replace(root: int, command: dict[str, Any]) -> str:
    """Replace the one occurrence of `old_str` by `new_str`; none or several: refused."""
    old, new = _text_arg(command, "old_str"), _text_arg(command, "new_str")
    with _Entry(root, command.get("path")) as entry:
        content = entry.read_text()
        count = content.count(old) if old else 0
        if count == 0:
            raise MemoryRefused(f"No replacement was performed, old_str `{old}` did not "
                                f"appear verbatim in {entry.path}.")
        if count > 1:
            at, lines = 0, []
            while (at := content.find(old, at)) != -1:
                lines.append(content.count("\n", 0, at) + 1)
                at += 1
            raise MemoryRefused(
                f"No replacement was performed. Multiple occurrences of old_str `{old}` in "
                f"lines: {', '.join(map(str, lines))}. Please ensure it is unique")
        changed = content.count("\n", 0, content.find(old))
        updated = content.replace(old, new, 1)
        entry.write_text(root, updated)
        new_lines = updated.split("\n")
        start = max(0, changed - 2)
        snippet = _numbered(new_lines[start:min(len(new_lines), changed + 3)], start + 1)
        return ("The memory file has been edited. Here is the snippet showing the change "
                "(with line numbers):\n" + snippet)


def insert(root: int, command: dict[str, Any]) -> str:
    """Insert `insert_text` after line `insert_line` (0: at the start)."""
    text = _text_arg(command, "insert_text")
    at = command.get("insert_line")
    if not isinstance(at, int) or isinstance(at, bool):
        raise MemoryRefused("memory insert: 'insert_line' must be an integer")
    with _Entry(root, command.get("path")) as entry:
        lines = entry.read_text().split("\n")
        if lines[-1] == "":
            lines.pop()  # the empty tail a final newline leaves
        if not 0 <= at <= len(lines):
            raise MemoryRefused(f"Invalid `insert_line` parameter: {at}. It should be "
                                f"within the range [0, {len(lines)}].")
        lines.insert(at, text.rstrip("\n"))
        entry.write_text(root, "\n".join(lines) + "\n")
        return f"The file {entry.path} has been edited."


def delete(root: int, command: dict[str, Any]) -> str:
    """Delete a file, or a directory with all it holds (never /memories itself)."""
    with _Entry(root, command.get("path")) as entry:
        if entry.is_root:
            raise MemoryRefused("Cannot delete the /memories directory itself")
        if entry.st is None:
            raise MemoryRefused(f"The path {entry.path} does not exist")
        if stat.S_ISDIR(entry.st.st_mode):
            _remove_tree(entry.parent, entry.name)
        else:
            os.unlink(entry.name, dir_fd=entry.parent)
        return f"Successfully deleted {entry.path}"


def _remove_tree(parent: int, name: str) -> None:
    """Remove the directory `name` of `parent` and everything in it, through
    descriptors (a link inside is removed, never followed)."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(fd, entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def rename(root: int, command: dict[str, Any]) -> str:
    """Move `old_path` to `new_path` (missing directories made); an existing
    destination is refused."""
    with _Entry(root, command.get("old_path")) as old:
        if old.is_root:
            raise MemoryRefused("Cannot rename the /memories directory itself")
        if old.st is None:
            raise MemoryRefused(f"The path {old.path} does not exist")
        parts_of(command.get("new_path"))  # refused before any directory is made
        with _Entry(root, command.get("new_path"), create_parent=True) as new:
            if new.is_root or new.st is not None:
                raise MemoryRefused(f"The destination {new.path} already exists")
            try:
                os.rename(old.name, new.name, src_dir_fd=old.parent, dst_dir_fd=new.parent)
            except OSError as exc:  # e.g. a directory into itself (EINVAL)
                raise MemoryRefused(f"Cannot rename {old.path} to {new.path}: "
                                    f"{exc.strerror or exc}") from None
            return f"Successfully renamed {old.path} to {new.path}"


_HANDLERS = {"view": view, "create": create, "str_replace": str_replace, "insert": insert,
             "delete": delete, "rename": rename}
