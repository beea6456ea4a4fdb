"""Leases and fencing on a shared PostgreSQL store (`actors.pgleases`): two "hosts" are
two stores with fences of their own on one database; time is the database's."""

from __future__ import annotations

import time

import psycopg
import pytest

from actors.logstore import open_store
from actors.pgleases import Fence, LeaseLost, acquire, claim, give_up, holder, renew
from actors.sessionlog import Record, SessionRow

LEASE_S = 0.3  # (short: the tests wait for lapses)


def row(sid: str, running: bool = True) -> SessionRow:
    return SessionRow(sid, 1.0, b"meta", None, 1.0, running)


@pytest.fixture
def hosts(pg_url, tmp_path):
    made = []
    for name in ("a", "b"):
        store = open_store(tmp_path, pg_url)
        store.fence = Fence(name, LEASE_S)
        made.append(store)
    yield made
    for store in made:
        store.close()


def take(store, sid: str) -> int | None:
    epoch = acquire(store.connection(), sid, store.fence.owner, LEASE_S)
    if epoch is not None:
        store.fence.epochs[sid] = epoch
    return epoch


def epochs(claimed) -> dict[str, int]:
    return {sid: c.epoch for sid, c in claimed.items()}


def lapse() -> None:
    time.sleep(LEASE_S + 0.1)


def test_a_stale_owner_writes_nothing_once_another_claimed(hosts, pg_url):
    a, b = hosts
    assert take(a, "s") == 1
    a.commit([Record("s", 1, b"one")], [row("s")])
    assert take(b, "s") is None  # held by a: not b's to start
    assert holder(b.connection(), "s") == "a"
    lapse()
    assert epochs(claim(b.connection(), "b", LEASE_S)) == {"s": 2}
    b.fence.epochs["s"] = 2
    with pytest.raises(LeaseLost) as lost:
        a.commit([Record("s", 2, b"stale")])
    assert lost.value.sids == ["s"]
    b.commit([Record("s", 2, b"resumed")])
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT seq, epoch, frame FROM records ORDER BY seq").fetchall() == [
            (1, 1, b"one"), (2, 2, b"resumed")]


def test_a_lapsed_lease_writes_nothing_even_before_anyone_claims(hosts):
    a, _ = hosts
    take(a, "s")
    lapse()
    with pytest.raises(LeaseLost):
        a.commit([Record("s", 1, b"late")])
    assert a.last_seq("s") is None


def test_renewal_keeps_and_reports_what_is_held(hosts):
    a, b = hosts
    take(a, "s"), take(a, "t")
    for _ in range(3):
        time.sleep(LEASE_S / 2)
        assert renew(a.connection(), "a", LEASE_S) == {"s": 1, "t": 1}
    assert claim(b.connection(), "b", LEASE_S) == {}  # never lapsed


def test_a_runs_end_releases_its_lease_in_the_same_commit(hosts):
    a, b = hosts
    take(a, "s")
    a.commit([Record("s", 1, b"start")], [row("s")])
    a.commit([Record("s", 2, b"end")], [row("s", running=False)])
    assert "s" not in a.fence.epochs and holder(a.connection(), "s") is None
    assert take(b, "s") == 2  # a follow-up run anywhere; the epoch only grows


def test_claims_skip_locked_rows_and_never_share_a_session(hosts):
    a, b = hosts
    for sid in ("s", "t"):
        take(a, sid)
        a.commit([Record(sid, 1, b"x")], [row(sid)])
    lapse()
    with b.connection().transaction():  # b is checking "s" in a commit right now
        b.connection().execute("SELECT 1 FROM leases WHERE sid = 's' FOR UPDATE")
        with psycopg.connect(a.url, autocommit=True) as c:
            assert epochs(claim(c, "c", LEASE_S)) == {"t": 2}  # skipped, not waited for
    with psycopg.connect(a.url, autocommit=True) as c:
        got = claim(c, "c", LEASE_S)
    assert epochs(got) == {"s": 2} and got["s"].previous == "a"
    assert got["s"].lapsed_at < got["s"].claimed_at


def test_a_graceful_stop_hands_over_at_once(hosts):
    a, b = hosts
    take(a, "s")
    a.commit([Record("s", 1, b"x")], [row("s")])
    assert give_up(a.connection(), "a") == 1
    assert epochs(claim(b.connection(), "b", LEASE_S)) == {"s": 2}


def test_running_sessions_without_a_lease_are_claimed(hosts, pg_url):
    a, b = hosts
    a.fence = None  # (as `oploop store copy` writes them)
    a.commit([Record("s", 1, b"x")], [row("s")])
    assert epochs(claim(b.connection(), "b", LEASE_S)) == {"s": 1}


def test_a_first_claim_takes_back_its_own_leases_but_not_the_runs_it_began(hosts):
    # A restarted host (the same owner id, "a") takes back the leases its former self
    # held ("old"), not those of the runs it began itself before that first claim
    # ("new", `keep`): taken at the next epoch, a commit of such a run in between was
    # refused as a lease lost, and the run stopped and resumed on its own host.
    a, _ = hosts
    for sid in ("old", "new"):
        take(a, sid)
        a.commit([Record(sid, 1, b"x")], [row(sid)])
    got = claim(a.connection(), "a", LEASE_S, mine=True, keep=["new"])
    assert epochs(got) == {"old": 2} and got["old"].previous == "a"
    a.fence.epochs["old"] = 2
    a.commit([Record("new", 2, b"y")], [row("new")])  # still held at the epoch it began
    lapse()
    # A lapsed lease is taken whatever `keep` says: no longer this host's.
    assert epochs(claim(a.connection(), "a", LEASE_S, mine=True, keep=["new"])) == {
        "old": 3, "new": 2}


def test_a_hosts_first_lease_pass_leaves_the_runs_it_began_at_their_epoch(pg_url, tmp_path):
    import asyncio

    from actors.supervisor.ownership import Ownership

    store = open_store(tmp_path, pg_url)
    lost: list[set[str]] = []
    claimed: list[dict] = []
    own = Ownership(store, "h", "host-h", 5.0, claims=True, lost=lost.append,
                    claimed=claimed.append)
    try:
        assert own.acquire("s") == ""  # a run began before the first pass
        store.commit([Record("s", 1, b"x")], [row("s")])
        asyncio.run(own.tick(time.monotonic(), mine=True))
        assert own.fence.epochs == {"s": 1} and lost == [] and claimed == []
        store.commit([Record("s", 2, b"y")], [row("s")])  # (a bumped epoch: LeaseLost)
    finally:
        own.close()
        store.close()


def test_a_run_begun_after_the_first_claims_update_keeps_its_newer_lease(pg_url, tmp_path):
    # The first pass was slow (answered after the supervisor began serving): its claim
    # took back the former self's session "s" at epoch 2; a run of "s" started here
    # after that UPDATE, taking the lease at epoch 3; then the claim's answer came. That
    # run holds the newest epoch: it goes on, and nothing resumes "s" at epoch 2 (where
    # every commit was refused, and the lease, renewed as this host's, never lapsed).
    from actors.pgleases import Claimed
    from actors.supervisor.ownership import Ownership

    store = open_store(tmp_path, pg_url)
    store.fence = Fence("h", LEASE_S * 20)
    take(store, "s")  # the former self's run
    store.commit([Record("s", 1, b"x")], [row("s")])
    lost: list[set[str]] = []
    own = Ownership(store, "h", "host-h", LEASE_S * 20, claims=True, lost=lost.append,
                    claimed=lambda _: None)
    try:
        got = claim(own.store.connection(), "h", LEASE_S * 20, mine=True)
        assert got == {"s": Claimed(2, "h", got["s"].lapsed_at, got["s"].claimed_at)}
        assert own.acquire("s") == "" and own.fence.epochs == {"s": 3}
        assert own._held_meanwhile(got) == {} and own.fence.epochs == {"s": 3}
        assert lost == []
        store.commit([Record("s", 2, b"y")], [row("s")])  # (refused at a stale epoch)
    finally:
        own.close()
        store.close()


def test_held_meanwhile_keeps_the_newest_epoch_and_stops_only_stale_runs():
    from actors.pgleases import Claimed
    from actors.supervisor.ownership import held_meanwhile

    epochs = {"later": 5, "next": 4, "skipped": 4, "other": 4}
    claimed = {"later": Claimed(4, "me"),      # taken here after the claim: kept, at 5
               "next": Claimed(5, "me"),       # the claim took it from here at once: 5
               "skipped": Claimed(6, "me"),    # someone held it in between: stale
               "other": Claimed(5, "b"),       # another host's in between: stale
               "fresh": Claimed(1, "b")}       # not held here: resumed
    stale = held_meanwhile(epochs, claimed, "me")
    assert stale == {"skipped", "other"}
    assert epochs == {"later": 5, "next": 5, "skipped": 4, "other": 4}
    assert set(claimed) == {"skipped", "other", "fresh"}
