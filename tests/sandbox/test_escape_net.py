"""Adversarial: the network and the host's sockets. With network "none" nothing is reachable;
with a network allowlist (through the proxy), nothing but the forwarder to the proxy."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator

import pytest
from sbhelp import Host, need

# Each snippet prints OK if the attack got through, DENIED <reason> otherwise.
ATTEMPT = """
import socket, sys
def attempt(fn):
    try:
        fn()
    except OSError as exc:
        print("DENIED", exc.errno, exc.strerror)
    else:
        print("OK")
"""


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    """A host TCP server on loopback, as the host's own tcp endpoints would be."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def no_connection(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def test_tcp_to_loopback_and_host_endpoints(mhost: Host, tcp_listener: socket.socket) -> None:
    host = mhost
    need("seccomp", "namespaces")
    port = tcp_listener.getsockname()[1]
    res = host.py(ATTEMPT + f"""
attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
attempt(lambda: socket.create_connection(("::1", {port}), timeout=2))
""")
    assert "OK" not in res.output.split(), res.output
    assert res.output.count("DENIED") == 2, res.output
    assert no_connection(tcp_listener)


@pytest.mark.parametrize(
    "family, kind, proto",
    [
        ("AF_INET", "SOCK_DGRAM", 0),      # UDP
        ("AF_INET", "SOCK_RAW", 1),        # raw ICMP
        ("AF_INET6", "SOCK_DGRAM", 0),
        ("AF_NETLINK", "SOCK_RAW", 0),     # routing, audit, uevents
        ("AF_PACKET", "SOCK_RAW", 0),
        ("AF_VSOCK", "SOCK_STREAM", 0),    # the hypervisor
    ],
)
def test_socket_families_denied(mhost: Host, family: str, kind: str, proto: int) -> None:
    host = mhost
    need("seccomp")
    res = host.py(ATTEMPT + f"""
fam = getattr(socket, "{family}", None)
if fam is None:
    print("DENIED absent")
else:
    attempt(lambda: socket.socket(fam, socket.{kind}, {proto}))
""")
    assert res.output.startswith("DENIED 1 "), res.output  # EPERM: the filter, not luck


def test_udp_send_and_dns(mhost: Host) -> None:
    host = mhost
    need("seccomp")
    res = host.py(ATTEMPT + """
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", ("127.0.0.1", 53))
attempt(udp)
attempt(lambda: socket.getaddrinfo("example.com", 80))
""")
    assert "OK" not in res.output.split(), res.output
    res = host.run("getent hosts example.com")
    assert res.returncode != 0 and "example.com" not in res.output


def test_io_uring_denied(mhost: Host) -> None:
    host = mhost
    need("seccomp")
    res = host.py("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 8, params)  # io_uring_setup
print(fd, ctypes.get_errno())
""")
    assert res.output.split() == ["-1", "1"], res.output  # EPERM


def test_host_ipc_socket_unreachable(mhost: Host) -> None:
    host = mhost
    need("namespaces")
    run_dir = host.home / "run"
    run_dir.mkdir(mode=0o700)
    path = run_dir / "control.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    srv.setblocking(False)
    try:
        res = host.py(ATTEMPT + f"""
def unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("{path}")
attempt(unix)
import os
print("VISIBLE" if os.path.exists("{run_dir}") and os.listdir("{run_dir}") else "HIDDEN")
""")
        assert res.output.split()[0] == "DENIED" and "HIDDEN" in res.output, res.output
        assert no_connection(srv)
    finally:
        srv.close()


def test_abstract_socket_unreachable(mhost: Host) -> None:
    host = mhost
    need("namespaces")
    name = f"oploop-test-{secrets.token_hex(4)}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(4)
    srv.setblocking(False)
    try:
        res = host.py(ATTEMPT + f"""
def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\\0{name}")
attempt(abstract)
""")
        assert res.output.startswith("DENIED"), res.output
        assert no_connection(srv)
    finally:
        srv.close()


def test_network_host_policy_lifts_only_the_network(mhost: Host) -> None:
    host = mhost
    from sbhelp import TEST_POLICY

    need("seccomp")
    res = host.py(ATTEMPT + """
attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
""", TEST_POLICY.lowered(network="host"))
    assert res.output.split() == ["OK"], res.output


def test_proxied_network_has_no_other_way_out(host: Host, tcp_listener: socket.socket) -> None:
    """A call whose agent has a network allowlist: its own network namespace with `lo`
    and the forwarder to the proxy (none runs here: it answers 503), and nothing else:
    no raw, packet, netlink, UDP, SCTP or unix socket (seccomp), no connection to the
    host's loopback nor outside (no route; Landlock: the forwarder's port only), no DNS,
    no listening socket, no way into the forwarder's cwd (the proxy's socket directory)."""
    from actors.sandbox.network import Proxied

    if host.backend != "launcher":
        pytest.skip("the proxied network runs on the launcher backend (bwrap refuses it)")
    need("seccomp", "namespaces")
    port = tcp_listener.getsockname()[1]
    net = Proxied(str(host.home / "run" / "net"), "agent-ops.sock")
    res = host.py(ATTEMPT.replace('print("DENIED"', 'print(NAME, "DENIED"')
                  .replace('print("OK")', 'print(NAME, "OK")') + f"""
S = socket.socket
for NAME, fn in [
    ("raw", lambda: S(socket.AF_INET, socket.SOCK_RAW, 1)),
    ("packet", lambda: S(socket.AF_PACKET, socket.SOCK_RAW, 0)),
    ("netlink", lambda: S(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    ("udp", lambda: S(socket.AF_INET, socket.SOCK_DGRAM)),
    ("udp6", lambda: S(socket.AF_INET6, socket.SOCK_DGRAM)),
    ("unix", lambda: S(socket.AF_UNIX, socket.SOCK_STREAM)),
    ("sctp", lambda: S(socket.AF_INET, socket.SOCK_STREAM, 132)),
    ("dns", lambda: socket.getaddrinfo("example.com", 80)),
    ("direct", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3)),
    ("direct6", lambda: socket.create_connection(("::1", {port}), timeout=3)),
    ("outside", lambda: socket.create_connection(("1.1.1.1", 80), timeout=3)),
    ("listen", lambda: S().bind(("127.0.0.1", 8080))),
]:
    attempt(fn)
import os
def forwarder_cwd():  # the forwarder thread's cwd is the proxy's socket directory
    for tid in os.listdir("/proc/1/task"):
        os.listdir(f"/proc/1/task/{{tid}}/cwd")
NAME = "forwarder-cwd"
attempt(forwarder_cwd)
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"GET http://example.com/ HTTP/1.1\\r\\nHost: example.com\\r\\n\\r\\n")
print("forwarder", s.recv(200).split(b"\\r\\n")[0].decode())
""", net=net)
    verdicts = dict(line.split(" ", 1) for line in res.output.splitlines())
    assert len(verdicts) == 14, res.output
    assert not [k for k, v in verdicts.items() if v == "OK"], res.output
    for name in ("raw", "packet", "netlink", "udp", "udp6", "unix", "sctp"):
        assert verdicts[name].startswith("DENIED 1 "), res.output  # EPERM: seccomp, not luck
    assert verdicts["forwarder-cwd"].startswith("DENIED 13 "), res.output  # not its uid's
    assert verdicts["forwarder"].startswith("HTTP/1.1 503 oploop: no network proxy"), res.output
    assert no_connection(tcp_listener)
