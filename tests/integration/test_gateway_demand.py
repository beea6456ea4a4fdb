"""The gateway on demand: the host binds `[http] listen`, and the gateway process starts
at the first connection; it follows every session only while an `/api/events` stream is
open; its event counters are the broadcaster's, kept over its restarts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
from homes import make_home, remove_home
from hostkit import actor, oploop, run_events, running_host, wait_until
from prometheus_client.parser import text_string_to_metric_families

from bus.client import Client

LISTEN = {"OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}


@pytest.fixture
def home():
    home = make_home("opgd-")
    try:
        yield home
    finally:
        remove_home(Path(home))


def url_of(home: str) -> str:
    return (Path(home) / "run" / "web.url").read_text().strip()


def http_client(home: str) -> aiohttp.ClientSession:
    token = (Path(home) / "web.token").read_text().strip()
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})


def gateway_processes(home: str) -> list[psutil.Process]:
    """The host's children running the gateway's module."""
    host = psutil.Process(int((Path(home) / "run" / "host.lock").read_text()))
    return [p for p in host.children() if "actors.gateway" in p.cmdline()]


async def samples(http: aiohttp.ClientSession, url: str) -> dict[tuple, float]:
    async with http.get(f"{url}metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_no_gateway_runs_until_a_first_connection_which_it_answers(home):
    with running_host(home, {**LISTEN, "OPLOOP_LOG_LEVEL": "INFO"}):
        # The address and the token are there for `oploop web`; no gateway process yet.
        assert url_of(home).startswith("http://127.0.0.1:")
        assert (Path(home) / "web.token").exists()
        assert actor(home, "gateway")["state"] == "waiting"
        assert actor(home, "gateway")["pid"] is None
        assert gateway_processes(home) == []
        # Binding and the token cost the host no OpenSSL (~4 MB resident, `urls.py`).
        host = psutil.Process(int((Path(home) / "run" / "host.lock").read_text()))
        assert not [m.path for m in host.memory_maps() if "libcrypto" in m.path
                    or "libssl" in m.path]
        status = oploop(home, "status")
        assert status.returncode == 0, status.stderr
        assert "gateway starts at the first connection" in status.stdout
        web = oploop(home, "web", "--no-open")
        assert web.returncode == 0 and "?token=" in web.stdout
        # A session run without the web view: still no gateway.
        asyncio.run(run_events(home, "hello"))
        assert gateway_processes(home) == []

        async def first_request() -> None:
            async with http_client(home) as http, \
                    http.get(f"{url_of(home)}api/sessions") as resp:
                assert resp.status == 200
                assert len((await resp.json())["sessions"]) == 1

        asyncio.run(first_request())
        # The host records the gateway running once it said ready, which may come a
        # moment after it answered the connection it was started for (a red CI run).
        wait_until(lambda: actor(home, "gateway")["state"] == "running", "the gateway's record")
        assert [p.pid for p in gateway_processes(home)] == [actor(home, "gateway")["pid"]]
        logs = oploop(home, "logs", "gateway")
        assert logs.returncode == 0 and f"gateway serving {url_of(home)}" in logs.stdout
        assert "starting the gateway" in oploop(home, "logs", "host").stdout


def test_a_configured_port_taken_fails_up_clearly(home):
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        up = oploop(home, "up", "--detach", env={"OPLOOP_HTTP_LISTEN": f"127.0.0.1:{port}"},
                    timeout=180)
        assert up.returncode != 0
        assert f"cannot listen on 127.0.0.1:{port}" in up.stderr, up.stderr
        assert not (Path(home) / "run" / "host.json").exists()
    finally:
        taken.close()


def test_a_cert_that_cannot_be_loaded_fails_up_not_a_first_request(home, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    key.write_text("not a key\n")
    Path(home, "oploop.toml").write_text(f'[http]\ncert = "{cert}"\nkey = "{key}"\n')
    up = oploop(home, "up", "--detach", env=LISTEN, timeout=180)
    assert up.returncode != 0
    assert "cannot load [http] cert/key" in up.stderr, up.stderr


def test_counters_survive_a_gateway_restart_and_the_feed_subscribes_only_while_open(home):
    async def viewers_of_all() -> int:
        async with Client.connect(Path(home)) as client:
            return int((await client.broadcaster_stats())["viewers_of_all"])

    with running_host(home, LISTEN):
        asyncio.run(run_events(home, "hello"))

        async def before() -> dict[tuple, float]:
            async with http_client(home) as http:
                return await samples(http, url_of(home))

        counted = asyncio.run(before())
        done = counted[("oploop_runs_total", (("terminal", "DONE"),))]
        assert done == 1
        # No list stream open: the gateway follows no session.
        assert asyncio.run(viewers_of_all()) == 0

        os.kill(actor(home, "gateway")["pid"], signal.SIGKILL)
        wait_until(lambda: actor(home, "gateway")["restarts"] == 1
                   and actor(home, "gateway")["state"] == "running", "the gateway back")

        async def after() -> None:
            async with http_client(home) as http:
                s = await samples(http, url_of(home))  # (the same socket, the same URL)
                assert s[("oploop_runs_total", (("terminal", "DONE"),))] == done
                assert s[("oploop_turns_total", ())] == counted[("oploop_turns_total", ())]
                async with http.get(f"{url_of(home)}api/events") as feed:
                    assert await feed.content.readline() == b": listening\n"
                    assert await viewers_of_all() == 1  # subscribed, and in effect
                # The last stream gone: unsubscribed (the broadcaster hears it shortly).
                deadline = time.monotonic() + 10
                while await viewers_of_all() != 0:
                    assert time.monotonic() < deadline, "still subscribed to every session"
                    await asyncio.sleep(0.02)

        asyncio.run(after())
