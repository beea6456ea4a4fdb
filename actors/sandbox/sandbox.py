"""`Sandbox`: start risky tools through the launcher, and kill their whole tree.

The executor owns one Sandbox. A call is checked against the machine's layers
(`refusal.py`), becomes a launch spec (`launchspec.py`: policy × machine layers ×
the call's view, its network from `network.py`), the launcher is forked or
exec'd with it, and the returned `SandboxedChild` (`child.py`) kills by cgroup
plus the launcher, whose pid namespace dies with it. Reads and listings go to
the session's persistent reader (`readers.py`).

`Extra`, `SandboxedChild` and `SandboxRefused` are re-exported from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors import fileops, memoryfs
from actors.tools.piped import DEVNULL, PIPE, STDOUT, PipedProcess, read_pipe
from actors.tools.process import Spawner, ToolRefused, release
from actors.tools.runtoend import run_to_end

from . import launcher as launcher_mod
from . import modes, uids
from .cgroups import CallCgroup, CgroupTree, Hierarchies, Limits, executor_limits
from .child import SandboxedChild, remove_when_empty
from .filereplies import (
    _DENIED,
    _LIST_ENTRY_BYTES,
    _READ_REPLY_SLACK,
    _WRITE_REPLY_CAP,
    _parsed,
    _read_capped,
    _read_framed,
)
from .forkserver import IDLE_S as FORK_IDLE_S
from .forkserver import ForkServer, ForkServerGone
from .launchspec import _HOMES, WRITING_OPS, Extra, build_spec
from .layers import machine_layers
from .network import NetAccess, Proxied, apply_network, network_policy
from .policy import Policy, SandboxConfig
from .reader import identity
from .readers import ReaderPool
from .refusal import SandboxRefused, check_layers, check_reachable, uses_bwrap
from .viewcache import ViewCache
from .workspaces import Workspaces, commands_paused, safe_name

__all__ = ["Extra", "Sandbox", "SandboxRefused", "SandboxStatistics", "SandboxedChild"]

log = logging.getLogger("oploop.sandbox")

FileWriterFn = Callable[[Path, bytes, Path], Awaitable[str]]
ReadResult = tuple[bytes, bool, int, str]
ListResult = tuple[list[tuple[bytes, str]], int, str]
FileReaderFn = Callable[[Path, Path, tuple[str, ...]], Awaitable[ReadResult]]
DirListerFn = Callable[[Path, Path, tuple[str, ...]], Awaitable[ListResult]]
MemoryRunnerFn = Callable[[Path, dict[str, Any]], Awaitable[tuple[bool, str]]]
#: Bytes of a memory command's reply at most: a file view of `memoryfs.FILE_MAX` bytes,
#: numbered (7 bytes more a line: one-byte lines make it 4.5 times as long).
_MEMORY_REPLY_CAP = 5 * memoryfs.FILE_MAX

LAUNCHER_DIR = str(Path(launcher_mod.__file__).resolve().parent)
#: `actors/`, after the launcher's own directory: the launcher imports `fileops` from it.
SHARED_DIR = str(Path(LAUNCHER_DIR).parent)
BOOTSTRAP = (
    f"import sys; sys.path[:0] = [{LAUNCHER_DIR!r}, {SHARED_DIR!r}]; import launcher; "
    "launcher.main(sys.argv)"
)
"""What the launcher's interpreter runs: the cached launcher module, not a script."""
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True, slots=True)
class SandboxStatistics:
    """What a sandbox holds now; between calls, a long-running executor holds nothing
    but its idle persistent readers (retired after `ReaderPool.idle_s`)."""

    launchers: int  # launchers started and not yet closed (persistent readers included)
    call_cgroups: int  # call cgroup directories present (one per hierarchy per call)
    readers: int = 0  # persistent readers held (idle ones are retired after a while)


class Sandbox:
    """Runs risky tools under their policies; one per executor process."""

    def __init__(
        self,
        config: SandboxConfig,
        workspaces: Path,
        *,
        hide: tuple[Path, ...] = (),
        layers: dict[str, str] | None = None,
        fork_server: bool = True,
    ) -> None:
        self.config = config
        self.workspaces = workspaces
        #: Each session's workspace, bounded by the `[workspaces]` quota.
        self.spaces = Workspaces(workspaces, config.workspaces)
        # Host paths the tool must not even see (the oploop home: runtime dir, policy).
        self.hide = tuple(str(p) for p in hide)
        self.layers = machine_layers() if layers is None else layers
        hier = Hierarchies.discover()
        self._hier = hier
        self._cgroups = CgroupTree(hier) if hier.v2 is not None or hier.v1 else None
        #: The caps over all of this executor's calls together (its cgroup directory).
        self.executor_limits: Limits = config.executor or executor_limits()
        self._started = False
        # Forks launchers from one pre-started launcher process: no interpreter start per call.
        self._fork = ForkServer() if fork_server else None
        #: Stop the fork server when idle this long (`forkserver.IDLE_S`); its timer.
        self.fork_idle_s = FORK_IDLE_S
        self._fork_timer: asyncio.TimerHandle | None = None
        self._subreaper = False
        self._launchers: set[int] = set()
        #: Persistent readers of read_file and list_dir, per session (`readers.py`).
        self.readers = ReaderPool()
        self._hidden: dict[modes.WorkView, tuple[str, ...]] = {}
        #: The views decided, remembered while the file system says the same (`viewcache.py`).
        self.view_cache = ViewCache(self._decide_view, self.hide)

    # -- life cycle --------------------------------------------------------------------

    def start(self, *, subreaper: bool = False) -> int:
        """Prepare this executor's cgroups and kill leftovers of dead executors (count).

        `subreaper`: orphans of sandboxed trees reparent here rather than to init
        (only for an executor process: it must then reap what it adopts).
        """
        killed = 0
        if self._cgroups is not None:
            killed = self._cgroups.sweep_leftovers()
            capped = self._use_cgroup(self.config.default)
            try:
                self._cgroups.prepare(self.executor_limits if capped else None)
            except OSError as exc:
                # Calls would run without the caps over them all: refuse those that
                # require the cgroup layer, as for any other missing layer.
                log.error("executor cgroup caps not applied: %s", exc)
                self.layers = {**self.layers, "cgroup": f"executor caps not applied: {exc}"}
        if subreaper:
            launcher_mod._prctl(_PR_SET_CHILD_SUBREAPER, 1)
            self._subreaper = True
        self._started = True
        return killed

    def close(self) -> None:
        """Retire the readers; stop the fork server; remove this executor's cgroup
        directories (and any call's left in them)."""
        self.readers.close()
        self.view_cache.close()
        if self._fork_timer is not None:
            self._fork_timer.cancel()
        if self._fork is not None:
            self._fork.close()
        if self._cgroups is not None:
            self._cgroups.close()

    def statistics(self) -> SandboxStatistics:
        """Launchers and call cgroups held now (a leak shows as a count that stays up)."""
        cgroups = len(self._cgroups.calls()) if self._cgroups is not None else 0
        return SandboxStatistics(len(self._launchers), cgroups, len(self.readers.readers()))

    # -- workspaces and policies ---------------------------------------------------------

    def workspace_path(self, session: str) -> Path:
        """Where the session's workspace is (no I/O: a read needs it only if it exists)."""
        return self.workspaces / safe_name(session)

    def workspace(self, session: str) -> Path:
        """The session's workspace directory: 0700, owned by the session's uid, on its own
        quota-bounded file system (`workspaces.py`).

        Mounted first (nothing is made when it cannot be bounded), then given its
        session's own uid from the policy's range (`uids.assign`: a fresh image's
        root, or a workspace from before, is chowned to it); every call whose cwd
        is that workspace runs as its owner. Raises `WorkspaceRefused` (a
        `ToolRefused`) when the workspace cannot be bounded, and
        uids.UidsExhausted when the range has no uid left.
        """
        mounted = self.spaces.ensure(session)
        if not self._applies_uid(self.config.default):
            return mounted
        return uids.assign(self.workspaces, mounted.name, *self.config.default.uid_range)[0]

    @staticmethod
    def call_uid(policy: Policy, cwd: Path, view: modes.WorkView | None = None) -> int:
        """The uid a call in `cwd` runs as: the working directory's owner in the modes
        that work on the user's files (`view`); else the workspace's owner when it lies
        in the policy's range (its session's uid), else the range's first uid."""
        if view is not None and not view.confined:
            return view.uid
        first, last = policy.uid_range
        try:
            owner = os.stat(cwd).st_uid
        except OSError:
            return first
        return owner if first <= owner <= last else first

    def view(self, mode: str, cwd: str, session: str, *, write_paths: tuple[str, ...] = (),
             deny_read: tuple[str, ...] = ()) -> modes.WorkView:
        """The view of a session's calls (`modes.view_for`); WorkdirRefused when `cwd`
        cannot be its working directory (hidden from tools, a system directory...)."""
        return self._decide_view(mode, cwd, str(self.workspace_path(session)),
                                 write_paths=write_paths, deny_read=deny_read)

    def _decide_view(self, mode: str, cwd: str, workspace: str, *,
                     write_paths: tuple[str, ...] = (),
                     deny_read: tuple[str, ...] = ()) -> modes.WorkView:
        return modes.view_for(mode, cwd, workspace=workspace, write_paths=write_paths,
                              deny_read=deny_read, secret=self.hide)

    def hidden(self, view: modes.WorkView) -> tuple[str, ...]:
        """Every path hidden from the calls of `view` (for the tools' messages)."""
        found = self._hidden.get(view)
        if found is None:
            if len(self._hidden) >= 64:
                self._hidden.clear()
            homes = _HOMES if view.confined else ()
            found = self._hidden[view] = (*homes, *self.hide, *view.hidden)
        return found  # (kept per view: asked for at every call, a hundred-odd paths)

    def remove_workspace(self, session: str) -> None:
        """Delete the session's workspace and its quota image (the session is removed);
        its readers are retired first."""
        self.readers.drop(str(self.workspace_path(session)))
        self.spaces.remove(session)

    def _applies_uid(self, policy: Policy) -> bool:
        return policy.applies("uid") and not self.layers.get("uid")

    def check(self, tool: str, policy: Policy, *, writing: bool = False,
              view: modes.WorkView | None = None) -> None:
        """Raise SandboxRefused if `policy` requires a layer this machine lacks (or, for
        a `view` on the user's files, one that view stands on): `refusal.check_layers`."""
        check_layers(tool, policy, self.layers, writing=writing, view=view)

    # -- launching ---------------------------------------------------------------------

    def spawner(self, tool: str, policy: Policy | None = None,
                net: NetAccess = "none") -> Spawner:
        """A `Spawner` (for `make_shell`) that runs commands under `tool`'s policy, with
        the network `net` (`network.py`: "none", "all", or through the proxy)."""

        async def spawn(command: str, cwd: Path) -> SandboxedChild:
            pol = policy or self.config.policy(tool)
            # stderr on a pipe of its own, so a viewer can tell it from stdout.
            err_r, err_w = os.pipe()
            try:
                child = await self.launch(tool, pol, cwd, argv=["/bin/sh", "-c", command],
                                          net=net, stderr=err_w)
            except BaseException:
                os.close(err_r)
                raise
            finally:
                os.close(err_w)
            try:
                child.stderr, child.stderr_pipe = await read_pipe(err_r)
            except BaseException:
                child.kill()
                await release(child)  # to the end, even if cancelled (again) meanwhile
                raise
            return child

        return spawn

    def file_writer(self, tool: str, policy: Policy | None = None) -> FileWriterFn:
        """A `FileWriter` (for `make_write_file`): the write happens inside the sandbox."""

        async def write(target: Path, data: bytes, cwd: Path) -> str:
            pol = policy or self.config.policy(tool)
            return await self.write_file(tool, pol, target, data, cwd)

        return write

    def file_reader(self, cap: int, tool: str = "read_file",
                    policy: Policy | None = None) -> FileReaderFn:
        """A `FileReader` (for `make_read_file`): the read happens inside the sandbox, at
        most `cap` bytes; (data, more?, st_size, real path) or OSError."""

        async def read(target: Path, cwd: Path, readable: tuple[str, ...]) -> ReadResult:
            pol = policy or self.config.policy(tool)
            reply = await self._read_op(tool, pol, cwd, ("read", str(target), cap), readable,
                                        cap + _READ_REPLY_SLACK)
            return _parsed(fileops.parse_read, reply)

        return read

    def dir_lister(self, cap: int, tool: str = "list_dir",
                   policy: Policy | None = None) -> DirListerFn:
        """A `DirLister` (for `make_list_dir`): the listing happens inside the sandbox, at
        most `cap` entries; (entries, count, real path) or OSError."""

        async def listing(target: Path, cwd: Path, readable: tuple[str, ...]) -> ListResult:
            pol = policy or self.config.policy(tool)
            reply = await self._read_op(tool, pol, cwd, ("list", str(target), cap), readable,
                                        cap * _LIST_ENTRY_BYTES + _READ_REPLY_SLACK)
            return _parsed(fileops.parse_list, reply)

        return listing

    def memory_runner(self, tool: str = "memory", policy: Policy | None = None
                      ) -> MemoryRunnerFn:
        """A `MemoryRunner` (for `make_memory`): each command runs in a launcher locked
        down like a write whose working directory, and only writable path, is the
        memory folder; the rest of the oploop home stays hidden."""

        async def run(folder: Path, command: dict[str, Any]) -> tuple[bool, str]:
            pol = policy or self.config.policy(tool)
            return await self.memory(tool, pol, folder, command)

        return run

    async def memory(self, tool: str, policy: Policy, folder: Path,
                     command: dict[str, Any]) -> tuple[bool, str]:
        """Run one memory command (`memoryfs`) on `folder` in the sandbox: (is_error,
        text). The folder is made (0700) and given a uid of the policy's range of its
        own, as a workspace is. Raises OSError or ToolRefused."""
        await asyncio.to_thread(self._memory_folder, policy, folder)
        # Not the session's view: the call sees and writes the memory folder alone.
        with modes.using(None):
            returncode, reply = await self._run_op(tool, policy, folder,
                                                   ("memory", {"input": command}), (),
                                                   _MEMORY_REPLY_CAP, framed=False)
        if returncode == 0 and reply[:1] in (b"E", b"O"):
            return reply[:1] == b"E", reply[1:].decode("utf-8", "replace")
        raise OSError(0, f"the sandboxed memory command exited with status {returncode}")

    def _memory_folder(self, policy: Policy, folder: Path) -> None:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._applies_uid(policy):
            uids.assign(folder.parent, folder.name, *policy.uid_range)
        else:
            folder.mkdir(mode=0o700, exist_ok=True)

    async def write_file(
        self, tool: str, policy: Policy, target: Path, data: bytes, cwd: Path
    ) -> str:
        """Write `data` to `target` from a locked-down launcher; the real path written.

        Raises OSError (with the sandbox's reason) or SandboxRefused.
        """
        job = {"path": str(target), "data": data}
        returncode, reply = await self._run_op(tool, policy, cwd, ("write", job), (),
                                               _WRITE_REPLY_CAP, framed=False)
        text = reply.decode("utf-8", "surrogateescape")  # the real path, losslessly
        if returncode == 0 and text.startswith("wrote "):
            return text.rsplit(" to ", 1)[-1]
        code, _, reason = text.partition("\t")
        err = int(code) if code.isdigit() else 0
        if err in _DENIED:
            view = modes.CURRENT.get() or modes.WorkView(modes.SCRATCH, str(cwd))
            reason += f" ({view.allow_hint()})"
        raise OSError(err, reason or f"sandboxed writer exited with status {returncode}")

    async def _read_op(self, tool: str, policy: Policy, cwd: Path, what: tuple[str, str, int],
                       readable: tuple[str, ...], reply_cap: int) -> bytes:
        """A read or a listing (`what`: kind, path, cap): on a persistent reader of the
        session (`readers.py`), or in a launcher of its own where a reader cannot be
        kept (a policy with a cgroup of its own, no fork server).
        The whole call, a reader's start included, is bounded by the policy's timeout."""
        kind, path, cap = what
        if self._fork is None or self._use_cgroup(policy):
            return await self._file_op(tool, policy, cwd, (kind, {"path": path, "cap": cap}),
                                       readable, reply_cap)
        paths = (str(cwd), *readable)
        view = modes.CURRENT.get()
        # Everything the reader's lockdown is made of (not the tool's name: read_file and
        # list_dir of one policy share a reader): a reader serves only its own key.
        key = (policy, self.call_uid(policy, cwd, view), self.hide, view, paths,
               identity(paths))
        request = fileops.request(b"R" if kind == "read" else b"L", path, cap)

        async def launch(duplex: int) -> SandboxedChild:
            return await self.launch(tool, policy, cwd, op=("serve", {}), readable=readable,
                                     duplex=duplex)

        return await self.readers.read(key, paths, launch, request, reply_cap, policy.timeout_s,
                                       policy.reader == "thread")

    async def _file_op(self, tool: str, policy: Policy, cwd: Path, op: tuple[str, dict[str, Any]],
                       readable: tuple[str, ...], cap: int) -> bytes:
        """Run a read or a listing in a locked-down launcher; its framed reply."""
        returncode, reply = await self._run_op(tool, policy, cwd, op, readable, cap, framed=True)
        if not reply:
            raise OSError(0, f"the sandboxed reader exited with status {returncode}")
        return reply

    async def _run_op(self, tool: str, policy: Policy, cwd: Path, op: tuple[str, dict[str, Any]],
                      readable: tuple[str, ...], cap: int, *, framed: bool
                      ) -> tuple[int | None, bytes]:
        """Launch one file operation; (exit status, its reply on stdout, at most `cap` bytes).

        `framed`: the reply carries its length (fileops), so the launcher is killed
        as soon as it is in, without waiting for the processes to exit (the exit
        status is then None or the kill's). The whole call, the launch included, is
        bounded by the policy's timeout; a refusal by the sandbox raises ToolRefused.
        """
        async with asyncio.timeout(policy.timeout_s):
            child = await self.launch(tool, policy, cwd, op=op, readable=readable)
            proc = child.process
            assert proc.stdout is not None
            try:
                if framed:
                    reply = await _read_framed(proc.stdout, cap)
                else:
                    reply = await _read_capped(proc.stdout, cap)
                    await proc.wait()
            finally:
                child.kill()
                refused = await release(child)  # to the end, even if cancelled (again) meanwhile
        if refused:
            raise ToolRefused(f"refused by the sandbox: {refused}")
        return proc.returncode, reply

    async def launch(
        self,
        tool: str,
        policy: Policy,
        cwd: Path,
        *,
        argv: list[str] | None = None,
        op: tuple[str, dict[str, Any]] | None = None,
        readable: tuple[str, ...] = (),
        duplex: int = -1,
        stderr: int = -1,
        extra: Extra | None = None,
        net: NetAccess = "none",
    ) -> SandboxedChild:
        """Start the launcher for one call: run `argv`, or a file operation `op`
        ("write", "read" or "list", and its job; or "serve", a persistent reader
        whose stdin and stdout are the socket `duplex`), which may also see `readable`.
        `argv` with `duplex` is a long-lived server speaking on that socket (an MCP
        server); `stderr` then is where its stderr goes (-1: with its stdout), and
        `extra` what it may see and use besides the policy's (environment, paths).
        `net`: a command's network ("none": the policy's; "all"; `Proxied`).

        Refused (`ToolRefused`) when a layer is missing, or the disk is below its
        reserve, or the workspaces are at the host's cap."""
        policy = network_policy(tool, policy, net, op)
        # A server (`extra`: MCP's) outlives the call that started it: no view of the call's.
        view = modes.CURRENT.get() if extra is None else None
        self.check(tool, policy, writing=op is not None, view=view)
        if op is None or op[0] in WRITING_OPS:  # (a read takes no room)
            self.spaces.check_room()
        uid = self.call_uid(policy, cwd, view)
        if uses_bwrap(policy, op is not None):
            check_reachable(tool, cwd, uid)
        if not self._started:
            self.start()
        call = None
        if self._cgroups is not None and self._use_cgroup(policy):
            call = self._cgroups.new_call()
        spec = build_spec(policy, cwd, call, uid, layers=self.layers, hier=self._hier,
                          executor_limits=self.executor_limits, hide=self.hide, argv=argv,
                          op=op, readable=readable, view=view)
        if extra is not None:
            extra.apply(spec)
        if isinstance(net, Proxied) and op is None:
            if not int(spec["unshare"]) & launcher_mod.CLONE_NEWNET:  # type: ignore[call-overload]
                raise ToolRefused(f"{tool}: refused: a network allowlist needs a network "
                                  f"namespace of the call's own (the namespaces layer)")
            apply_network(spec, net, policy)
        try:
            child = await self._start(spec, call, duplex, stderr)
        except BaseException:
            if call is not None:
                # Cancelled (or failed) after the launcher was started: it is killed and
                # reaped by now, but may have made the call's cgroup, and forked into it.
                await run_to_end(remove_when_empty(call))
            raise
        child.spec = spec
        return child

    async def _start(self, spec: dict[str, object], call: CallCgroup | None,
                     duplex: int = -1, stderr: int = -1) -> SandboxedChild:
        """Start the launcher: forked by the fork server, or exec'd if that is gone.

        A cancellation meanwhile kills and reaps a launcher already started.
        """
        if self._fork is not None:
            try:
                return await self._launch_forked(spec, call, duplex, stderr)
            except ForkServerGone as exc:
                log.warning("%s; starting this launcher by exec", exc)
        spec_fd = os.memfd_create("oploop-launch")
        err_r, err_w = os.pipe()
        try:
            os.write(spec_fd, marshal.dumps(spec))
            os.lseek(spec_fd, 0, os.SEEK_SET)
            # Not asyncio's subprocess transport: cancelled with every task at once (an
            # executor's stop) it could hang for good (`actors/tools/piped.py`).
            proc = PipedProcess.start(
                [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(spec_fd), str(err_w)],
                stdin=duplex if duplex >= 0 else DEVNULL,
                stdout=duplex if duplex >= 0 else PIPE,
                stderr=stderr if stderr >= 0 else STDOUT,
                pass_fds=(spec_fd, err_w),
                env={},  # nothing of the executor's environment (API keys) reaches the tool
                cwd="/",
            )
        except BaseException:
            os.close(err_r)
            raise
        finally:
            os.close(spec_fd)
            os.close(err_w)
        # A launcher from its fork on, before any await: `sweep_orphans` (run when
        # another call closes) kills and reaps every child of ours that is not one.
        self._launchers.add(proc.pid)
        try:
            await proc.connect()  # cancelled: the launcher is killed and reaped first
        except BaseException:
            self._launchers.discard(proc.pid)
            os.close(err_r)
            raise
        return SandboxedChild(proc, call, err_r, self._closed)

    async def _launch_forked(
        self, spec: dict[str, object], call: CallCgroup | None, duplex: int = -1,
        stderr: int = -1,
    ) -> SandboxedChild:
        assert self._fork is not None
        # The launcher's parent is the server: that is whom its parent-death signal watches.
        spec["ppid"] = self._fork.pid
        spec_fd = os.memfd_create("oploop-launch")
        try:
            os.write(spec_fd, marshal.dumps(spec))
            os.lseek(spec_fd, 0, os.SEEK_SET)
            unshare = int(spec["unshare"])  # type: ignore[call-overload]
            file_op = any(key in spec for key in ("write", "read", "list", "serve", "memory"))
            pid_ns = file_op and bool(unshare & launcher_mod.CLONE_NEWPID)
            proc, err_r = await self._fork.launch(spec_fd, pid_ns=pid_ns, duplex=duplex,
                                                  stderr=stderr)
        finally:
            os.close(spec_fd)
        self._launchers.add(proc.pid)
        return SandboxedChild(proc, call, err_r, self._closed)

    def _closed(self, child: SandboxedChild) -> None:
        self._launchers.discard(child.process.pid)
        if self._subreaper:
            self.sweep_orphans()
        if not self._launchers:
            self._arm_fork_retirement()

    def _arm_fork_retirement(self) -> None:
        """Look again in `fork_idle_s`: an idle fork server is stopped then."""
        if self._fork is None or self._fork.running_pid() is None:
            return
        if self._fork_timer is not None:
            self._fork_timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not in a loop (a synchronous caller): stopped at close
        self._fork_timer = loop.call_later(self.fork_idle_s, self._retire_fork)

    def _retire_fork(self) -> None:
        self._fork_timer = None
        if self._fork is None or self._launchers:
            return  # a launcher alive (a reader, a tool): its end arms this again
        if not self._fork.stop_if_idle(self.fork_idle_s):
            self._arm_fork_retirement()  # it forked meanwhile: look again later

    def sweep_orphans(self) -> int:
        """The last layer: kill and reap processes adopted as subreaper; count them.

        Any child of ours that is not a live launcher was reparented here
        because the launcher above it died: it belongs to a sandboxed tree.
        """
        swept = 0
        server = self._fork.running_pid() if self._fork is not None else None
        with commands_paused() as clear:
            if not clear:
                return 0  # a workspace command (mkfs, mount) is a child too: next time
            for pid in launcher_mod._children(os.getpid()):
                if pid in self._launchers or pid == server:
                    continue
                tree = [pid]
                while tree:
                    victim = tree.pop()
                    tree.extend(launcher_mod._children(victim))
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                swept += 1
        return swept

    def _use_cgroup(self, policy: Policy) -> bool:
        return self._cgroups is not None and policy.applies("cgroup") and not self.layers["cgroup"]
