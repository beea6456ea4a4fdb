"""Shared fixtures: every test must leave no child process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from homes import OUR_DIRS, make_home, remove_home

from bench import pgcluster

# The hosts of the tests run without the gateway (one process less each, and no port
# to share); the gateway's own tests turn it on, on a free port.
os.environ.setdefault("OPLOOP_HTTP_LISTEN", "off")
# The hosts of the suite keep the tools in each session's scratch workspace (the
# integration cases look there, and never write into the checkout they run from);
# the modes that work in the start's directory: tests/sandbox/test_modes.py and the
# cases that set OPLOOP_SANDBOX or an agent's `sandbox` themselves.
os.environ.setdefault("OPLOOP_SANDBOX", "scratch")
# A suite started in the background by a shell without job control (`./scripts/test &`
# in a script) inherits SIGINT ignored, and so would every command it starts: `oploop`
# then rightly keeps ignoring Ctrl-C, as a background job must. The tests play a user
# at a terminal, whose shell gives the command in the foreground the default: a no-op
# handler here (the runner still ignores Ctrl-C) becomes the default across `exec`.
if (signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        and threading.current_thread() is threading.main_thread()):
    signal.signal(signal.SIGINT, lambda _sig, _frame: None)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Fail a test that leaves a child process of the test runner alive."""
    before = _children()
    yield
    deadline = time.monotonic() + 5
    leaked = _children() - before
    while leaked and time.monotonic() < deadline:
        psutil.wait_procs([psutil.Process(p) for p in leaked if psutil.pid_exists(p)], timeout=0.2)
        leaked = {p for p in _children() - before if psutil.pid_exists(p)}
    for pid in leaked:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    assert not leaked, f"test leaked processes: {sorted(leaked)}"


def _test_mounts() -> set[str]:
    """Mount points under the directories this test run made (`homes.OUR_DIRS`)."""
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f}
    return {p for p in points if any(p.startswith(d) for d in OUR_DIRS)}


@pytest.fixture(autouse=True, scope="module")
def no_leaked_mounts(tmp_path_factory):
    """Fail a test module that leaves a workspace file system mounted (each holds a
    loop device).

    Per module, since a module's hosts may be shared by its tests; set up before,
    and so torn down after, the module's own fixtures: their clean-up
    (`remove_home`) has run when this looks.
    """
    base = str(tmp_path_factory.getbasetemp()) + "/"
    if base not in OUR_DIRS:
        OUR_DIRS.append(base)
    before = _test_mounts()
    yield
    leaked = _test_mounts() - before
    for point in sorted(leaked, reverse=True):  # deepest first
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    assert not leaked, f"test left file systems mounted: {sorted(leaked)}"


@pytest.fixture
def short_home():
    """An OPLOOP_HOME short enough for unix socket paths (pytest's tmp paths are not)."""
    home = make_home("oph-")
    yield home
    remove_home(Path(home))




@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL server for the whole run (`bench.pgcluster`), started at its
    first use and deleted at the end; the test skips, saying why, where none can run."""
    why = pgcluster.unavailable()
    if why:
        pytest.skip(f"PostgreSQL: {why}")
    cluster = pgcluster.PgCluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster):
    """The URL of an empty store of its own for one test: a fresh schema of the cluster's
    database (cheaper than a database), chosen by the URL's `search_path`."""
    yield pgcluster.fresh_schema(pg_cluster)


# --- the longest test modules first ------------------------------------------------------
# Each module runs whole on one xdist worker (--dist loadfile), taken in the order
# collected (scripts/test: --no-loadscope-reorder; xdist's own order is by number of
# tests, which put a few-test module of minutes last, keeping one worker busy after
# the others had finished). So the modules go longest first, by the seconds each took
# the last time it ran here (pytest's cache), a module never timed as one of a minute
# if it starts hosts (integration, sandbox), else of none: the short ones fill the end.
MODULE_SECONDS = "oploop/module-seconds"
_timed: dict[str, float] = {}


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _last_seconds(config) -> dict[str, float]:
    """The modules' seconds of their last run: from the controller on a worker (each
    worker must collect the same order), else from the cache (none without it)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return dict(workerinput.get(MODULE_SECONDS) or {})
    cache = getattr(config, "cache", None)
    return dict(cache.get(MODULE_SECONDS, {})) if cache is not None else {}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist, on the controller) Give each worker the modules' last seconds."""
    node.workerinput[MODULE_SECONDS] = _last_seconds(node.config)


def pytest_collection_modifyitems(config, items):
    """The longest modules first (see above); a module's tests keep their order."""
    seconds = _last_seconds(config)

    def expected(module: str) -> float:
        if module in seconds:
            return seconds[module]
        return 0.0 if module.startswith("tests/unit/") else 60.0

    rank = {m: -expected(m) for m in dict.fromkeys(_module(i.nodeid) for i in items)}
    items.sort(key=lambda item: rank[_module(item.nodeid)])  # (stable)


def pytest_runtest_logreport(report):
    """Count each module's seconds (set-up, call and tear-down of its tests)."""
    _timed[_module(report.nodeid)] = _timed.get(_module(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    """Keep the seconds of the modules that ran (on the controller, or without xdist)."""
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _timed:
        return
    kept = dict(cache.get(MODULE_SECONDS, {}))
    kept.update({m: round(s, 1) for m, s in _timed.items()})
    cache.set(MODULE_SECONDS, kept)
