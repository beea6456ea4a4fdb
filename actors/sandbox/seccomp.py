"""The sandbox's seccomp filter, compiled once per socket setting with libseccomp.

The executor builds the filter (PyPI `pyseccomp`, a ctypes binding of
libseccomp) and exports it as classic BPF; the launcher installs those bytes
with one prctl, so it never loads libseccomp itself, and bubblewrap takes the
same bytes through `--seccomp FD`.

Denied (EPERM): without the network, every `socket()` (AF_UNIX included: Landlock
does not cover `connect()` on a path, so a unix socket could reach any host
daemon whose socket file the tool can see; a policy with `unix_sockets` keeps
AF_UNIX, for multiprocessing's forkserver and local test servers) and every
`socketpair()` but AF_UNIX (a connected pair reaches nothing outside, and
multiprocessing's pipes are such pairs); ptrace, process_vm_*, io_uring_*,
unshare/setns/mount and friends, namespace flags on clone, bpf, keyctl,
perf_event_open, userfaultfd, TIOCSTI and TIOCLINUX (terminal injection), and
setting a file's setuid or setgid bit (chmod and friends, or a file created with
it: open or openat with O_CREAT or O_TMPFILE, creat, mknod, mknodat): a tool
running as the working directory's owner (root, without capabilities, for a
root-owned one) must not leave a setuid program there for anyone who runs it later.
clone3 answers ENOSYS, so libc falls back to clone, whose flags a filter can
see; openat2 too (its mode is in a struct: a setuid file could be created through
it), so callers fall back to openat. Other architectures are killed (the i386
`int 0x80` and x32 ABIs too).
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from typing import Any

DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
    "open_by_handle_at", "name_to_handle_at", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "swapon", "swapoff", "reboot",
    "acct", "quotactl", "iopl", "ioperm", "personality",
)
"""Syscalls a sandboxed tool never gets (EPERM)."""

_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
_S_ISUID = 0o4000
_S_ISGID = 0o2000
_O_CREAT = 0o100
#: The kernel's __O_TMPFILE: O_TMPFILE less O_DIRECTORY (the kernel refuses the bit
#: without it). Such an open creates an unnamed file with the open's mode, and without
#: O_CREAT: linkat can give it a name afterwards.
_O_TMPFILE = 0o20000000
#: (syscall, index of its mode argument, index of its flags argument or -1, the flag
#: that makes the mode one a file is created with): a setuid or setgid bit there is
#: refused. mknod and mknodat make regular files too (S_IFREG), with their mode.
_MODE_ARGS = (("chmod", 1, -1, 0), ("fchmod", 1, -1, 0), ("fchmodat", 2, -1, 0),
              ("fchmodat2", 2, -1, 0), ("creat", 1, -1, 0), ("mknod", 1, -1, 0),
              ("mknodat", 2, -1, 0), ("open", 2, 1, _O_CREAT), ("open", 2, 1, _O_TMPFILE),
              ("openat", 3, 2, _O_CREAT), ("openat", 3, 2, _O_TMPFILE))
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_LOW32 = 0xFFFFFFFF
_AF_MAX = 64  # above every address family Linux has (46 in 6.x)
_SOCK_TYPE_MASK = 0xF


def _tcp_only(f: Any, deny: Any, sc: Any, unix: bool) -> None:
    """Refuse every socket() but a TCP one (and AF_UNIX with `unix`). libseccomp takes
    one comparison per argument per rule, so the refused values are listed; anything
    with bits above the low 32 (which the kernel ignores) is above the bounds, refused."""
    keep = {socket.AF_INET, socket.AF_INET6} | ({socket.AF_UNIX} if unix else set())
    for family in range(_AF_MAX):
        if family not in keep:
            f.add_rule(deny, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, family))
    f.add_rule(deny, "socket", sc.Arg(0, sc.GE, _AF_MAX))
    for kind in range(_SOCK_TYPE_MASK + 1):
        if kind != socket.SOCK_STREAM:
            f.add_rule(deny, "socket", sc.Arg(1, sc.MASKED_EQ, _SOCK_TYPE_MASK, kind))
    # Protocol 0 (the default) or IPPROTO_TCP; AF_UNIX's stream sockets take 0 too.
    for proto in range(1, socket.IPPROTO_TCP):
        f.add_rule(deny, "socket", sc.Arg(2, sc.MASKED_EQ, _LOW32, proto))
    f.add_rule(deny, "socket", sc.Arg(2, sc.GT, socket.IPPROTO_TCP))


class SeccompUnavailable(Exception):
    """libseccomp (or its Python binding) cannot be loaded here."""


def available() -> tuple[bool, str]:
    """Whether a filter can be built and the kernel can run it, with the reason if not."""
    if not os.path.exists("/proc/sys/kernel/seccomp/actions_avail"):
        return False, "the kernel has no seccomp filter support"
    try:
        build(network=False)
    except SeccompUnavailable as exc:
        return False, str(exc)
    return True, ""


@functools.cache
def build(*, network: bool, unix: bool = False, proxied: bool = False) -> bytes:
    """The filter as classic BPF bytes; `network` keeps every socket allowed, `unix`
    (without the network) AF_UNIX ones; `proxied` (without the network) TCP ones
    only: AF_INET/AF_INET6, SOCK_STREAM, protocol 0 or TCP (the way to the network
    proxy's forwarder; no raw, packet, netlink, UDP or SCTP socket)."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:  # no libseccomp, or not loadable
        raise SeccompUnavailable(f"libseccomp binding not loadable: {exc}") from exc
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture (iopl on arm64, say)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # openat2 carries its flags and mode in a struct no filter can read (a file created
    # setuid through it passed the rules below): ENOSYS, and callers fall back to openat.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "openat2")
    for flag in _NAMESPACE_FLAGS:
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for name, mode, flags, flag in _MODE_ARGS:
        for bit in (_S_ISUID, _S_ISGID):
            args = [sc.Arg(mode, sc.MASKED_EQ, bit, bit)]
            if flags >= 0:
                args.append(sc.Arg(flags, sc.MASKED_EQ, flag, flag))
            try:
                f.add_rule(deny, name, *args)
            except (OSError, ValueError, RuntimeError):
                continue  # not a syscall here (open, chmod, creat, mknod on arm64; fchmodat2)
    # ioctl's request is 32 bits: compare only those, or high garbage bits would slip by.
    for request in (_TIOCSTI, _TIOCLINUX):
        f.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, _LOW32, request))
    if not network:
        # NE on the full 64 bits is the safe direction: any other value is refused.
        if proxied:
            _tcp_only(f, deny, sc, unix)
        elif unix:
            f.add_rule(deny, "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
        else:
            f.add_rule(deny, "socket")
        f.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, socket.AF_UNIX))
    fd = os.memfd_create("oploop-seccomp")
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            f.export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
