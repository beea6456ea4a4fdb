"""Leases with fencing epochs: which host runs which session of a shared PostgreSQL store.

A running session is owned by one host through its row of `leases` (sid, owner,
epoch, expires). Every time comparison uses the database's clock (`now()`), so
clock skew between hosts changes nothing:

- `acquire`: a host starting a run takes the session's lease unless another host
  holds it unexpired; the epoch goes up by one.
- `renew`: every second a host extends all its unexpired leases with one statement;
  one it does not get back has lapsed (it stops that session's work).
- `claim`: a host takes running sessions whose lease lapsed, `FOR UPDATE SKIP LOCKED`
  (two hosts never wait on, nor take, the same row), epoch + 1.
- `Fence.check`, inside every commit's transaction (`PgSessionLog.commit`): each
  session written must be held by this host at the epoch it claimed and unexpired,
  its row locked `FOR SHARE` until the commit ends (a claim skips it meanwhile);
  a session this host does not hold may be written only if no host holds it.
  A stale owner therefore writes nothing (`LeaseLost`), and `(sid, seq)` being the
  records' key refuses any second write of a seq. No advisory lock is involved:
  a dead host's connection may linger for minutes, its lease does not.
- A run's end (its row written with `running` false) releases the lease in the same
  transaction (owner NULL; the epoch stays, so epochs only grow).

- `give_up`: a host stopping gracefully expires its leases and NOTIFYs
  `HANDOVER_CHANNEL`; the others LISTEN there and claim at once.

`hosts` lists the hosts on the store (`heartbeat`: id, name, when last heard, and
where the others reach it: `control` on its machine, `Reach` from other machines).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from actors.sessionlog import JournalError

log = logging.getLogger("oploop.leases")

#: Sessions one claim takes at most (the rest at the next claim, or by other hosts:
#: a host coming up does not take every lapsed session of a large store at once).
CLAIM_BATCH = 64
#: The channel a host stopping gracefully NOTIFYs once its leases are expired.
HANDOVER_CHANNEL = "oploop_handover"


class LeaseLost(JournalError):
    """A commit wrote sessions this host no longer holds: nothing of it was written."""

    def __init__(self, sids: Iterable[str]) -> None:
        self.sids = sorted(set(sids))
        super().__init__(f"lease lost for {len(self.sids)} session(s): "
                         f"{', '.join(self.sids[:5])}{' ...' if len(self.sids) > 5 else ''}")


class Fence:
    """This host's leases as it believes them: owner id and the epoch of each session."""

    def __init__(self, owner: str, lease_s: float) -> None:
        self.owner = owner
        self.lease_s = lease_s
        #: session -> the epoch this host claimed it at (written only by the loop thread).
        self.epochs: dict[str, int] = {}

    def check(self, conn: Any, sids: set[str]) -> dict[str, int]:
        """In the commit's transaction: the epoch of each session in `sids` this host
        holds; raises `LeaseLost` (the transaction is rolled back) for any it may not
        write. Runs the release of sessions whose run ends in this commit later
        (`release`)."""
        held = {s: self.epochs[s] for s in sids if s in self.epochs}
        lost: set[str] = set()
        if held:
            ok = {sid for (sid,) in conn.execute(
                "SELECT l.sid FROM leases l JOIN unnest(%s::text[], %s::bigint[]) AS h(sid, epoch) "
                "ON l.sid = h.sid AND l.epoch = h.epoch "
                "WHERE l.owner = %s AND l.expires > now() FOR SHARE OF l",
                (list(held), list(held.values()), self.owner))}
            lost |= set(held) - ok
        others = [s for s in sids if s not in held]
        if others:
            lost |= {sid for (sid,) in conn.execute(
                "SELECT sid FROM leases WHERE sid = ANY(%s) AND owner IS NOT NULL FOR SHARE",
                (others,))}
        if lost:
            raise LeaseLost(lost)
        return held

    def release(self, conn: Any, sids: Iterable[str]) -> None:
        """In the commit's transaction: give up the leases of `sids` (their runs ended)."""
        mine = [s for s in sids if s in self.epochs]
        if mine:
            conn.execute("UPDATE leases SET owner = NULL, expires = now() "
                         "WHERE sid = ANY(%s) AND owner = %s", (mine, self.owner))

    def released(self, sids: Iterable[str]) -> None:
        """After that commit: forget the released leases."""
        for sid in sids:
            self.epochs.pop(sid, None)


def acquire(conn: Any, sid: str, owner: str, lease_s: float) -> int | None:
    """Take the lease of `sid` for a run starting here: its new epoch, or None when
    another host holds it unexpired."""
    got = conn.execute(
        "INSERT INTO leases (sid, owner, epoch, expires) "
        "VALUES (%s, %s, 1, now() + make_interval(secs => %s)) "
        "ON CONFLICT (sid) DO UPDATE SET owner = excluded.owner, epoch = leases.epoch + 1, "
        "expires = excluded.expires "
        "WHERE leases.owner IS NULL OR leases.owner = excluded.owner "
        "OR leases.expires <= now() RETURNING epoch", (sid, owner, lease_s)).fetchone()
    return None if got is None else int(got[0])


def holder(conn: Any, sid: str) -> str | None:
    """The host holding `sid`'s lease unexpired, or None."""
    got = conn.execute("SELECT owner FROM leases WHERE sid = %s AND owner IS NOT NULL "
                       "AND expires > now()", (sid,)).fetchone()
    return None if got is None else str(got[0])


def renew(conn: Any, owner: str, lease_s: float) -> dict[str, int]:
    """Extend every unexpired lease of `owner`, in one statement; session -> epoch of
    those renewed (a lease missing from it has lapsed, or was taken)."""
    rows = conn.execute(
        "UPDATE leases SET expires = now() + make_interval(secs => %s) "
        "WHERE owner = %s AND expires > now() RETURNING sid, epoch",
        (lease_s, owner)).fetchall()
    return {sid: int(epoch) for sid, epoch in rows}


@dataclass(frozen=True, slots=True)
class Claimed:
    """A session taken by `claim`: its new epoch, whose it was, when that lapsed."""

    epoch: int
    #: The host whose lease lapsed ("" for a running session that had none).
    previous: str = ""
    #: When that lease lapsed and when it was claimed (Unix time, the database's clock).
    lapsed_at: float = 0.0
    claimed_at: float = 0.0


def claim(conn: Any, owner: str, lease_s: float, *, mine: bool = False,
          keep: Sequence[str] = (), limit: int = CLAIM_BATCH) -> dict[str, Claimed]:
    """Take running sessions whose lease lapsed (with `mine`, also those this owner id
    still holds: a restarted host's own, but for `keep`, the runs this process started
    itself and holds already), and running sessions with no lease at all (a store
    copied from SQLite)."""
    with conn.transaction():
        rows = conn.execute(
            "UPDATE leases l SET owner = %s, epoch = l.epoch + 1, "
            "expires = now() + make_interval(secs => %s) "
            "FROM (SELECT c.sid, c.owner, c.expires FROM leases c "
            "      JOIN sessions s ON s.sid = c.sid "
            "      WHERE s.running AND c.owner IS NOT NULL "
            "      AND (c.expires <= now() OR (%s AND c.owner = %s "
            "                                      AND NOT c.sid = ANY(%s::text[]))) "
            "      ORDER BY c.expires LIMIT %s FOR UPDATE OF c SKIP LOCKED) AS lapsed "
            "WHERE l.sid = lapsed.sid RETURNING l.sid, l.epoch, lapsed.owner, "
            "extract(epoch FROM lapsed.expires), extract(epoch FROM now())",
            (owner, lease_s, mine, owner, list(keep), limit)).fetchall()
        rows += conn.execute(
            "INSERT INTO leases (sid, owner, epoch, expires) "
            "SELECT s.sid, %s, 1, now() + make_interval(secs => %s) FROM sessions s "
            "WHERE s.running AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.sid = s.sid) "
            "LIMIT %s ON CONFLICT (sid) DO NOTHING "
            "RETURNING sid, epoch, '', 0, extract(epoch FROM now())",
            (owner, lease_s, limit)).fetchall()
    return {sid: Claimed(int(epoch), prev, float(lapsed), float(at))
            for sid, epoch, prev, lapsed, at in rows}


@dataclass(frozen=True, slots=True)
class Reach:
    """How a host on another machine is reached, as its `hosts` row publishes it: its
    control and events sockets on TCP ("" when it does not listen on TCP), its CURVE
    server key, and the public key it connects to the other hosts with (z85; the store
    is the trust root: a host admits the keys of the hosts on its store)."""

    control_tcp: str = ""
    events_tcp: str = ""
    server_key: str = ""
    client_key: str = ""


def heartbeat(conn: Any, owner: str, name: str, *, down: bool = False, control: str = "",
              placeable: bool = False, reach: Reach | None = None) -> None:
    """Say in `hosts` that `owner` (called `name`) is alive now (or, `down`, stopped);
    `control`: where its supervisor's control socket is reached on its machine
    (`actors.peerhosts`); `placeable`: whether it takes new sessions the others place
    (not an embedded host); `reach`: how hosts on other machines reach it."""
    r = reach or Reach()
    conn.execute("INSERT INTO hosts (id, name, seen, down, control, placeable, control_tcp, "
                 "events_tcp, server_key, client_key) "
                 "VALUES (%s, %s, now(), %s, %s, %s, %s, %s, %s, %s) "
                 "ON CONFLICT (id) DO UPDATE SET name = excluded.name, seen = excluded.seen, "
                 "down = excluded.down, control = excluded.control, "
                 "placeable = excluded.placeable, control_tcp = excluded.control_tcp, "
                 "events_tcp = excluded.events_tcp, server_key = excluded.server_key, "
                 "client_key = excluded.client_key",
                 (owner, name, down, control, placeable, r.control_tcp, r.events_tcp,
                  r.server_key, r.client_key))


@dataclass(frozen=True, slots=True)
class HostRow:
    """A host on the store as its row says: id, name, control address on its machine,
    whether it takes placed sessions, how many sessions it holds leases of now, and how
    it is reached from other machines."""

    id: str
    name: str
    control: str
    placeable: bool
    running: int = 0
    reach: Reach = Reach()


_REACH = "h.control_tcp, h.events_tcp, h.server_key, h.client_key"


def live_hosts(conn: Any, within_s: float) -> list[HostRow]:
    """The hosts heard within `within_s` seconds and not stopped, with the count of
    unexpired leases each holds (its running sessions), by id."""
    rows = conn.execute(
        "SELECT h.id, h.name, h.control, h.placeable, "
        "(SELECT count(*) FROM leases l WHERE l.owner = h.id AND l.expires > now()), "
        f"{_REACH} FROM hosts h "
        "WHERE NOT h.down AND h.seen > now() - make_interval(secs => %s) "
        "ORDER BY h.id", (within_s,)).fetchall()
    return [HostRow(str(i), str(n), str(c), bool(p), int(r), Reach(*map(str, reach)))
            for i, n, c, p, r, *reach in rows]


def holder_row(conn: Any, sid: str) -> HostRow | None:
    """The host holding `sid`'s lease unexpired, with its row (control "" when it has
    none: it never said where it is), or None."""
    got = conn.execute(
        "SELECT l.owner, coalesce(h.name, ''), coalesce(h.control, ''), "
        "coalesce(h.placeable, false), coalesce(h.control_tcp, ''), "
        "coalesce(h.events_tcp, ''), coalesce(h.server_key, ''), coalesce(h.client_key, '') "
        "FROM leases l LEFT JOIN hosts h ON h.id = l.owner "
        "WHERE l.sid = %s AND l.owner IS NOT NULL AND l.expires > now()", (sid,)).fetchone()
    if got is None:
        return None
    owner, name, control, placeable, *reach = got
    return HostRow(str(owner), str(name), str(control), bool(placeable),
                   reach=Reach(*map(str, reach)))


def give_up(conn: Any, owner: str) -> int:
    """Expire every lease of `owner` now (a graceful stop) and say so on
    `HANDOVER_CHANNEL`: the other hosts listening claim its running sessions at once,
    the others at their next claim."""
    got = conn.execute("UPDATE leases SET expires = now() WHERE owner = %s AND expires > now()",
                       (owner,))
    given = int(got.rowcount or 0)
    if given:  # (autocommit: the expiry is committed, the listeners claim at once)
        conn.execute(f"NOTIFY {HANDOVER_CHANNEL}")
    return given


def overview(conn: Any) -> dict[str, Any]:
    """The hosts on the store (with the TCP control address other machines reach each at,
    "" for none) and their leases (for `oploop status`)."""
    hosts = [{"id": h, "name": n, "seen_s_ago": float(ago), "down": bool(d), "tcp": tcp}
             for h, n, ago, d, tcp in conn.execute(
                 "SELECT id, name, extract(epoch FROM now() - seen), down, control_tcp "
                 "FROM hosts ORDER BY name")]
    leases = [{"session": s, "owner": o, "epoch": int(e), "expires_in_s": float(left)}
              for s, o, e, left in conn.execute(
                  "SELECT sid, owner, epoch, extract(epoch FROM expires - now()) FROM leases "
                  "WHERE owner IS NOT NULL ORDER BY owner, sid")]
    return {"hosts": hosts, "leases": leases}
