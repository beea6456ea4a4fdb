"""This host's share of a PostgreSQL store that several hosts serve (`actors.pgleases`).

The supervisor of a host on a shared store:

- takes a session's lease before a run starts there (`acquire`; refused when
  another host runs it);
- every `RENEW_EVERY_S` renews all its leases with one statement and, unless it is
  an embedded host, claims running sessions whose lease lapsed (another host died,
  froze or was cut off): `claimed(sids, reason)` resumes them as after a restart;
- stops the work of every session whose lease it did not get back (`lost(sids)`),
  and of all of them once it has not renewed for its lease less `RENEW_WAIT_S` (the
  store unreachable: it cannot tell whether another host took them, and must stop
  before the store's lease can lapse);
- tells the supervisor when a renewal fails (`unreachable`: its sessions wait,
  `supervisor/outage.py`);
- at a graceful stop, expires its leases at once and NOTIFYs the others
  (`hand_over`), which claim its running sessions at once (`supervisor/handovers.py`).

The renewals run on a connection of their own in a worker thread, so a slow
commit on the loop never delays them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from actors import pgleases
from actors.peerhosts import HOST_FRESH_S, admitted
from actors.pgleases import Claimed, Fence
from actors.pglog import PgSessionLog
from actors.sessionlog import JournalError
from actors.supervisor.handovers import HandoverListener

log = logging.getLogger("oploop.ownership")

#: How often leases are renewed and lapsed ones claimed (seconds).
RENEW_EVERY_S = 1.0
#: How long a tick waits for its renewal before counting it failed (seconds).
RENEW_WAIT_S = 1.5
#: The file in $OPLOOP_HOME naming this host on shared stores (made at first start).
HOST_ID_FILE = "host-id"


def host_id(home: Path) -> str:
    """This home's host id on shared stores (stable across restarts: a restarted host
    takes its own sessions back at once)."""
    path = home / HOST_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    made = os.urandom(6).hex()
    tmp = path.with_name(f".{HOST_ID_FILE}.{os.getpid()}")
    tmp.write_text(made + "\n")
    os.replace(tmp, path)
    return made


class Ownership:
    """Acquire, renew, claim and give up this host's leases."""

    def __init__(self, store: PgSessionLog, owner: str, name: str, lease_s: float, *,
                 claims: bool, lost: Callable[[set[str]], None],
                 claimed: Callable[[dict[str, Claimed]], None],
                 unreachable: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.name = name
        self.claims = claims
        self.fence = Fence(owner, lease_s)
        store.fence = self.fence
        self._lost = lost
        self._claimed = claimed
        self._unreachable = unreachable
        self._conn: psycopg.Connection[Any] | None = None
        #: Monotonic time each held lease was taken (a renewal that began before it
        #: cannot have renewed it).
        self._taken: dict[str, float] = {}
        #: When the last successful renewal was sent (monotonic).
        self.renewed_at = time.monotonic()
        self.failing = False
        #: The renewal under way in the worker thread (one at a time; None once its answer
        #: is taken), and when it was sent.
        self._sent = 0.0
        self._sent_mine = False  # (whether the renewal under way takes back this id's leases)
        #: Whether a pass has taken back the leases this host id held before this process
        #: (`claim(mine=True)`): until one is answered, every pass asks for them again (a
        #: store unreachable at start would otherwise leave them renewed, never resumed).
        self.took_back = False
        self._renewal: asyncio.Future[tuple[dict[str, int], dict[str, Claimed]]] | None = None
        #: What the heartbeat publishes for the other hosts (`actors.supervisor.forwarding`):
        #: where this host's control socket is, whether it takes placed sessions, and how
        #: hosts on other machines reach it (`actors.peerhosts`).
        self.control = ""
        self.placeable = False
        self.reach = pgleases.Reach()
        #: Given, after each heartbeat, the keys of the other hosts heard on the store
        #: (this host's ZAP gate admits them; `actors.peerhosts.admitted`). From the
        #: renewal's worker thread: it only replaces a dict.
        self.admit: Callable[[dict[bytes, str]], None] | None = None

    @property
    def owner(self) -> str:
        """This host's id on the store."""
        return self.fence.owner

    def acquire(self, sid: str) -> str:
        """Take `sid`'s lease for a run starting here: "" when taken, else why not."""
        try:
            conn = self.store.connection()
            epoch = pgleases.acquire(conn, sid, self.owner, self.fence.lease_s)
            if epoch is None:
                other = pgleases.holder(conn, sid) or "another host"
                return f"session {sid} is running on host {other}"
        except (psycopg.Error, JournalError) as exc:
            return f"the store cannot be reached: {exc}"
        self._hold({sid: epoch})
        return ""

    def release(self, sids: set[str]) -> None:
        """Give up the leases of `sids`, claimed but not resumed here (nothing to run:
        an ended or unreadable session), so that no host holds them for ever."""
        if not sids:
            return
        try:
            self.fence.release(self.store.connection(), sids)
        except (psycopg.Error, JournalError) as exc:
            log.error("cannot release the leases of %s: %s", ", ".join(sorted(sids)), exc)
            return  # (held, renewed; tried again at this host's stop, by expiry)
        self.forget(sids)

    def runs_elsewhere(self, sid: str) -> str:
        """What a request for `sid`, whose run this host does not hold, is told."""
        try:
            other = pgleases.holder(self.store.connection(), sid)
        except (psycopg.Error, JournalError) as exc:
            return f"the store cannot be reached: {exc}"
        if other is None:
            return (f"session {sid} is running on a host that stopped: another host of the "
                    "store takes it over within seconds; try again then")
        return f"session {sid} is running on host {other}: send this to that host"

    def overview(self, *, read: bool = True) -> dict[str, Any]:
        """The store, this host's id, the hosts on the store and their leases (for
        `oploop status`; an "error" when the store cannot be read; without `read`,
        only what this host knows)."""
        out: dict[str, Any] = {"url": self.store.where, "host": self.owner,
                               "lease_s": self.fence.lease_s, "renewing": not self.failing}
        if not read:
            return out
        try:
            out.update(pgleases.overview(self.store.connection()))
        except (psycopg.Error, JournalError) as exc:
            out["error"] = str(exc)
        return out

    def _hold(self, epochs: dict[str, int]) -> None:
        now = time.monotonic()
        for sid, epoch in epochs.items():
            self.fence.epochs[sid] = epoch
            self._taken[sid] = now

    def forget(self, sids: set[str]) -> None:
        """No longer hold `sids` (lost)."""
        for sid in sids:
            self.fence.epochs.pop(sid, None)
            self._taken.pop(sid, None)

    async def run(self) -> None:
        """Renew and claim every `RENEW_EVERY_S` until cancelled, and at once when
        another host hands its sessions over (`supervisor/handovers.py`)."""
        wake = asyncio.Event()
        listener = None
        if self.claims:
            listener = HandoverListener(self.store.connect, asyncio.get_running_loop(),
                                        wake.set)
            listener.start()
        try:
            while True:
                began = time.monotonic()
                wake.clear()  # (a hand-over heard during the tick: another tick at once)
                await self.tick(began, mine=not self.took_back)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        wake.wait(), max(0.0, RENEW_EVERY_S - (time.monotonic() - began)))
        finally:
            if listener is not None:
                listener.stop()

    async def tick(self, began: float, *, mine: bool = False) -> None:
        """One renewal (and claim): what lapsed stops, what was claimed resumes. A
        renewal not answered within `RENEW_WAIT_S` counts as failed, and none other is
        sent while it hangs (a cut link: its connection fails it in seconds)."""
        try:
            if self._renewal is None:  # (else the last one, late: its answer is used)
                self._sent = began
                self._sent_mine = mine
                self._renewal = asyncio.ensure_future(
                    asyncio.to_thread(self._renew_and_claim, mine,
                                      tuple(self.fence.epochs) if mine else ()))
            done, _ = await asyncio.wait({self._renewal}, timeout=RENEW_WAIT_S)
            if not done:  # (slow, maybe only a busy machine: no outage said for it)
                raise TimeoutError(f"no answer from the store {self.store.where} for "
                                   f"{time.monotonic() - self._sent:.1f} s")
            renewal, self._renewal = self._renewal, None
            renewed, claimed = renewal.result()  # (what it claimed is never dropped)
            began = self._sent
            self.took_back = self.took_back or self._sent_mine
        except (psycopg.Error, JournalError, TimeoutError) as exc:
            if not self.failing:
                log.error("cannot renew the leases on %s: %s", self.store.where, exc)
            self.failing = True
            if self._unreachable is not None and not isinstance(exc, TimeoutError):
                self._unreachable(str(exc))  # (the sessions wait: supervisor/outage.py)
            # Stopped before the store's lease can lapse (it runs from when the last
            # renewal reached it, after it was sent), within a tick's wait.
            if time.monotonic() - self.renewed_at > self.fence.lease_s - RENEW_WAIT_S and \
                    self.fence.epochs:
                lost = set(self.fence.epochs)
                log.error("no renewal for %.1f s: %d session(s) stop here (another host "
                          "may have them now)", time.monotonic() - self.renewed_at, len(lost))
                self.forget(lost)
                self._lost(lost)
            return
        self.failing = False
        self.renewed_at = began
        # Held before this renewal began, and not renewed at the epoch held: lapsed.
        lost = {sid for sid, epoch in self.fence.epochs.items()
                if self._taken.get(sid, 0.0) < began and renewed.get(sid) != epoch}
        if lost:
            log.error("lease lapsed for %d session(s): their work stops here", len(lost))
            self.forget(lost)
            self._lost(lost)
        claimed = self._held_meanwhile(claimed)
        if claimed:
            self._hold({sid: c.epoch for sid, c in claimed.items()})
            for sid, c in claimed.items():
                log.warning("claimed session %s (epoch %d): the lease of host %s lapsed at "
                            "%.3f, claimed at %.3f (the store's clock)", sid, c.epoch,
                            c.previous or "(none)", c.lapsed_at, c.claimed_at)
            self._claimed(claimed)

    def _held_meanwhile(self, claimed: dict[str, Claimed]) -> dict[str, Claimed]:
        """What `claimed` leaves to resume (`held_meanwhile`); the runs here it makes
        stale are stopped (resumed from the store with the rest)."""
        stale = held_meanwhile(self.fence.epochs, claimed, self.owner)
        if stale:
            self.forget(stale)
            self._lost(stale)
        return claimed

    def _renew_and_claim(self, mine: bool, held: tuple[str, ...]
                         ) -> tuple[dict[str, int], dict[str, Claimed]]:
        """(In a worker thread, one call at a time.) Renew, heartbeat, claim. `held`: the
        leases this process held when it was sent: a first claim (`mine`) leaves them (a
        run started here before it: taken at the next epoch, a commit of that run in
        between would have been refused as a lease lost, and the run resumed)."""
        conn = self._connection()
        renewed = pgleases.renew(conn, self.owner, self.fence.lease_s)
        pgleases.heartbeat(conn, self.owner, self.name, control=self.control,
                           placeable=self.placeable, reach=self.reach)
        if self.admit is not None:
            self.admit(admitted(pgleases.live_hosts(conn, HOST_FRESH_S),
                                self.reach.client_key))
        if not self.claims:
            return renewed, {}
        return renewed, pgleases.claim(conn, self.owner, self.fence.lease_s, mine=mine,
                                       keep=held)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = self.store.connect()
        return self._conn

    def hand_over(self) -> None:
        """A graceful stop: expire this host's leases now and say it is down."""
        try:
            conn = self._connection()
            given = pgleases.give_up(conn, self.owner)
            pgleases.heartbeat(conn, self.owner, self.name, down=True, control=self.control,
                               reach=self.reach)
        except (psycopg.Error, JournalError) as exc:
            log.error("cannot hand the sessions over (%s): they are taken when their "
                      "leases lapse", exc)
            return
        if given:
            log.warning("handed %d running session(s) over to the other hosts", given)

    def close(self) -> None:
        """Close the renewal connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def held_meanwhile(epochs: dict[str, int], claimed: dict[str, Claimed], owner: str
                   ) -> set[str]:
    """Settle a claim's answer with the leases this host took while it was under way (a
    run started here: the first claim takes back this host id's own leases). `epochs`:
    session -> epoch held here; `claimed`: what the claim took, left with what is to be
    resumed. A session held here is not resumed again when its run here holds the newest
    epoch: taken here after the claim took it (a later epoch than the claim's), or taken
    by the claim from this host at the very next epoch (nobody wrote in between; held
    at the claim's epoch from now on). Otherwise the run here is stale: returned, and
    resumed from the store at the claim's epoch."""
    stale: set[str] = set()
    for sid in [s for s in claimed if s in epochs]:
        c, held = claimed[sid], epochs[sid]
        if c.epoch < held or (c.previous == owner and c.epoch == held + 1):
            epochs[sid] = max(held, c.epoch)
            del claimed[sid]
        else:
            stale.add(sid)
    return stale


def host_name(home: Path) -> str:
    """How this host is shown to the others: machine name and home."""
    return f"{socket.gethostname()}:{home}"
