"""A full disk: new work is refused naming the cause, nothing journaled is lost, the
host serves again once space returns, and `oploop up` starts on a full disk.

A real host in a home on a small tmpfs (mounting needs root: skipped otherwise);
the disk is filled by the test itself, as anything on the machine could.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from hostkit import TERMINAL, events_of, oploop, run, running_host, until

from actors.config import Config
from actors.supervisor.actor import Supervisor
from actors.supervisor.journal import Journal
from bus.client import Client
from bus.codec import decode
from bus.endpoints import Endpoints
from bus.errors import RemoteError

#: Small enough to fill in a moment, large enough for a host and its reserve.
TMPFS_MB = 160
RESERVE_MB = 8


@pytest.fixture
def small_disk_home(short_home: str) -> Iterator[str]:
    """`short_home` on its own tmpfs of `TMPFS_MB`, with the log's reserve set small."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0700",
                              "tmpfs", short_home], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        (Path(short_home) / "oploop.toml").write_text(
            f"[limits]\njournal_reserve_mb = {RESERVE_MB}\n")
        yield short_home
    finally:
        subprocess.run(["umount", "-l", short_home], check=False)


@contextlib.contextmanager
def full_disk(home: str) -> Iterator[None]:
    """Fill the home's file system to the last byte; free it on exit."""
    filler = Path(home) / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):  # the last partial megabyte too
            while True:
                f.write(b"\0" * 4096)
    try:
        with pytest.raises(OSError) as full:
            (Path(home) / "probe").write_bytes(b"\0" * 65536)
        assert full.value.errno == errno.ENOSPC
        yield
    finally:
        filler.unlink()
        (Path(home) / "probe").unlink(missing_ok=True)


def run_cli(home: str, prompt: str) -> subprocess.CompletedProcess[str]:
    return oploop(home, "run", "--json", prompt)


def test_a_full_disk_refuses_new_runs_loses_nothing_and_serving_resumes(small_disk_home):
    home = small_disk_home
    with running_host(home):
        first = run(home, "hello")
        assert first[-1]["type"] == "DONE"
        sid = first[0]["session"]
        with full_disk(home):
            refused = run_cli(home, "hello again")
            assert refused.returncode == 1, refused.stdout
            assert "disk_full" in refused.stderr and "journal_reserve_mb" in refused.stderr
            # What was journaled is all there, and still served.
            kept = oploop(home, "watch", "--json", "--no-follow", sid)
            assert kept.returncode == 0, kept.stderr
            assert events_of(kept.stdout) == first
            listed = oploop(home, "sessions", "--json")
            assert listed.returncode == 0 and sid in listed.stdout, listed.stderr
        # Space is back: new runs are served again (free space is measured once a second).
        deadline = time.monotonic() + 20
        while (again := run_cli(home, "hello once more")).returncode != 0:
            assert "disk_full" in again.stderr, again.stderr
            assert time.monotonic() < deadline, "still refused after space returned"
        assert events_of(again.stdout)[-1]["type"] == "DONE"
        follow_up = run(home, "and again", session=sid)
        assert follow_up[-1]["type"] == "DONE" and follow_up[0]["seq"] == len(first) + 1
    # `oploop up` always starts, even on a full disk; it refuses new work until space returns.
    with full_disk(home), running_host(home):
        kept = oploop(home, "watch", "--json", "--no-follow", sid)
        assert kept.returncode == 0, kept.stderr
        assert [e["seq"] for e in events_of(kept.stdout)][-1] == follow_up[-1]["seq"]
        refused = run_cli(home, "on a full disk")
        assert refused.returncode == 1 and "disk_full" in refused.stderr


def test_sessions_list_reads_finished_sessions_from_the_log(short_home):
    """Finished sessions are not kept in the supervisor's memory: the listing, a watch
    and a follow-up read them from the log, across a restart too."""
    with running_host(short_home):
        sids = [run(short_home, f"hello {i}")[0]["session"] for i in range(3)]
        stats = oploop(short_home, "status", "--json")
        assert stats.returncode == 0, stats.stderr
    with running_host(short_home):
        listed = oploop(short_home, "sessions", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
        flat = json.dumps(rows)
        assert all(sid in flat for sid in sids)
        follow_up = run(short_home, "more", session=sids[0])
        assert follow_up[-1]["type"] == "DONE"


@pytest.mark.parametrize("reserve_mb", [0, 4])
def test_a_commit_that_fails_publishes_nothing_and_ends_the_run_naming_the_cause(
        small_disk_home, reserve_mb):
    """An in-process supervisor on a disk that fills while a run is under way. With a
    reserve, the log gives it up and commits; without one, the commit fails, and the
    events wait unpublished. Either way the run ends `ERROR disk_full`, new runs are
    refused, and once space returns everything is journaled, published in order, and
    new runs are served."""
    home = small_disk_home

    async def scenario():
        endpoints = Endpoints.for_home(Path(home))
        endpoints.prepare()
        ctx = zmq.asyncio.Context.instance()
        ingest = ctx.socket(zmq.PULL)
        ingest.bind(endpoints.address("ingest"))
        journal = Journal(Path(home) / "sessions.db", reserve_mb=reserve_mb)
        supervisor = Supervisor(endpoints, Config(), journal)
        serving = asyncio.create_task(supervisor.serve())
        try:
            async with Client.connect(Path(home)) as client:
                started = await client.start("hello")  # no workers: waits for tools
                first = decode(await ingest.recv()).body
                # The next commit must need new disk blocks: a WAL that kept its size from
                # earlier commits takes a small one into room it already has.
                journal.log.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                with full_disk(home):
                    # An operation cancel must be journaled before it is acknowledged.
                    ack = asyncio.create_task(client.cancel(started.session, mode="operation"))
                    if reserve_mb:  # the reserve given up, the commit went through
                        await ack
                    else:
                        await until(lambda: supervisor.statistics()["journal_failing"],
                                    "the failed commit")
                    with pytest.raises(RemoteError) as refused:
                        await client.start("more")
                    published = [decode(await ingest.recv()).body] if reserve_mb else []
                    early = await ingest.poll(200)  # without a reserve: nothing, it waits
                acked = await ack
                events = [first, *published]
                while events[-1].type not in TERMINAL:
                    events.append(decode(await ingest.recv()).body)
                again = None
                for _ in range(100):  # free space is measured once a second
                    try:
                        again = await client.start("more")
                        break
                    except RemoteError as exc:
                        assert exc.code == "disk_full", exc
                        await asyncio.sleep(0.1)
                return started, early, refused.value, acked, events, again
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            ingest.close(0)

    started, early, refused, acked, events, again = asyncio.run(scenario())
    assert early == 0 or reserve_mb  # nothing published while no commit could be made
    assert refused.code == "disk_full"
    assert acked.state == "stopping"
    assert [e.type for e in events] == ["SESSION_START", "ERROR"]
    assert events[-1].data["error"] == "disk_full" and "full" in events[-1].data["message"]
    assert again is not None and again.session != started.session
    log = Journal(Path(home) / "sessions.db", reserve_mb=0)
    try:
        ended = log.load(started.session, {})
        assert ended is not None and ended.last_end == "ERROR" and ended.run_over
    finally:
        log.close()
