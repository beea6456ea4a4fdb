"""OAuth 2.1 for HTTP MCP servers (issue 30, item 9): `oploop mcp login NAME` against a
server built from the SDK's auth pieces (`mcp_oauthserver.py`: metadata discovery,
dynamic client registration, authorization code with PKCE, refresh), the test acting
as the browser (it opens the printed URL; the redirect reaches the CLI's loopback
port); the tokens kept 0600; the executor's calls carry them and refresh them when
they expire; a server nobody logged in to says what to run."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from homes import make_home
from hostkit import WAIT_S, cli_env, of_type, oploop, run, running_host, wait_until
from mcpkit import PYTHON, call, free_port, wait_tools

from actors.sandbox.workspaces import remove_home

OAUTH_SERVER = str(Path(__file__).with_name("mcp_oauthserver.py"))
#: How long the server's access tokens live: the test sees one refreshed.
ACCESS_S = 3
SCRIPTS = {"whoami": call("mcp__secure__whoami")}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, Path]]:
    """The OAuth-protected server on a free port; its stderr (the grants) in a file."""
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="opmo-", dir="/tmp"))
    log = logs / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([PYTHON, OAUTH_SERVER, str(port), str(ACCESS_S)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: "Uvicorn running" in log.read_text(), "the OAuth server", 60)
        yield port, log
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture(scope="module")
def home(server) -> Iterator[str]:
    port, _ = server
    home = make_home("opmo-")
    url = f"http://127.0.0.1:{port}/mcp"
    Path(home, "oploop.toml").write_text(
        f'[mcp.secure]\nurl = "{url}"\n\n[mcp.nologin]\nurl = "{url}"\n')
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        yield home
    finally:
        remove_home(Path(home))


def login(home: str) -> subprocess.CompletedProcess[str]:
    """`oploop mcp login secure`, the test opening the URL it prints as a browser would
    (following the authorization server's redirect to the CLI's loopback port)."""
    proc = subprocess.Popen([PYTHON, "-m", "actors.cli", "mcp", "login", "secure",
                             "--timeout", "60"], env=cli_env(home), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    said = proc.stdout.readline()
    assert said.startswith("Open this URL in a browser"), said
    url = proc.stdout.readline().strip()
    browser = httpx2.get(url, follow_redirects=True, timeout=30)
    assert browser.status_code == 200 and "logged in" in browser.text, browser.text
    out, err = proc.communicate(timeout=WAIT_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, said + url + out, err)


def stored(home: str) -> dict:
    return json.loads(Path(home, "mcp-auth", "secure.json").read_text())


def test_login_then_calls_carry_the_token_and_refresh_it(home, server):
    _, server_log = server
    done = login(home)
    assert done.returncode == 0, done.stderr
    assert "logged in to secure (1 tools)" in done.stderr
    assert "code_challenge_method=S256" in done.stdout  # PKCE
    path = Path(home, "mcp-auth", "secure.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    first = stored(home)
    assert first["client"]["client_name"] == "oploop" and first["tokens"]["refresh_token"]
    assert "grant: authorization_code" in server_log.read_text()

    env = {"OPLOOP_OFFLINE_SCENARIO": str(Path(home, "scenario.json"))}
    with running_host(home, env) as h:
        wait_tools(h, {"mcp__secure__whoami"})
        (end,) = of_type(run(h, "#whoami"), "TOOL_END")
        client = first["client"]["client_id"]
        assert end["data"]["output"] == f"client {client} with scopes mcp", end["data"]
        # Past the access token's life: the next call refreshes it (and keeps the new one).
        expires = stored(h)["expires_at"]
        wait_until(lambda: time.time() > expires + 0.5, "the access token to expire", 30)
        (again,) = of_type(run(h, "#whoami"), "TOOL_END")
        assert again["data"]["output"] == f"client {client} with scopes mcp", again["data"]
        assert "grant: refresh_token" in server_log.read_text()
        assert stored(h)["tokens"]["access_token"] != first["tokens"]["access_token"]

        # The server nobody logged in to: its status says what to run.
        def told() -> bool:
            status = json.loads(oploop(h, "status", "--json").stdout)
            errors = [s.get("error", "") for s in status["mcp"] if s["name"] == "nologin"]
            return any("oploop mcp login nologin" in e for e in errors)

        wait_until(told, "the nologin server's status to say `oploop mcp login`", 60)


def test_login_refuses_a_server_not_configured(home):
    unknown = oploop(home, "mcp", "login", "nope")
    assert unknown.returncode != 0 and "no MCP server 'nope'" in unknown.stderr


def logged_in_home(port: int) -> str:
    """A home of its own logged in to the server (`secure`)."""
    home = make_home("opmo-")
    Path(home, "oploop.toml").write_text(f'[mcp.secure]\nurl = "http://127.0.0.1:{port}/mcp"\n')
    done = login(home)
    assert done.returncode == 0, done.stderr
    return home


async def whoami(home: str, port: int) -> str:
    """`whoami` called as an executor calls it: through `auth_for`'s provider over the
    home's token file (a provider and a file reader of its own, as each executor has)."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from actors.mcp.config import McpServerConfig
    from actors.mcp.oauth import auth_for

    config = McpServerConfig(name="secure", url=f"http://127.0.0.1:{port}/mcp")
    async with httpx2.AsyncClient(auth=auth_for(config, Path(home)), timeout=30) as http, \
            streamable_http_client(config.url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("whoami", {})
        return result.content[0].text  # type: ignore[union-attr]


def grants(log: Path) -> tuple[int, int]:
    """The server's refresh grants so far: made, and refused."""
    text = log.read_text()
    return text.count("grant: refresh_token"), text.count("refused: refresh_token")


def expire(home: str, at: float) -> None:
    """Make the stored access token expire at `at` (as oploop sees it)."""
    path = Path(home, "mcp-auth", "secure.json")
    data = json.loads(path.read_text())
    data["expires_at"] = at
    path.write_text(json.dumps(data))


def test_two_executors_refreshing_at_once_share_one_refresh(server):
    """Two executors (providers, file readers of their own) find the access token
    expired at the same moment: one refreshes (the server rotates the refresh token),
    the other takes the tokens it wrote, not refreshing with the spent one."""
    import asyncio

    port, server_log = server
    home = logged_in_home(port)
    try:
        expire(home, time.time() - 1)
        before = grants(server_log)
        client = stored(home)["client"]["client_id"]

        async def both() -> list[str]:
            return list(await asyncio.gather(whoami(home, port), whoami(home, port)))

        assert asyncio.run(both()) == [f"client {client} with scopes mcp"] * 2
        assert grants(server_log) == (before[0] + 1, before[1])  # one, none refused
        assert stored(home)["expires_at"] > time.time()
    finally:
        remove_home(Path(home))


def test_a_token_refused_before_its_time_is_refreshed(server):
    """The server refuses an access token oploop holds unexpired (its clock, or a
    revocation): the call refreshes it and goes on, not asking for a login."""
    import asyncio

    port, server_log = server
    home = logged_in_home(port)
    try:
        expires = stored(home)["expires_at"]
        wait_until(lambda: time.time() > expires + 0.5, "the access token to expire", 30)
        expire(home, time.time() + 3600)
        before = grants(server_log)
        client = stored(home)["client"]["client_id"]
        assert asyncio.run(whoami(home, port)) == f"client {client} with scopes mcp"
        assert grants(server_log) == (before[0] + 1, before[1])
    finally:
        remove_home(Path(home))
