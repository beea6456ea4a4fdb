"""Reading the replies of the sandboxed file operations (write, read, list) in the executor.

The launcher runs a file operation (`actors/fileops.py`) and writes its reply
on stdout; these read it back, bounded: a write's reply capped, a read's or a
listing's framed by its length, then parsed (a mangled reply is `BadReply`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from actors import fileops

_WRITE_REPLY_CAP = 16 * 1024
_READ_REPLY_SLACK = 64 * 1024  # a read's reply: the data cap plus its header (a path in hex)
_LIST_ENTRY_BYTES = 260  # a listed entry's most bytes: a 255-byte name, its mark and NUL
_DENIED = (1, 13, 30)  # EPERM, EACCES, EROFS: what Landlock and the mounts answer

T = TypeVar("T")


def _parsed(parse: Callable[[bytes], T], reply: bytes) -> T:
    """The parsed reply of a sandboxed read (OSError: the reader's own error)."""
    try:
        return parse(reply)
    except (ValueError, KeyError) as exc:  # cut short or mangled: not what fileops wrote
        raise fileops.BadReply(f"sandboxed reader: unreadable reply ({exc})") from exc


async def _read_framed(stream: asyncio.StreamReader, cap: int) -> bytes:
    """One length-prefixed reply (at most `cap` bytes); b"" if the launcher wrote none."""
    try:
        size = int(await stream.readexactly(fileops.REPLY_LEN_DIGITS))
        if size > cap:
            raise fileops.BadReply(f"sandboxed reader: a {size}-byte reply (cap {cap})")
        return await stream.readexactly(size)
    except asyncio.IncompleteReadError:
        return b""  # refused before it ran (the reason is on the error pipe), or killed
    except ValueError as exc:
        raise fileops.BadReply(f"sandboxed reader: unreadable reply ({exc})") from exc


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    """Everything until EOF, keeping at most `cap` bytes (the rest is read and dropped)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(64 * 1024):
        if size < cap:
            chunks.append(chunk[: cap - size])
        size += len(chunk)
    return b"".join(chunks)
