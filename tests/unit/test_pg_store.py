"""The PostgreSQL store's own edges (its semantics shared with SQLite are tested in
test_session_log.py and test_broadcaster_log.py against both stores)."""

from __future__ import annotations

import psycopg
import pytest

from actors.logstore import is_pg_url, open_store
from actors.pglog import COPY_FROM, SCHEMA_VERSION, redact
from actors.sessionlog import JournalError, Record


def test_a_store_of_a_newer_schema_is_refused_in_one_line(pg_url, tmp_path):
    open_store(tmp_path, pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE oploop_meta SET value = %s WHERE key = 'schema'",
                     (str(SCHEMA_VERSION + 1),))
    with pytest.raises(JournalError) as got:
        open_store(tmp_path, pg_url)
    message = str(got.value)
    assert "\n" not in message
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this oploop's" in message
    with psycopg.connect(pg_url) as conn:  # and it was not touched
        assert conn.execute("SELECT value FROM oploop_meta").fetchall() == [
            (str(SCHEMA_VERSION + 1),)]


def test_a_seq_is_written_once_whoever_writes_it(pg_url, tmp_path):
    one, two = open_store(tmp_path, pg_url), open_store(tmp_path, pg_url)
    try:
        one.commit([Record("s", 1, b"first")])
        with pytest.raises(JournalError, match="already logged"):
            two.commit([Record("s", 2, b"mine"), Record("s", 1, b"again")])
        assert one.range("s", 1, 9, 1 << 20) == ([(1, b"first")], False)  # nothing of it
        group = [Record("s", seq, b"g") for seq in range(2, 2 + COPY_FROM)]  # (one COPY)
        with pytest.raises(JournalError, match="already logged"):
            two.commit([*group, Record("s", 1, b"again")])
        assert one.last_seq("s") == 1
        two.commit(group)
        assert one.last_seq("s") == 1 + COPY_FROM
    finally:
        one.close()
        two.close()


def test_a_commit_tried_again_after_it_went_through_is_that_commit(pg_url, tmp_path):
    """The server stopped at a commit's COMMIT: it may have committed, its answer lost
    with the connection. The supervisor tries the batch again: the same records, frame
    for frame, are that commit (not a second writer), and it goes on."""
    store = open_store(tmp_path, pg_url)
    try:
        batch = [Record("s", 1, b"one"), Record("s", 2, b"two")]
        store.commit(batch)
        store.commit(batch)  # (again, as after a lost answer)
        assert store.range("s", 1, 9, 1 << 20) == ([(1, b"one"), (2, b"two")], False)
        with pytest.raises(JournalError, match="already logged"):  # another writer's
            store.commit([Record("s", 2, b"two"), Record("s", 3, b"three"),
                          Record("s", 1, b"other")])
    finally:
        store.close()


def test_a_lost_connection_fails_one_call_and_is_remade(pg_url, tmp_path):
    store = open_store(tmp_path, pg_url)
    try:
        store.commit([Record("s", 1, b"one")])
        with psycopg.connect(pg_url, autocommit=True) as admin:  # the server drops it
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE pid <> pg_backend_pid() AND datname = current_database()")
        with pytest.raises(JournalError, match="cannot write"):
            store.commit([Record("s", 2, b"two")])
        store.commit([Record("s", 2, b"two")])
        assert store.last_seq("s") == 2
    finally:
        store.close()


def test_urls():
    assert is_pg_url("postgresql://x@h/db") and is_pg_url("postgres://h/db")
    assert not is_pg_url("") and not is_pg_url("/home/me/sessions.db")
    assert redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert redact("postgresql://u@/db?host=/tmp") == "postgresql://u@/db?host=/tmp"
