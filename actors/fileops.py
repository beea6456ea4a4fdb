"""The file tools' system calls, run inside the sandbox after its lockdown (or unconfined).

`write_file`, `read_file` and `list_dir` do their I/O here: in the launcher's
tool process once it is locked down (the tool uid, Landlock, seccomp, a mount
and pid namespace), or in a thread for the local, unsandboxed tools. Either
way it is the same code, so a check made here holds for both.

Reads never block: a path is first opened `O_PATH` (no open side effect, no
wait for a FIFO's writer), the opened fd is `fstat`ed and anything but a
regular file or directory is refused (terminals and other character devices,
block devices, FIFOs, sockets); the file is then reopened through that very fd
with `O_NONBLOCK`, so a pseudo-file with nothing to give (`/proc/kmsg`) fails
with EAGAIN instead of waiting.

The sandbox launcher imports this file as a top-level module (its bootstrap
puts `actors/` on `sys.path`), the unsandboxed tools as `actors.fileops`: only
the standard library, and only cheap parts of it (see launcher.py). It lives
outside `actors.sandbox` so that the tools need not import the sandbox.
"""

from __future__ import annotations

import heapq
import os
import stat

TYPE_CHECKING = False  # `typing` costs an import on every sandboxed call
if TYPE_CHECKING:
    from typing import Any

EAGAIN = 11
ENOTREG = "not a regular file"
"""The reason given for a special file (a device, a FIFO, a socket)."""

_CHUNK = 64 * 1024
REPLY_LEN_DIGITS = 10
_REPLY_FD = 1  # the tool process's stdout: the executor reads the reply there


class ReadRefused(OSError):
    """The path is not something a read may touch (a device, FIFO or socket)."""


# --- write_file -------------------------------------------------------------------------


def write_atomic(target: str, data: bytes) -> str:
    """Replace `target` with `data` atomically, through a symlink, making parent dirs.

    The real path is resolved first, so a symlink is written through as an
    editor would; the temporary file lives in the same directory, so the final
    rename is atomic and a reader sees the old file or the new one.
    """
    real = os.path.realpath(target)
    os.makedirs(os.path.dirname(real) or ".", exist_ok=True)
    name = f".{os.path.basename(real)}.{os.urandom(4).hex()}.tmp"
    tmp = os.path.join(os.path.dirname(real), name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    done = False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        # (No contextlib.suppress in this file: one more import on every sandboxed call.)
        # Through the fd, never the name: a call running beside this one could have put a
        # link where the temporary file was, and a chmod by name would follow it to a file
        # outside what may be written (Landlock has no right for a mode).
        try:  # noqa: SIM105 -- keep an existing file's permissions (an executable script)
            os.fchmod(fd, os.stat(real).st_mode & 0o7777)
        except FileNotFoundError:
            pass
        os.replace(tmp, real)
        done = True
    finally:
        os.close(fd)
        if not done:
            try:  # noqa: SIM105
                os.unlink(tmp)
            except OSError:
                pass
    return real


def run_writer(job: dict[str, Any]) -> int:
    """The sandboxed `write_file`: write, then report on stdout; the exit code."""
    try:
        real = write_atomic(job["path"], job["data"])
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        os.write(_REPLY_FD, f"{getattr(exc, 'errno', 0) or 0}\t{reason}".encode())
        return 1
    # surrogateescape: a name that is not UTF-8 was written; its reply must say so.
    os.write(_REPLY_FD, f"wrote {len(job['data'])} bytes to {real}".encode(
        "utf-8", "surrogateescape"))
    return 0


# --- read_file and list_dir -------------------------------------------------------------


def _fd_link(fd: int, proc: int) -> tuple[str, int | None]:
    """(path, dir_fd) of the magic link to our open `fd`: /proc/self/fd/N, or, with
    `proc` (a /proc of the host, opened before the lockdown: a reader thread, whose
    view's /proc is the sandbox's and does not show it), thread-self/fd/N beneath it."""
    if proc < 0:
        return f"/proc/self/fd/{fd}", None
    return f"thread-self/fd/{fd}", proc


def open_checked(path: str, directory: bool, proc: int = -1) -> tuple[int, os.stat_result]:
    """Open `path` for reading without blocking: a regular file, or a directory if
    `directory`; (fd, its stat). Raises OSError (IsADirectoryError, NotADirectoryError,
    ReadRefused for special files). `proc`: see `_fd_link`."""
    probe = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        st = os.fstat(probe)
        if stat.S_ISDIR(st.st_mode) and not directory:
            raise IsADirectoryError(21, os.strerror(21), path)
        if directory and not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(20, os.strerror(20), path)
        if not directory and not stat.S_ISREG(st.st_mode):
            raise ReadRefused(0, ENOTREG, path)
        # Reopen the very inode checked (no swap in between); Landlock and the file's
        # permissions are checked now, by the kernel, on this open.
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        if directory:
            flags |= os.O_DIRECTORY
        link, at = _fd_link(probe, proc)
        fd = os.open(link, flags, dir_fd=at)
    finally:
        os.close(probe)
    st = os.fstat(fd)
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        os.close(fd)
        raise ReadRefused(0, ENOTREG, path)
    return fd, st


def read_capped(path: str, cap: int, proc: int = -1) -> tuple[bytes, bool, int, str]:
    """(the first `cap` bytes, whether there are more, st_size, the real path read).

    A read that would block raises BlockingIOError (EAGAIN). `proc`: see `_fd_link`.
    """
    fd, st = open_checked(path, False, proc)
    try:
        link, at = _fd_link(fd, proc)
        real = os.readlink(link, dir_fd=at)
        chunks: list[bytes] = []
        left = cap
        while left > 0:
            chunk = os.read(fd, min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        more = left <= 0 and bool(os.read(fd, 1))
    finally:
        os.close(fd)
    return b"".join(chunks), more, st.st_size, real


def list_capped(path: str, cap: int, proc: int = -1
                ) -> tuple[list[tuple[bytes, str]], int, str]:
    """(the first `cap` entries in byte order as (raw name, mark), the entry count,
    the real path). Mark: "/" a directory, "@" a symbolic link, "" anything else.
    `proc`: see `_fd_link`."""
    fd, _ = open_checked(path, True, proc)
    try:
        link, at = _fd_link(fd, proc)
        real = os.readlink(link, dir_fd=at)
        total = 0

        def names(it: Any) -> Any:
            nonlocal total
            for entry in it:
                total += 1
                yield os.fsencode(entry.name), entry

        # scandir dups the fd; memory stays bounded by `cap` however big the directory.
        with os.scandir(fd) as it:
            first = heapq.nsmallest(cap, names(it), key=lambda pair: pair[0])
            kept = [(name, _mark(entry)) for name, entry in first]
    finally:
        os.close(fd)
    return kept, total, real


def _mark(entry: os.DirEntry[str]) -> str:
    # A link to a directory is shown as a link, not followed (d_type: no extra stat).
    if entry.is_symlink():
        return "@"
    return "/" if entry.is_dir(follow_symlinks=False) else ""


# --- the reply framing (tool process -> executor) -----------------------------------------
# One reply, prefixed by its length in REPLY_LEN_DIGITS decimal digits, so the executor
# knows it has all of it without waiting for the processes to exit.
# read:  b"R" more(0|1) b" " st_size b" " hex(real path) b"\n" data
# list:  b"L" total b" " hex(real path) b"\n" then per entry: mark(d|l|-) name b"\0"
# error: b"E" errno b"\t" reason


def run_reader(job: dict[str, Any]) -> int:
    """The sandboxed `read_file`: read capped, frame the reply on stdout; the exit code."""
    reply = read_reply(job["path"], job["cap"])
    _reply(reply)
    return 1 if reply[:1] == b"E" else 0


def run_lister(job: dict[str, Any]) -> int:
    """The sandboxed `list_dir`: list capped, frame the reply on stdout; the exit code."""
    reply = list_reply(job["path"], job["cap"])
    _reply(reply)
    return 1 if reply[:1] == b"E" else 0


def read_reply(path: str, cap: int, proc: int = -1) -> bytes:
    """`read_capped`'s result, or its error, as a reply (unframed). `proc`: `_fd_link`."""
    try:
        data, more, size, real = read_capped(path, cap, proc)
    except (OSError, ValueError) as exc:
        return _error_reply(exc)
    return (b"R%d %d %s\n" % (more, size, real.encode("utf-8", "surrogateescape").hex().encode())
            + data)


def list_reply(path: str, cap: int, proc: int = -1) -> bytes:
    """`list_capped`'s result, or its error, as a reply (unframed). `proc`: `_fd_link`."""
    try:
        entries, total, real = list_capped(path, cap, proc)
    except (OSError, ValueError) as exc:
        return _error_reply(exc)
    head = b"L%d %s\n" % (total, real.encode("utf-8", "surrogateescape").hex().encode())
    marks = {"/": b"d", "@": b"l", "": b"-"}
    return head + b"".join(marks[m] + name + b"\0" for name, m in entries)


# --- the persistent reader (actors/sandbox/readers.py) -------------------------------------
# A reader serves many reads and listings of one session: each request arrives on fd 0
# (the same socket as fd 1), framed like a reply: REPLY_LEN_DIGITS digits of length, then
# kind (b"R" read, b"L" list), the cap in decimal, b" ", the raw path bytes.

_REQUEST_FD = 0
REQUEST_MAX = 64 * 1024
"""The longest request a reader takes (a path is at most 4096 bytes)."""


def request(kind: bytes, path: str, cap: int) -> bytes:
    """The executor's side of `run_server`: one framed request."""
    body = kind + b"%d " % cap + os.fsencode(path)
    if len(body) > REQUEST_MAX:
        raise OSError(36, os.strerror(36))  # ENAMETOOLONG: no reader takes it
    return b"%0*d" % (REPLY_LEN_DIGITS, len(body)) + body


def run_server(job: dict[str, Any]) -> int:
    """The persistent reader: answer requests on fd 0 until EOF; the exit code.

    Each request is one read or listing (`answer`), in this process, locked down
    once for all of them. Anything that is not a well-formed request ends the
    reader (the executor then starts a fresh one): it never guesses.
    """
    while True:
        head = _read_exactly(REPLY_LEN_DIGITS)
        if not head:
            return 0  # the executor closed its end: retired
        if len(head) != REPLY_LEN_DIGITS or not head.isdigit() or int(head) > REQUEST_MAX:
            return 2
        reply = answer(_read_exactly(int(head)))
        if reply is None:
            return 2
        _reply(reply)


def answer(body: bytes, proc: int = -1) -> bytes | None:
    """The reply (unframed) to one request's body (`request` without its length); None
    when it is not a well-formed request. `proc`: see `_fd_link`."""
    cap, sep, raw = body[1:].partition(b" ")
    kind = body[:1]
    if kind not in (b"R", b"L") or not sep or not cap.isdigit():
        return None
    run = read_reply if kind == b"R" else list_reply
    return run(os.fsdecode(raw), int(cap), proc)


def _read_exactly(size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(_REQUEST_FD, size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _error_reply(exc: OSError | ValueError) -> bytes:
    if isinstance(exc, BlockingIOError):
        reason = "the read would block (a pseudo-file with no data ready)"
    elif isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        reason = str(exc)
    return f"E{getattr(exc, 'errno', 0) or 0}\t{reason}".encode()


def frame(data: bytes) -> bytes:
    """A reply with its length in front, as the executor reads it."""
    return b"%0*d" % (REPLY_LEN_DIGITS, len(data)) + data


def _reply(data: bytes) -> None:
    view = memoryview(frame(data))
    while view:
        view = view[os.write(_REPLY_FD, view):]


class BadReply(Exception):
    """The sandboxed reader's reply is not in the expected framing."""


def parse_read(reply: bytes) -> tuple[bytes, bool, int, str]:
    """The executor's side of `run_reader`: the result of `read_capped`, or OSError."""
    head, data = _split(reply, b"R")
    more, size, real = head.split(b" ")
    return data, more == b"1", int(size), _path(real)


def parse_list(reply: bytes) -> tuple[list[tuple[bytes, str]], int, str]:
    """The executor's side of `run_lister`: the result of `list_capped`, or OSError."""
    head, body = _split(reply, b"L")
    total, real = head.split(b" ")
    marks = {b"d": "/", b"l": "@", b"-": ""}
    entries = [(item[1:], marks[item[:1]]) for item in body.split(b"\0")[:-1]]
    return entries, int(total), _path(real)


def _split(reply: bytes, kind: bytes) -> tuple[bytes, bytes]:
    if reply[:1] == b"E":
        code, _, reason = reply[1:].partition(b"\t")
        err = int(code) if code.isdigit() else 0
        raise OSError(err, reason.decode("utf-8", "replace") or "the sandboxed read failed")
    if reply[:1] != kind or b"\n" not in reply:
        raise BadReply(f"sandboxed reader replied {reply[:40]!r}")
    head, _, rest = reply[1:].partition(b"\n")
    return head, rest


def _path(hexed: bytes) -> str:
    return bytes.fromhex(hexed.decode()).decode("utf-8", "surrogateescape")
