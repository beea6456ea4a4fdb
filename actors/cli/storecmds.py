"""`oploop store copy --to URL`: move a home's sessions from its SQLite file to PostgreSQL.

Every session of `$OPLOOP_HOME/sessions.db` (its row, records, latest compaction
and start keys) is written to the store at URL, one transaction per session,
records inserted as they are (same seqs): a copy interrupted half-way leaves
whole sessions only, and running it again copies the rest (sessions the target
already has are skipped, never merged). The host must be down: a running host
would go on writing the file. The file is left as it was; the home then uses the
store once `[store] url` (or `OPLOOP_STORE`) names it.
"""

from __future__ import annotations

import argparse
import sys

from actors.cli.errors import EXIT_OK, fail
from actors.host.actor import read_state
from actors.logstore import SessionStore, is_pg_url, open_store
from actors.sessionlog import JournalError, SessionLog, StartKey
from actors.storage import SESSIONS_FILE
from bus.endpoints import oploop_home


def cmd_store_copy(args: argparse.Namespace) -> int:
    """Copy every session of the home's SQLite log to the store at `args.to`."""
    home = oploop_home()
    if not is_pg_url(args.to):
        return fail(f"--to: expected a postgresql:// URL, got {args.to.split(':', 1)[0]!r}")
    if read_state(home) is not None:
        return fail(f"a host is up in {home}: stop it first (`oploop down`), so that its "
                    "session log does not change while it is copied")
    path = home / SESSIONS_FILE
    if not path.exists():
        return fail(f"no session log in {home} ({SESSIONS_FILE}): nothing to copy")
    try:
        source = SessionLog(path, reserve_mb=0, readonly=True)
        target = open_store(home, args.to)
    except JournalError as exc:
        return fail(str(exc))
    try:
        copied, skipped, records = copy_sessions(source, target)
    except JournalError as exc:
        return fail(f"copy stopped: {exc} (the sessions copied so far are whole; run it "
                    "again to copy the rest)")
    finally:
        source.close()
        target.close()
    print(f"{copied} session(s) copied ({records} records), {skipped} already there "
          f"(skipped), to {target.where}")
    print(f'use it: [store] url = "{args.to}" in oploop.toml, or OPLOOP_STORE')
    return EXIT_OK


def copy_sessions(source: SessionLog, target: SessionStore) -> tuple[int, int, int]:
    """Copy every session of `source` missing in `target` (a `SessionStore`); (copied,
    skipped, records copied)."""
    starts: dict[str, list[StartKey]] = {}
    for key, sid, run, from_seq in source.db.execute("SELECT key, sid, run, from_seq "
                                                     "FROM starts"):
        starts.setdefault(sid, []).append(StartKey(key, sid, run, from_seq))
    copied = skipped = records = 0
    for sid, _ in source.summaries():
        if target.row(sid) is not None:
            skipped += 1
            continue
        row = source.row(sid)
        assert row is not None
        comp = source.compaction(sid)
        logged = source.records(sid)
        target.commit(logged, [row], [comp] if comp else [],
                      starts.get(sid, []))
        copied += 1
        records += len(logged)
        print(f"  {sid}: {len(logged)} records", file=sys.stderr)
    return copied, skipped, records
