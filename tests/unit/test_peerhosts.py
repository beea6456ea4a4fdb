"""The other hosts of a shared store: what a host publishes for other machines, whom it
admits (their keys, for control and view only), and how it reaches each one."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq

from actors.peerhosts import (
    admitted,
    control_address,
    link,
    place_problem,
    reach_of,
    reach_problem,
)
from actors.pgleases import HostRow, Reach
from bus.endpoints import Network, write_network
from bus.errors import BusError
from bus.security import ClientKeys, Keyring


@pytest.fixture
def home(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    Keyring(tmp_path / "keys").ensure()
    return tmp_path


def z85_pair() -> tuple[str, str]:
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


def remote(**reach: str) -> HostRow:
    """A host on another machine, its row publishing `reach`."""
    return HostRow("far", "elsewhere:/home/far", "ipc:///home/far/run/control.sock", True,
                   reach=Reach(**reach))


def test_another_hosts_key_gets_into_control_and_view_only(tmp_path):
    keyring = Keyring(tmp_path / "keys")
    keyring.ensure()
    host_key, stranger = z85_pair()[0].encode(), z85_pair()[0].encode()
    keyring.hosts = {host_key: "h1"}
    assert keyring.admits("control", host_key) and keyring.admits("view", host_key)
    assert not keyring.admits("api", host_key) and not keyring.admits("work", host_key)
    assert not any(keyring.admits(d, stranger) for d in ("api", "control", "work", "view"))
    assert keyring.role_of_key(host_key) == "host:h1"
    keyring.hosts = {}  # the host left the store (or was never on it)
    assert not keyring.admits("control", host_key)


def test_a_host_publishes_tcp_only_where_other_machines_can_connect(home):
    keys = ClientKeys.load(home / "keys")
    assert reach_of(home) == Reach(client_key=keys.public.decode())  # ipc only
    write_network(home / "run", Network("127.0.0.1", 7400))
    assert reach_of(home).control_tcp == ""  # loopback: no other machine gets there
    write_network(home / "run", Network("10.1.2.3", 7400))
    assert reach_of(home) == Reach("tcp://10.1.2.3:7401", "tcp://10.1.2.3:7403",
                                   keys.server_public.decode(), keys.public.decode())
    write_network(home / "run", Network("0.0.0.0", 7400))
    assert reach_of(home).control_tcp == f"tcp://{socket.getfqdn()}:7401"


def test_a_host_without_tcp_on_another_machine_is_named_with_the_fix():
    why = reach_problem(remote())
    assert "far (elsewhere:/home/far) is on another machine" in why
    assert "[network] listen" in why
    assert reach_problem(remote(control_tcp="tcp://10.1.2.3:7401",
                                events_tcp="tcp://10.1.2.3:7403",
                                server_key=z85_pair()[0])) == ""


def test_new_sessions_are_placed_on_this_machine_only():
    far = remote(control_tcp="tcp://10.1.2.3:7401", events_tcp="tcp://10.1.2.3:7403",
                 server_key=z85_pair()[0])
    assert "start the session there" in place_problem(far)


def test_a_host_elsewhere_is_reached_over_tcp_with_this_hosts_key(home):
    server = z85_pair()[0]
    far = remote(control_tcp="tcp://10.1.2.3:7401", events_tcp="tcp://10.1.2.3:7403",
                 server_key=server)
    address, secure = link(far, "events", home)
    assert address == "tcp://10.1.2.3:7403" and secure is not None
    options = SimpleNamespace()  # (what it sets on the socket: CURVE keys are write-only)
    secure(options)  # type: ignore[arg-type]
    own = ClientKeys.load(home / "keys")
    assert options.curve_serverkey == server.encode()
    assert (options.curve_publickey, options.curve_secretkey) == (own.public, own.secret)
    with pytest.raises(BusError, match="does not listen on TCP"):
        link(remote(), "control", home)
    with pytest.raises(BusError, match="no usable control address"):  # a garbage key
        link(remote(control_tcp="tcp://h:1", events_tcp="tcp://h:3", server_key="short"),
             "control", home)


def test_a_host_on_this_machine_is_reached_over_its_ipc_socket(home):
    row = HostRow("near", f"{socket.gethostname()}:{home}", control_address(home), True)
    assert reach_problem(row) == "" and place_problem(row) == ""
    address, _ = link(row, "control", Path("/nowhere"))
    assert address == control_address(home)
    # The same machine's name, but its home not visible here (another container):
    # reached over TCP when it publishes that, else named.
    hidden = HostRow("near", f"{socket.gethostname()}:/gone", control_address(Path("/gone")),
                     True)
    assert "does not listen on TCP" in reach_problem(hidden)


def test_the_admitted_keys_are_the_others_well_formed_ones():
    mine, theirs = z85_pair()[0], z85_pair()[0]
    rows = [HostRow("me", "m:/a", "", True, reach=Reach(client_key=mine)),
            HostRow("them", "t:/b", "", True, reach=Reach(client_key=theirs)),
            HostRow("odd", "o:/c", "", True, reach=Reach(client_key="\x01"))]
    assert admitted(rows, mine) == {theirs.encode(): "them"}
