"""Network through the host's filtering proxy (`network = [hosts]`), with real processes.

A loopback HTTP server on the host stands for an allowed host; the proxy runs as
its own process (`python -m actors.netproxy`, as the host starts it), with an
`oploop.toml` whose agent `ops` may reach that server only. The sandboxed
calls are shell calls under the launcher backend (the proxied network needs its
own network namespace: bubblewrap is refused, with the reason). The attacks
on a proxied call (other sockets, direct connections) are in test_escape_net.py.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from httpkit import serving
from sbhelp import BOUND_S, Host, need, need_python

from actors.allowlist import socket_name
from actors.host.children import Child, keep_alive, spawn, stop_all
from actors.runtime import read_ready_line
from actors.sandbox.network import Proxied
from actors.settings import READY_FD_ENV
from actors.tools.process import ToolRefused

REPO = Path(__file__).resolve().parents[2]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        got = self.rfile.read(int(self.headers["Content-Length"]))
        body = f"got {len(got)} bytes, {got.count(b'y')} of them y\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = f"hello from upstream {self.path}\n".encode()
        if self.path == "/big":
            body = b"z" * (8 << 20)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    """An HTTP server on the host's loopback (the allowed host); its port."""
    with serving(_Hello) as port:
        yield port


def write_config(home: Path, port: int) -> None:
    (home / "oploop.toml").write_text(
        f'[agents.ops]\nnetwork = ["127.0.0.1:{port}", "*.corp.example"]\n')


def proxy_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLOOP_")}
    return {**env, "OPLOOP_HOME": str(home), "PYTHONPATH": str(REPO)}


@dataclass
class Proxy:
    """The proxy process of a test home and the way a call of agent `ops` reaches it."""

    proc: subprocess.Popen[bytes]
    net: Proxied


def start_proxy(home: Path) -> subprocess.Popen[bytes]:
    """`python -m actors.netproxy` for `home`, once it says it is ready (it listens)."""
    rfd, wfd = os.pipe()
    env = {**proxy_env(home), READY_FD_ENV: str(wfd)}
    proc = subprocess.Popen([sys.executable, "-m", "actors.netproxy"], env=env,
                            pass_fds=(wfd,), stderr=subprocess.PIPE)
    os.close(wfd)
    try:
        assert read_ready_line(rfd) == b"ready\n", proc.communicate(timeout=BOUND_S)[1]
    finally:
        os.close(rfd)
    return proc


@pytest.fixture
def proxy(host: Host, upstream: int) -> Iterator[Proxy]:
    if host.backend != "launcher":
        pytest.skip("the proxied network runs on the launcher backend (bwrap: refused)")
    need("namespaces")
    write_config(host.home, upstream)
    (host.home / "run").mkdir(mode=0o700, exist_ok=True)
    proc = start_proxy(host.home)
    try:
        yield Proxy(proc, Proxied(str(host.home / "run" / "net"), socket_name("agent", "ops")))
    finally:
        proc.kill()
        _, err = proc.communicate()
        assert b"Traceback" not in err, err.decode()


def need_curl() -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")


# -- allowed, refused -----------------------------------------------------------------


def test_allowed_host_answers_through_the_proxy(host: Host, proxy: Proxy, upstream: int
                                                ) -> None:
    need_curl()
    res = host.run(f"curl -sS --max-time 10 http://127.0.0.1:{upstream}/curl", net=proxy.net)
    assert res.returncode == 0 and "hello from upstream /curl" in res.output, res.output
    need_python()
    res = host.py(f"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:{upstream}/py", timeout=10).read().decode())
""", net=proxy.net)
    assert "hello from upstream /py" in res.output, res.output


def test_large_bodies_both_ways(host: Host, proxy: Proxy, upstream: int) -> None:
    """8 MiB down and 4 MiB up through the forwarder and the proxy, whole (flow control
    on both hops: neither holds more than its buffers)."""
    need_curl()
    res = host.run(f"curl -sS --max-time 20 http://127.0.0.1:{upstream}/big | wc -c; "
                   f"head -c 4194304 /dev/zero | tr '\\0' y > up; "
                   f"curl -sS --max-time 20 --data-binary @up http://127.0.0.1:{upstream}/p",
                   net=proxy.net)
    assert res.output.split("\n")[:2] == [str(8 << 20), "got 4194304 bytes, 4194304 of them y"
                                          ], res.output


def test_connect_tunnel_to_an_allowed_host(host: Host, proxy: Proxy, upstream: int) -> None:
    """HTTPS goes as CONNECT: the tunnel carries whatever the client speaks in it."""
    need_python()
    res = host.py(f"""
import os, socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT 127.0.0.1:{upstream} HTTP/1.1\\r\\nHost: 127.0.0.1:{upstream}\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode())
s.sendall(b"GET /tunnel HTTP/1.0\\r\\n\\r\\n")
data = b""
while chunk := s.recv(4096):
    data += chunk
print(data.decode().splitlines()[-1])
""", net=proxy.net)
    lines = res.output.splitlines()
    assert lines[:2] == ["HTTP/1.1 200 Connection established", "hello from upstream /tunnel"], \
        res.output


def test_other_hosts_are_refused_naming_host_and_setting(host: Host, proxy: Proxy,
                                                         upstream: int) -> None:
    need_curl()
    res = host.run("curl -sS --max-time 10 http://example.com/", net=proxy.net)
    assert ("oploop: host example.com (port 80) is not in agent ops's network allowlist "
            f'(agents.ops.network = ["127.0.0.1:{upstream}", "*.corp.example"] in '
            "oploop.toml)") in res.output, res.output
    # The same loopback address on another port (the proxy's own, say) is another host.
    res = host.run(f"curl -sS --max-time 10 -o /dev/null -w '%{{http_code}}' "
                   f"http://127.0.0.1:{upstream + 1}/", net=proxy.net)
    assert res.output.strip() == "403", res.output
    # HTTPS: the CONNECT is refused; Python shows the status line's text.
    need_python()
    res = host.py("""
import urllib.request
try:
    urllib.request.urlopen("https://corp.example.org/", timeout=10)
except OSError as exc:
    print(exc)
""", net=proxy.net)
    assert "403 oploop: host corp.example.org (port 443) is not in agent ops's" in res.output, \
        res.output


# -- the bubblewrap backend ----------------------------------------------------------


def test_bwrap_backend_is_refused_with_the_reason(host: Host, upstream: int) -> None:
    if host.backend != "bwrap":
        pytest.skip("the bwrap backend's refusal")
    net = Proxied(str(host.home / "run" / "net"), socket_name("agent", "ops"))
    with pytest.raises(ToolRefused, match="network allowlist needs the launcher backend"):
        host.run("true", net=net)


# -- the proxy down -------------------------------------------------------------------


def test_no_proxy_running_fails_clearly(host: Host) -> None:
    """No proxy listening (a dead one's socket, or none ever): a 503 that says so."""
    if host.backend != "launcher":
        pytest.skip("the proxied network runs on the launcher backend")
    need_curl()
    net_dir = host.home / "run" / "net"
    res = host.run("curl -sS --max-time 10 http://pypi.org/",
                   net=Proxied(str(net_dir), "agent-ops.sock"))
    assert "oploop: no network proxy on this machine" in res.output, res.output
    net_dir.mkdir(parents=True)
    import socket

    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(net_dir / "agent-ops.sock"))
    dead.close()  # the file of a proxy that died
    res = host.run("curl -sS --max-time 10 http://pypi.org/; echo; "
                   "curl -sS --max-time 10 https://pypi.org/",
                   net=Proxied(str(net_dir), "agent-ops.sock"))
    assert "oploop: the network proxy is not running (Connection refused)" in res.output, \
        res.output
    assert "CONNECT tunnel failed, response 503" in res.output, res.output


def test_a_killed_proxy_is_restarted_and_serves_again(host: Host, upstream: int) -> None:
    """As the host keeps it (`keep_alive`, the host's `_watch`): killed, it is started
    again and binds its socket anew; the forwarder of the next call reaches it."""
    if host.backend != "launcher":
        pytest.skip("the proxied network runs on the launcher backend")
    need_curl()
    write_config(host.home, upstream)
    (host.home / "run").mkdir(mode=0o700, exist_ok=True)
    net = Proxied(str(host.home / "run" / "net"), socket_name("agent", "ops"))
    child = Child("netproxy", "actors.netproxy")
    env = proxy_env(host.home)

    async def scenario() -> str:
        await spawn(child, env)
        stopping = False
        watch = asyncio.create_task(keep_alive(child, lambda c: spawn(c, env),
                                               changed=lambda: None,
                                               stopping=lambda: stopping))
        try:
            assert child.proc is not None
            first = child.proc.pid
            child.proc.kill()
            deadline = time.monotonic() + BOUND_S * 2
            while child.restarts < 1:
                assert time.monotonic() < deadline, "the proxy was not restarted"
                await asyncio.sleep(0.02)
            assert child.proc.pid != first
            res = await asyncio.to_thread(
                host.run, f"curl -sS --max-time 10 http://127.0.0.1:{upstream}/again", net=net)
            return res.output
        finally:
            stopping = True
            watch.cancel()
            await stop_all([child])

    output = asyncio.run(scenario())
    assert "hello from upstream /again" in output, output
    assert not psutil.pid_exists(child.proc.pid) or child.proc.returncode is not None


def test_proxy_process_leaves_no_traceback_on_garbage(host: Host, proxy: Proxy) -> None:
    """Bad requests get a status line; the proxy's stderr stays free of tracebacks."""
    need_python()
    res = host.py("""
import socket
for req in (b"GARBAGE\\r\\n\\r\\n", b"GET /relative HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n",
            b"CONNECT nohostport HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n",
            b"GET http://127.1/ HTTP/1.1\\r\\nHost: 127.1\\r\\n\\r\\n"):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(req)
    print(s.recv(300).split(b"\\r\\n")[0].decode())
""", net=proxy.net)
    lines = res.output.splitlines()
    assert len(lines) == 4 and all(line.startswith("HTTP/1.1 400 oploop: ") for line in lines), \
        res.output
    assert proxy.proc.poll() is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
