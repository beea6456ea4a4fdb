"""A throwaway PostgreSQL server for the tests and the bench (`store` section).

`PgCluster.start()` runs Debian's `initdb` as the `postgres` user in a fresh
temporary directory and starts `postgres` on a unix socket in that directory
(no TCP port: nothing else on the machine can reach it, and parallel runs do not
collide); `start(listen=ADDR, port=N)` also listens on TCP there (the partition test:
hosts in network namespaces reach it over a veth pair). `halt()`/`resume()` stop and
start the server keeping its data (the outage test). It is tuned for throwaway data: `fsync=off` and
`synchronous_commit=off` are set here ONLY because the cluster is deleted at
`stop()`; never run a real store like that. The server is detached (`pg_ctl`),
so `stop()` ends it; a crashed test run leaves a directory `/tmp/oppg-*` behind.
`unavailable()` says why no cluster can be started here (no server binaries, not
root, no `postgres` user), so a test can skip saying so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

#: The database the cluster creates for oploop.
DATABASE = "oploop"
#: Settings for a throwaway cluster (never for a store that must survive a crash).
FAST = ("fsync=off", "synchronous_commit=off", "full_page_writes=off",
        "shared_buffers=32MB", "max_connections=200")
STARTUP_S = 30.0


def bindir() -> Path | None:
    """The newest installed PostgreSQL server's `bin` (Debian's layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def unavailable() -> str:
    """Why no throwaway cluster can run here ("" when one can)."""
    if bindir() is None:
        return ("no PostgreSQL server installed (/usr/lib/postgresql/*/bin/initdb; "
                "scripts/test installs Debian's `postgresql` package as root)")
    if os.geteuid() != 0:
        return "starting a PostgreSQL cluster as the `postgres` user needs root"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no `postgres` user (Debian's `postgresql` package creates it)"
    return ""


@dataclass
class PgCluster:
    """A running throwaway cluster: its directory, server process and URL."""

    root: Path
    #: An address the server also listens on over TCP ("": the unix socket only), and
    #: the port (of the TCP listener and of the socket's name).
    listen: str = ""
    port: int = 5432

    @property
    def socket_dir(self) -> Path:
        """Where the server's unix socket is."""
        return self.root

    @property
    def url(self) -> str:
        """A libpq URL of the oploop database, over the unix socket."""
        return f"postgresql://postgres@/{DATABASE}?host={self.socket_dir}&port={self.port}"

    @property
    def tcp_url(self) -> str:
        """A libpq URL of the oploop database over TCP (`listen` given at `start`)."""
        return f"postgresql://postgres@{self.listen}:{self.port}/{DATABASE}"

    def database_url(self, name: str) -> str:
        """The URL of another database of this cluster (see `create_database`)."""
        return f"postgresql://postgres@/{name}?host={self.socket_dir}&port={self.port}"

    @classmethod
    def start(cls, listen: str = "", port: int = 5432) -> PgCluster:
        """initdb, start and create the oploop database; raises RuntimeError saying why not.
        `listen`: also on TCP at that address and `port` (any client trusted: the
        cluster is a test's), e.g. a veth's address for hosts in network namespaces."""
        why = unavailable()
        if why:
            raise RuntimeError(why)
        bin_ = bindir()
        assert bin_ is not None
        root = Path(tempfile.mkdtemp(prefix="oppg-", dir="/tmp"))
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        data = root / "data"
        try:
            _as_postgres([str(bin_ / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                          "-E", "UTF8", "--no-sync"])
            if listen:
                with (data / "pg_hba.conf").open("a") as hba:
                    hba.write("host all all 0.0.0.0/0 trust\n")
            cluster = cls(root, listen, port)
            cluster.resume()
            cluster.create_database(DATABASE)
        except BaseException:
            cls(root, listen, port).stop()
            raise
        return cluster

    def resume(self) -> None:
        """Start the server on the cluster's data (at `start`, or after `halt`)."""
        bin_ = bindir()
        assert bin_ is not None
        options = " ".join(f"-c {o}" for o in FAST)
        # pg_ctl detaches the server (its parent is not this process): the tests'
        # check for leaked children does not see its backends come and go.
        _as_postgres([str(bin_ / "pg_ctl"), "-D", str(self.root / "data"),
                      "-l", str(self.root / "server.log"), "-w", "-t", str(int(STARTUP_S)),
                      "-o", f"-k {self.root} -p {self.port} -c listen_addresses={self.listen} "
                      f"{options}", "start"])

    def halt(self) -> None:
        """Stop the server, keeping its data (fast: every client's connection is cut;
        `resume` starts it again)."""
        bin_ = bindir()
        assert bin_ is not None
        _as_postgres([str(bin_ / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w",
                      "stop"])

    def schema_url(self, schema: str) -> str:
        """The URL of the oploop database with `schema` as its search path (tables
        created through it go there: one empty store per schema)."""
        return f"{self.url}&options=-csearch_path%3D{schema}"

    def create_database(self, name: str) -> None:
        """CREATE DATABASE `name` (a fresh store for one test)."""
        bin_ = bindir()
        assert bin_ is not None
        _as_postgres([str(bin_ / "createdb"), "-h", str(self.socket_dir), "-p", str(self.port),
                      "-U", "postgres", name])

    def restart(self) -> None:
        """Restart the server (fast: every client's connection is cut)."""
        bin_ = bindir()
        assert bin_ is not None
        _as_postgres([str(bin_ / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w",
                      "-l", str(self.root / "server.log"), "restart"])

    def stop(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected) and delete the cluster."""
        bin_ = bindir()
        if bin_ is not None and (self.root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                _as_postgres([str(bin_ / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast",
                              "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)


#: Popen arguments running a program as the `postgres` user (the server refuses root).
_POSTGRES = {"user": "postgres", "group": "postgres", "extra_groups": [], "cwd": "/"}


def _as_postgres(argv: list[str]) -> None:
    got = subprocess.run(argv, capture_output=True, check=False, **_POSTGRES)
    if got.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed ({got.returncode}): "
                           f"{got.stderr.decode(errors='replace')[-2000:]}")


def fresh_schema(cluster: PgCluster) -> str:
    """Create an empty schema in `cluster`'s oploop database; the URL of a store in it."""
    import psycopg  # (only where a cluster is used)

    name = f"s_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return cluster.schema_url(name)
