"""Paths as a tool would open them, for the permission rules: a rule on `/etc/passwd`
must hold for `/etc//passwd`, `/usr/../etc/passwd` and `/proc/self/root/etc/passwd`.

`lexical` needs no file system (the supervisor's view: `.`, `..`, `//`, `~`, the
session's working directory and the `/proc` aliases of `/` and of the working
directory); `real` also follows symlinks (the executor's view, just before it runs
the call, where the files are).
"""

from __future__ import annotations

import os
import posixpath
import re

#: `/proc/self/root`, `/proc/thread-self/root`, `/proc/<pid>/root`: another name of `/`
#: (for another process in another mount namespace it may not be; judging it as `/` is
#: the strict reading). `/proc/self/cwd`: the working directory of the tool itself.
_PROC_ROOT = re.compile(r"^/proc/(?:self|thread-self|\d+)/root(?=/|$)")
_PROC_CWD = re.compile(r"^/proc/(?:self|thread-self)/cwd(?=/|$)")


def lexical(path: str, cwd: str = "") -> str:
    """`path` absolute (against `cwd`; relative as it was when `cwd` is unknown), with
    `~` expanded, `.`, `..` and repeated `/` resolved, and the `/proc` aliases of `/`
    and of the working directory replaced, until nothing changes."""
    if path.startswith("~"):
        path = os.path.expanduser(path)
    if not path.startswith("/") and cwd:
        path = posixpath.join(cwd, path)
    for _ in range(32):  # /proc/self/root/proc/self/root/... is finite; so is this bound
        before = path
        path = _normal(path)
        path = _PROC_ROOT.sub("", path) or "/"
        if cwd and _PROC_CWD.match(path):
            path = _PROC_CWD.sub(lambda _m: cwd.rstrip("/"), path) or "/"
        if path == before:
            break
    return path


def _normal(path: str) -> str:
    absolute = path.startswith("/")
    path = posixpath.normpath(path)
    if absolute:  # POSIX keeps a leading `//` apart; Linux does not
        path = "/" + path.lstrip("/")
    return path


def real(path: str, cwd: str) -> str:
    """`path` as the kernel resolves it from `cwd`: `lexical`, then every symlink
    followed (`os.path.realpath`; a missing tail is kept as written)."""
    path = os.path.expanduser(path)
    if not path.startswith("/"):
        path = posixpath.join(cwd or os.getcwd(), path)
    return lexical(os.path.realpath(path), cwd)
