"""Keys for TCP: made private, issued per role, checked per domain, revoked live."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq

from bus.endpoints import Endpoints, Network, read_network, write_network
from bus.security import ClientKeys, CredentialError, Keyring
from bus.sockets import Reactor


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def keyring(tmp_path):
    ring = Keyring(tmp_path / "keys")
    ring.ensure()
    return ring


def test_keys_are_made_once_and_kept_private(keyring):
    folder = keyring.folder
    assert mode(folder) == 0o700
    assert mode(folder / "server.key_secret") == mode(folder / "client.key_secret") == 0o600
    assert all(mode(p) == 0o700 for p in folder.rglob("*") if p.is_dir())
    before = (folder / "server.key_secret").read_bytes()
    keyring.ensure()
    assert (folder / "server.key_secret").read_bytes() == before


def test_issued_keys_are_admitted_by_their_role_only(keyring):
    local = keyring.local()
    viewer = ClientKeys.load(keyring.issue("tv", "viewer"))
    worker = ClientKeys.load(keyring.issue("w-1", "worker"))
    control = ClientKeys.load(keyring.issue("laptop", "control"))
    peer = ClientKeys.load(keyring.issue("host-a", "peer"))
    assert viewer.server_public == worker.server_public == keyring.server().public
    admitted = {
        name: {d for d in ("api", "control", "work", "view") if keyring.admits(d, keys.public)}
        for name, keys in [("local", local), ("viewer", viewer), ("worker", worker),
                           ("control", control), ("peer", peer)]
    }
    assert admitted == {
        "local": {"api", "control", "work", "view"},
        "viewer": {"view"},
        "worker": {"control", "work"},
        "control": {"api", "control", "view"},
        # (the supervisor narrows what a peer may ask: new runs, its own cancels)
        "peer": {"api", "control", "view"},
    }
    assert not keyring.admits("api", b"x" * 40)
    assert keyring.names() == {"control": ["laptop"], "worker": ["w-1"], "viewer": ["tv"],
                               "peer": ["host-a"]}


def test_revoking_a_key_takes_effect_at_the_next_handshake(keyring):
    keys = ClientKeys.load(keyring.issue("laptop", "control"))
    assert keyring.admits("api", keys.public)
    assert keyring.revoke("laptop") and not keyring.revoke("laptop")
    assert not keyring.admits("api", keys.public)
    assert not (keyring.folder / "issued" / "laptop").exists()


@pytest.mark.parametrize("name, role", [("../up", "control"), ("server", "control"),
                                        ("", "viewer"), ("ok", "admin")])
def test_bad_key_names_and_roles_are_refused(keyring, name, role):
    with pytest.raises(CredentialError):
        keyring.issue(name, role)


def test_a_name_is_issued_once(keyring):
    keyring.issue("twice", "viewer")
    with pytest.raises(CredentialError, match="exists"):
        keyring.issue("twice", "control")


def test_a_secret_open_to_others_is_refused(keyring):
    (keyring.folder / "client.key_secret").chmod(0o644)
    with pytest.raises(CredentialError, match="open to others"):
        keyring.local()


def test_endpoints_follow_the_network_file(tmp_path, keyring):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert Endpoints.for_home(tmp_path).binds("api") == [f"ipc://{run_dir}/api.sock"]
    write_network(run_dir, Network("127.0.0.1", 7400))
    assert mode(run_dir / "network.json") == 0o600
    assert read_network(run_dir) == Network("127.0.0.1", 7400)
    ep = Endpoints.for_home(tmp_path)
    assert ep.curve and ep.binds("events") == [f"ipc://{run_dir}/events.sock",
                                               "tcp://127.0.0.1:7403"]
    assert ep.binds("ingest") == [f"ipc://{run_dir}/ingest.sock"]  # never leaves the machine
    assert ep.server_side("ingest") is None and ep.server_side("api") is not None
    write_network(run_dir, None)
    assert read_network(run_dir) is None and not Endpoints.for_home(tmp_path).curve


def test_endpoints_elsewhere_connect_over_tcp_only(tmp_path, keyring):
    ep = Endpoints.elsewhere("tcp://10.1.2.3:7400", keyring.folder)
    assert ep.address("control") == "tcp://10.1.2.3:7401"
    with pytest.raises(Exception, match="not served"):
        ep.address("ingest")
    with pytest.raises(Exception, match="plain TCP"):
        Endpoints.elsewhere("tcp://10.1.2.3:7400", None)


def test_names_that_leave_the_key_folder_are_refused(keyring):
    keyring.issue("ok", "viewer")
    for name in ("../../server", "../client", "a/b", ""):
        with pytest.raises(CredentialError):
            keyring.revoke(name)
    assert (keyring.folder / "server.key").exists() and keyring.role_of("ok") == "viewer"


def test_roles_of_admitted_keys_are_the_user_ids(keyring):
    control = ClientKeys.load(keyring.issue("laptop", "control"))
    assert keyring.role_of_key(control.public) == "control:laptop"  # role, then the name
    assert keyring.role_of_key(keyring.local().public) == "local"
    assert keyring.role_of_key(b"y" * 40) == "unknown"


@pytest.mark.skipif(not Path("/proc/net/if_inet6").exists() or
                    not Path("/proc/net/if_inet6").read_text().strip(),
                    reason="this machine has no IPv6 loopback")
def test_an_ipv6_address_binds():
    reactor = Reactor(zmq.Context.instance())
    try:
        port = reactor.add(zmq.ROUTER, "v6", bind="tcp://[::1]:*")
        assert port.sock.getsockopt(zmq.IPV6) == 1
    finally:
        reactor.close()


def test_a_peer_key_is_bound_to_one_agent(tmp_path):
    keyring = Keyring(tmp_path / "keys")
    keyring.ensure()
    keyring.issue("host-a", "peer")
    keyring.issue("host-b", "peer", agent="ops")
    assert keyring.peer_agent("host-a") == "default"
    assert keyring.peer_agent("host-b") == "ops"
    assert keyring.peer_agent("nobody") == "default"
    with pytest.raises(CredentialError, match="only a peer key"):
        keyring.issue("w", "worker", agent="ops")
    assert keyring.revoke("host-b")
    assert not (tmp_path / "keys" / "peer-agents" / "host-b").exists()
