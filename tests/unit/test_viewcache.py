"""Remembered views (`actors/sandbox/viewcache.py`): a view is given again only while
the file system says what it said when the view was decided; whatever would make
`view_for` decide differently (the directory removed, remade under another owner,
replaced by a link, a write path that appears or becomes a link) is seen at the
next call, and a mount or unmount forgets everything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actors.sandbox import modes
from actors.sandbox.viewcache import MountWatch, ViewCache, all_local, mounts

SECRET = ("/nonexistent-oploop-home",)


class Counting:
    """`modes.view_for` with the sandbox's secrets, counting its decisions."""

    def __init__(self) -> None:
        self.decided = 0

    def __call__(self, mode: str, cwd: str, workspace: str, *,
                 write_paths: tuple[str, ...] = (),
                 deny_read: tuple[str, ...] = ()) -> modes.WorkView:
        self.decided += 1
        return fresh(mode, cwd, workspace, write_paths)


def fresh(mode: str, cwd: str, workspace: str = "/ws/s1",
          write_paths: tuple[str, ...] = ()) -> modes.WorkView:
    """What `view_for` decides now."""
    return modes.view_for(mode, cwd, workspace=workspace, write_paths=write_paths,
                          secret=SECRET)


def view(cache: ViewCache, mode: str, cwd: str, write_paths: tuple[str, ...] = ()
         ) -> modes.WorkView:
    """What the executor does: the remembered view, else decided (and remembered)."""
    key = ViewCache.key(mode, cwd, "/ws/s1", write_paths)
    found = cache.lookup(key)
    if found is not None:
        return found
    decided, remembered = cache.decide(key)
    if remembered is not None:
        cache.keep(remembered)
    return decided


@pytest.fixture
def cache(tmp_path: Path) -> tuple[ViewCache, Counting]:
    decide = Counting()
    made = ViewCache(decide, SECRET)
    key = ViewCache.key(modes.READ_ONLY, str(tmp_path), "/ws/s1")
    made.lookup(key)  # opens the mount watch
    watch = made._watch
    if watch is None or not all_local([str(tmp_path)], watch.table()):
        made.close()
        pytest.skip("the test's directory is not on a local file system: never remembered")
    yield made, decide
    made.close()


def test_a_view_is_decided_once_while_nothing_changes(
        cache: tuple[ViewCache, Counting], tmp_path: Path) -> None:
    views, decide = cache
    project = tmp_path / "project"
    project.mkdir()
    for _ in range(3):
        assert view(views, modes.WORKSPACE_WRITE, str(project)) == fresh(
            modes.WORKSPACE_WRITE, str(project))
    assert decide.decided == 1
    # Sessions of one agent in one directory share it; scratch views are per workspace.
    key = ViewCache.key(modes.WORKSPACE_WRITE, str(project), "/ws/other")
    assert views.lookup(key) == fresh(modes.WORKSPACE_WRITE, str(project))
    assert ViewCache.key(modes.SCRATCH, "", "/ws/a") != ViewCache.key(modes.SCRATCH, "", "/ws/b")


def test_a_workdir_replaced_by_a_link_between_two_calls_is_seen(
        cache: tuple[ViewCache, Counting], tmp_path: Path) -> None:
    views, decide = cache
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    assert view(views, modes.WORKSPACE_WRITE, str(project)).cwd == str(project)
    project.rename(tmp_path / "moved")
    project.symlink_to(elsewhere)
    got = view(views, modes.WORKSPACE_WRITE, str(project))
    assert got.cwd == str(elsewhere) and got.writable == (str(elsewhere),)
    assert got == fresh(modes.WORKSPACE_WRITE, str(project))
    assert decide.decided == 2
    # ...and a link is never remembered: decided again at every call.
    view(views, modes.WORKSPACE_WRITE, str(project))
    assert decide.decided == 3


def test_a_parent_replaced_by_a_link_is_seen(
        cache: tuple[ViewCache, Counting], tmp_path: Path) -> None:
    views, decide = cache
    (tmp_path / "a" / "project").mkdir(parents=True)
    (tmp_path / "b" / "project").mkdir(parents=True)
    cwd = str(tmp_path / "a" / "project")
    view(views, modes.READ_ONLY, cwd)
    (tmp_path / "a").rename(tmp_path / "old")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    assert view(views, modes.READ_ONLY, cwd).cwd == str(tmp_path / "b" / "project")
    assert decide.decided == 2


def test_a_removed_workdir_is_refused_at_the_next_call(
        cache: tuple[ViewCache, Counting], tmp_path: Path) -> None:
    views, _ = cache
    project = tmp_path / "project"
    project.mkdir()
    view(views, modes.WORKSPACE_WRITE, str(project))
    project.rmdir()
    with pytest.raises(modes.WorkdirRefused, match="does not exist"):
        view(views, modes.WORKSPACE_WRITE, str(project))
    project.write_text("a file now")
    with pytest.raises(modes.WorkdirRefused, match="not a directory"):
        view(views, modes.WORKSPACE_WRITE, str(project))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_workdir_remade_under_another_owner_gets_its_owner(
        cache: tuple[ViewCache, Counting], tmp_path: Path) -> None:
    views, decide = cache
    project = tmp_path / "project"
    project.mkdir()
    assert view(views, modes.WORKSPACE_WRITE, str(project)).uid == os.getuid()
    shutil.rmtree(project)
    project.mkdir()
    os.chown(project, 54321, 54321)
    got = view(views, modes.WORKSPACE_WRITE, str(project))
    assert (got.uid, got.gid) == (54321, 54321) == (fresh(modes.WORKSPACE_WRITE,
                                                          str(project)).uid, 54321)
    assert decide.decided == 2


def test_write_paths_that_appear_or_become_links_are_seen(
        cache: tuple[ViewCache, Counting], tmp_path: Path) -> None:
    views, decide = cache
    project, later, other = tmp_path / "project", tmp_path / "later", tmp_path / "other"
    project.mkdir()
    other.mkdir()
    paths = (str(later),)
    assert view(views, modes.WORKSPACE_WRITE, str(project), paths).writable == (str(project),)
    later.mkdir()
    got = view(views, modes.WORKSPACE_WRITE, str(project), paths)
    assert got.writable == (str(project), str(later))
    assert view(views, modes.WORKSPACE_WRITE, str(project), paths) is got  # remembered
    later.rmdir()
    later.symlink_to(other)
    got = view(views, modes.WORKSPACE_WRITE, str(project), paths)
    assert got == fresh(modes.WORKSPACE_WRITE, str(project), write_paths=paths)
    # (the link is in no writable directory, so no tool made it: followed; one in the
    # working directory would be refused, `test_modes`)
    assert got.writable == (str(project), str(other)) and got.linked == ()
    assert decide.decided == 3


def test_a_view_decided_from_a_state_that_changed_meanwhile_is_not_remembered(
        tmp_path: Path) -> None:
    """A view that is not what the recorded state gives (a link came and went while it
    was decided) is used once, never remembered."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()

    def decide(mode: str, cwd: str, workspace: str, **_: object) -> modes.WorkView:
        return fresh(mode, str(elsewhere), workspace)  # as if `cwd` were a link then

    views = ViewCache(decide, SECRET)
    try:
        key = ViewCache.key(modes.READ_ONLY, str(project), "/ws/s1")
        assert views.lookup(key) is None
        decided, remembered = views.decide(key)
        assert decided.cwd == str(elsewhere) and remembered is None
    finally:
        views.close()


def test_paths_on_a_file_system_that_may_hang_are_always_decided_in_the_thread(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()

    class OnNfs(MountWatch):
        """The real watch, with the test's directory on NFS in its table."""

        def table(self) -> list[tuple[str, str]]:
            return [*super().table(), (str(tmp_path), "nfs4")]

    decide = Counting()
    views = ViewCache(decide, SECRET, watch=OnNfs)
    try:
        for _ in range(3):
            assert view(views, modes.READ_ONLY, str(project)) == fresh(modes.READ_ONLY,
                                                                      str(project))
        assert decide.decided == 3
    finally:
        views.close()


def test_the_mount_table_read_from_mountinfo() -> None:
    table = mounts(textwrap.dedent("""\
        22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
        40 22 0:40 / /home/u/my\\040net rw - nfs4 srv:/x rw
        41 22 0:41 / /tmp rw - tmpfs tmpfs rw
        """))
    assert table == [("/", "ext4"), ("/home/u/my net", "nfs4"), ("/tmp", "tmpfs")]
    assert all_local(["/tmp/a", "/home", "/home/u"], table)
    assert not all_local(["/home/u/my net/project"], table)
    assert not all_local(["/home/u/my net"], table)
    assert all_local(["/home/u/my netting"], table)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a mount of its own needs root and unshare(1)")
def test_a_mount_or_unmount_forgets_every_view(tmp_path: Path) -> None:
    """In a mount namespace of its own (nothing mounted here): a tmpfs mounted on the
    working directory and unmounted again, each seen at the next call."""
    project = tmp_path / "project"
    project.mkdir()
    watch = MountWatch()
    try:
        if not all_local([str(project)], watch.table()):
            pytest.skip("the test's directory is not on a local file system: never remembered")
    finally:
        watch.close()
    script = textwrap.dedent(f"""
        import subprocess
        from actors.sandbox import modes
        from actors.sandbox.viewcache import ViewCache
        decided = []
        def decide(mode, cwd, workspace, **kw):
            decided.append(cwd)
            return modes.view_for(mode, cwd, workspace=workspace, **kw)
        views = ViewCache(decide)
        key = ViewCache.key(modes.READ_ONLY, {str(project)!r}, "/ws/s1")
        def ask():
            found = views.lookup(key)
            if found is None:
                found, remembered = views.decide(key)
                views.keep(remembered)
            return found
        ask(); ask()
        assert len(decided) == 1, decided
        subprocess.run(["mount", "-t", "tmpfs", "none", {str(project)!r}], check=True)
        ask()
        assert len(decided) == 2 and views.generation == 1, (decided, views.generation)
        ask()
        assert len(decided) == 2
        subprocess.run(["umount", {str(project)!r}], check=True)
        ask()
        assert len(decided) == 3 and views.generation == 2
        print("ok")
    """)
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                           "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
