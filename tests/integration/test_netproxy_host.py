"""The host runs the filtering proxy for agents with a network allowlist, and restarts it.

A real host (`oploop up`), the offline model asking for `shell` calls, agent
`ops` allowed one loopback HTTP server: its calls reach it through the proxy,
another agent's calls (network "none") reach nothing, and a proxy killed by
hand is started again by the host, after which calls get through again.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from homes import make_home
from hostkit import actor, of_type, run, running_host, wait_until
from httpkit import serving

from actors.sandbox import machine_layers
from actors.sandbox.workspaces import remove_home


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b"hello through the proxy\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    with serving(_Hello) as port:
        yield port


@pytest.fixture
def home(upstream: int) -> Iterator[str]:
    layers = machine_layers()
    if layers.get("namespaces") or layers.get("seccomp"):
        pytest.skip(f"sandbox layers missing: {layers}")
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    path = make_home("opnp-")
    Path(path, "oploop.toml").write_text(
        f'[agents.ops]\nnetwork = ["127.0.0.1:{upstream}"]\n')
    try:
        yield path
    finally:
        remove_home(Path(path))


def shell_output(home: str, command: str, agent: str) -> str:
    events = run(home, f"run `{command}`", agent=agent)
    ends = of_type(events, "TOOL_END")
    assert len(ends) == 1, events
    return str(ends[0]["data"]["output"])


def test_host_proxies_an_allowlist_and_restarts_its_proxy(home: str, upstream: int) -> None:
    curl = f"curl -sS --max-time 10 http://127.0.0.1:{upstream}/"
    with running_host(home):
        assert "hello through the proxy" in shell_output(home, curl, "ops")
        refused = shell_output(home, "curl -sS --max-time 10 http://example.com/", "ops")
        assert "not in agent ops's network allowlist (agents.ops.network" in refused, refused
        # The default agent's network is "none": no proxy, no socket at all.
        assert "hello" not in shell_output(home, curl, "")

        first = actor(home, "netproxy")
        assert first["state"] == "running" and first["pid"]
        os.kill(first["pid"], signal.SIGKILL)
        wait_until(lambda: actor(home, "netproxy")["restarts"] == 1
                   and actor(home, "netproxy")["state"] == "running",
                   "the host to restart the proxy")
        assert actor(home, "netproxy")["pid"] != first["pid"]
        assert "hello through the proxy" in shell_output(home, curl, "ops")
