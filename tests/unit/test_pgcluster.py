"""The throwaway PostgreSQL server the store's tests run against (`bench.pgcluster`)."""

from __future__ import annotations

import psycopg


def test_the_cluster_listens_on_its_unix_socket_only(pg_cluster):
    with psycopg.connect(pg_cluster.url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        assert conn.execute("SHOW unix_socket_directories").fetchone() == (
            str(pg_cluster.socket_dir),)
    assert list(pg_cluster.socket_dir.glob(".s.PGSQL.*"))


def test_each_fresh_schema_is_an_empty_store_of_its_own(pg_url, pg_cluster):
    from bench.pgcluster import fresh_schema

    other = fresh_schema(pg_cluster)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
    with psycopg.connect(other) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't' "
                            "AND schemaname = current_schema()").fetchone() == (0,)
