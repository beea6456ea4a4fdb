"""Hosts of one store on two machines (`actors/peerhosts.py`), for real.

"Another machine" is made as honestly as one machine allows: host B runs in a UTS
namespace of its own (another host name), a mount namespace of its own in which host
A's home is covered by an empty tmpfs (A's ipc sockets and keys are not there), and a
network namespace joined to this one by a veth pair: B reaches the store and host A
over TCP only, and A reaches B the same way. Each host listens on TCP with CURVE
(`[network] listen`) and publishes its addresses and keys in its `hosts` row.

A runs the sessions; through B they are cancelled, told something, approved and
watched live (B forwards over TCP to A's control socket; B's broadcaster follows A's).
A key that is not on the store is refused by A's gate; a host's key may send on only
what a host forwards; garbage on A's control socket and a garbage `hosts` row leave
every actor serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import zmq
import zmq.asyncio
from homes import make_home, remove_home
from hostkit import WAIT_S, actor, host_pids, oploop, print_log_tail, running_host, until
from peerkit import Namespace, namespaces_usable, network_config
from ports import free_ports
from test_anyhost import CONFIG as OPS
from test_anyhost import (
    SCRIPTS,
    assert_said_and_approved,
    clients,
    marked,
    say_and_approve_through,
    until_type,
)

from bench import pgcluster
from bench.netlink import other_machine_prefix
from bus.client import Client
from bus.codec import encode
from bus.errors import AccessDenied, RemoteError
from bus.messages import Cancel, Envelope, Renew
from bus.rpc import Requester
from bus.security import ClientKeys
from bus.sockets import Reactor

pytestmark = pytest.mark.timeout(400)

#: The host name B's machine has.
OTHER = "other-machine"


def other_machine(ns: Namespace, hidden: str) -> tuple[str, ...]:
    """The prefix that starts a command on "another machine": its own host name, its own
    mounts (`hidden`, the first machine's home, covered), inside `ns`'s network."""
    return tuple(other_machine_prefix(ns.name, OTHER, [hidden]))


@contextlib.contextmanager
def host_elsewhere(ns: Namespace, home: str, hidden: str,
                   env: dict[str, str]) -> Iterator[str]:
    """A host started on "another machine" (`other_machine`); stopped over its ipc
    sockets (its home is visible here), nothing left behind."""
    up = oploop(home, "up", "--detach", env=env, timeout=180,
                prefix=other_machine(ns, hidden))
    assert up.returncode == 0, up.stderr + up.stdout
    pids = host_pids(home)
    try:
        yield home
    except BaseException:
        print_log_tail(home)
        raise
    finally:
        down = oploop(home, "down")
        assert down.returncode == 0, down.stderr
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"processes left after down: {alive}"


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Host A here, host B on "another machine", one store reached over TCP by B:
    (home a, home b, id a, id b, store url)."""
    why = pgcluster.unavailable() or namespaces_usable()
    if why:
        pytest.skip(why)
    scenario = tmp_path_factory.mktemp("othermachine") / "scenario.json"
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    with Namespace() as ns:
        cluster = pgcluster.PgCluster.start(listen=ns.outer, port=free_ports(ns.outer, 1))
        a, b = make_home("oma-"), make_home("omb-")
        listen = {a: f"tcp://{ns.outer}:{free_ports(ns.outer)}",
                  b: f"tcp://{ns.inner}:{free_ports('127.0.0.1')}"}
        for home in (a, b):
            Path(home, "oploop.toml").write_text(OPS + network_config(listen[home]))
        base = {"OPLOOP_OFFLINE_SCENARIO": str(scenario), "OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}
        try:
            with running_host(a, {**base, "OPLOOP_STORE": cluster.url}), \
                    host_elsewhere(ns, b, a, {**base, "OPLOOP_STORE": cluster.tcp_url}):
                ids = [(Path(h) / "host-id").read_text().strip() for h in (a, b)]
                yield a, b, ids[0], ids[1], cluster.url
        finally:
            cluster.stop()
            for home in (a, b):
                remove_home(Path(home))


def hosts_rows(url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, name, control_tcp, events_tcp, server_key, client_key "
                            "FROM hosts").fetchall()
    return {r[0]: dict(zip(("id", "name", "control_tcp", "events_tcp", "server_key",
                            "client_key"), r, strict=True)) for r in rows}


def test_each_host_publishes_how_other_machines_reach_it(machines):
    a, b, id_a, id_b, url = machines
    rows = hosts_rows(url)
    assert rows[id_b]["name"].startswith(f"{OTHER}:")
    assert rows[id_a]["name"].startswith(f"{socket.gethostname()}:")
    for home, host in ((a, id_a), (b, id_b)):
        keys = ClientKeys.load(Path(home) / "keys")
        assert rows[host]["server_key"] == keys.server_public.decode()
        assert rows[host]["client_key"] == keys.public.decode()
        assert rows[host]["control_tcp"].startswith("tcp://10.213.")
        assert rows[host]["events_tcp"].startswith("tcp://10.213.")
    # `oploop status` on either says where other machines reach each host.
    status = oploop(a, "status").stdout
    assert f"(other machines: {rows[id_b]['control_tcp']})" in status, status
    assert f"(other machines: {rows[id_a]['control_tcp']})" in status, status


def _fd_links(pid: int) -> list[str]:
    """What each open fd of `pid` names; an fd closed while listed is left out (the
    actor runs on: a CI run read one between the listing and its readlink)."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.append(os.readlink(fd))
        except FileNotFoundError:
            continue
    return links


def connected(home: str, name: str, address: str) -> bool:
    """Whether actor `name` of the host in `home` holds an established TCP connection to
    `address`, read in its own network namespace (/proc/PID/net/tcp; psutil reads the
    caller's)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    want = f"{socket.inet_aton(host)[::-1].hex().upper()}:{int(port):04X}"
    pid = actor(home, name)["pid"]
    inodes = {link.removeprefix("socket:[").rstrip("]") for link in _fd_links(pid)
              if link.startswith("socket:[")}
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()  # sl local remote state ... inode
        if fields[2] == want and fields[3] == "01" and fields[9] in inodes:  # ESTABLISHED
            return True
    return False


def test_cancel_and_watch_live_from_the_other_machine(machines, tmp_path):
    a, b, id_a, _, url = machines
    # B follows A once A admits B's key (B's first try may come before A has read it
    # on the store: refused, then made anew at B's next read of the hosts).
    events_a = hosts_rows(url)[id_a]["events_tcp"]
    asyncio.run(until(lambda: connected(b, "broadcaster", events_a), what="B to follow A"))

    async def scenario() -> list[dict[str, Any]]:
        async with clients(a, b) as (on_a, on_b):
            started = await on_a.start("#sleep go", cwd=str(tmp_path), host=id_a)
            seen: list[dict[str, Any]] = []
            events = on_b.events(started.session, 1, stop_at="first")
            await until_type(events, "TOOL_START", seen)
            await until(lambda: marked(), what="the tool")
            ack = await on_b.cancel(started.session)
            assert ack.state == "cancelled"
            # Everything after the replay reached B live, from A's broadcaster over TCP.
            seen += [e async for e in events]
            return seen

    seen = asyncio.run(scenario())
    assert seen[-1]["type"] == "CANCELLED", [e["type"] for e in seen]
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    asyncio.run(until(lambda: not marked(), what="the cancelled tool to be gone"))
    # Over TCP (A's home is not even there on B's machine): B's supervisor to A's
    # control socket, B's broadcaster to A's events.
    row_a = hosts_rows(url)[id_a]
    assert connected(b, "supervisor", row_a["control_tcp"])
    assert connected(b, "broadcaster", row_a["events_tcp"])


def test_compact_from_the_other_machine_reaches_the_running_session(machines, tmp_path):
    a, b, id_a, _, _ = machines

    async def scenario() -> str:
        async with clients(a, b) as (on_a, on_b):
            started = await on_a.start("#sleep go", cwd=str(tmp_path), host=id_a)
            events = on_b.events(started.session, 1, stop_at="first")
            await until_type(events, "TOOL_START", [])
            try:
                return (await on_b.compact(started.session)).state
            finally:
                await on_b.cancel(started.session)
                _ = [e async for e in events]

    assert asyncio.run(scenario()) == "queued"  # (the owner's answer: its run compacts)
    asyncio.run(until(lambda: not marked(), what="the cancelled tool to be gone"))


def test_say_and_approve_from_the_other_machine(machines, tmp_path):
    a, b, id_a, _, _ = machines
    assert_said_and_approved(*asyncio.run(say_and_approve_through(a, b, id_a, tmp_path)))


async def _ask(address: str, keys: ClientKeys, body: Any) -> Any:
    """One request to `address` as the holder of `keys`: its answer or its error."""
    ctx = zmq.Context()
    reactor = Reactor(ctx)
    serving = asyncio.create_task(reactor.run())
    try:
        requester = Requester(reactor, "probe", address, keys.apply)
        try:
            return (await requester.request(body, timeout=WAIT_S)).body
        except (RemoteError, AccessDenied) as exc:
            return exc
    finally:
        serving.cancel()
        reactor.close()
        ctx.term()


def test_only_the_stores_hosts_get_in_and_only_for_what_hosts_send(machines, tmp_path):
    a, b, id_a, id_b, url = machines
    row_a = hosts_rows(url)[id_a]
    server = row_a["server_key"].encode()
    stranger_public, stranger_secret = zmq.curve_keypair()
    stranger = ClientKeys(stranger_public, stranger_secret, server)
    as_b = ClientKeys.load(Path(b) / "keys")
    as_b = ClientKeys(as_b.public, as_b.secret, server)

    async def scenario() -> list[Any]:
        return [
            # A key not on the store: refused at the handshake.
            await _ask(row_a["control_tcp"], stranger, Cancel("0123456789ab", by="x")),
            # B's key: a forwarded request (naming who asked) is served...
            await _ask(row_a["control_tcp"], as_b, Cancel("0123456789ab", by="local")),
            # ...a request no host forwards, or one not naming who asked, is not.
            await _ask(row_a["control_tcp"], as_b, Renew("0123456789ab", 5.0)),
            await _ask(row_a["control_tcp"], as_b, Cancel("0123456789ab")),
        ]

    refused, served, renew, unnamed = asyncio.run(scenario())
    assert isinstance(refused, AccessDenied), refused
    assert isinstance(served, RemoteError) and served.code == "unknown_session", served
    assert isinstance(renew, RemoteError) and renew.code == "forbidden", renew
    assert isinstance(unnamed, RemoteError) and unnamed.code == "forbidden", unnamed


def test_garbage_from_a_host_and_in_the_store_kills_no_actor(machines, tmp_path):
    a, b, id_a, id_b, url = machines
    row_a = hosts_rows(url)[id_a]
    keys = ClientKeys.load(Path(b) / "keys")
    keys = ClientKeys(keys.public, keys.secret, row_a["server_key"].encode())
    before = {home: host_pids(home) for home in (a, b)}

    async def garbage() -> None:
        ctx = zmq.asyncio.Context()  # (a plain socket, no reactor: frames as they are)
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        keys.apply(sock)
        sock.connect(row_a["control_tcp"])
        for frames in ([b"\xc1\xff"], [b"", b"not msgpack"], [encode(Envelope(Cancel("x")))[:5]],
                       [b"", b"\x92\x01\x02", b"extra"]):
            await sock.send_multipart(frames)
        sock.close()
        ctx.term()

    asyncio.run(garbage())
    # A host row that is garbage: a bogus address and key, holding a running session.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO hosts (id, name, seen, control, placeable, control_tcp, "
                     "events_tcp, server_key, client_key) VALUES ('bogus', 'far:/x', now(), "
                     "'', true, 'tcp://no such place', 'tcp://:0', 'short', '\x01')")
        conn.execute("INSERT INTO sessions (sid, created, meta, updated, running) "
                     "VALUES ('bogus0000001', 0, '\\x80', 0, true)")
        conn.execute("INSERT INTO leases (sid, owner, epoch, expires) "
                     "VALUES ('bogus0000001', 'bogus', 1, now() + interval '1 hour')")

    async def through_b() -> Any:
        async with Client.connect(Path(b)) as on_b:
            try:
                return await on_b.cancel("bogus0000001")
            except RemoteError as exc:
                return exc

    try:
        answer = asyncio.run(through_b())
        assert isinstance(answer, RemoteError) and "bogus" in answer.message, answer
        # Every actor of both hosts still serves: a real run, cancelled through B.
        test_cancel_and_watch_live_from_the_other_machine(machines, tmp_path)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM leases WHERE owner = 'bogus'")
            conn.execute("DELETE FROM sessions WHERE sid = 'bogus0000001'")
            conn.execute("DELETE FROM hosts WHERE id = 'bogus'")
    # No actor died (none was restarted: the same processes, all alive).
    assert {home: host_pids(home) for home in (a, b)} == before
    assert all(psutil.pid_exists(p) for pids in before.values() for p in pids)

