"""The network setting and the allowlist's rules (pure), and the proxy's request decision."""

from __future__ import annotations

import pytest

from actors.allowlist import (
    Allowlist,
    BadEntry,
    allowlists,
    parse_entry,
    parse_network,
    socket_name,
)
from actors.config import ConfigError, parse_config
from actors.netproxy.server import Refused, parse_request

LIST = ("pypi.org", "*.corp.example", "127.0.0.1:8080", "[::1]:9000", "Bücher.Example.")


def ops() -> Allowlist:
    return Allowlist.of(parse_network(list(LIST)), "agent ops", "agents.ops.network")  # type: ignore[arg-type]


def test_entries_are_normalised() -> None:
    assert parse_network(list(LIST)) == (
        "pypi.org", "*.corp.example", "127.0.0.1:8080", "[::1]:9000", "xn--bcher-kva.example")
    assert parse_network("none") == "none" and parse_network("all") == "all"


@pytest.mark.parametrize(("host", "port", "allowed"), [
    ("pypi.org", 443, True),
    ("PyPI.org.", 80, True),             # case and the trailing dot
    ("files.pypi.org", 443, False),      # an exact name is not its subdomains
    ("a.corp.example", 443, True),
    ("b.a.corp.example", 22, True),
    ("corp.example", 443, False),        # the wildcard is the subdomains only
    ("evilcorp.example", 443, False),
    ("127.0.0.1", 8080, True),
    ("127.0.0.1", 8081, False),          # the port listed is the only one
    ("::1", 9000, True),
    ("bücher.example", 443, True),       # IDNA
    ("xn--bcher-kva.example", 443, True),
])
def test_matching(host: str, port: int, allowed: bool) -> None:
    from actors.allowlist import normal_host

    assert ops().allows(normal_host(host), port) is allowed


@pytest.mark.parametrize("bad", ["*", "*.", "a.*.example", "*.10.0.0.1", "exa mple.org",
                                 "example.org:0", "example.org:99999", "127.1", "2130706433",
                                 "[::1", ""])
def test_bad_entries(bad: str) -> None:
    with pytest.raises(BadEntry):
        parse_entry(bad)


@pytest.mark.parametrize("value", ["some", True, 3, [], ["ok.org", 5], {"a": 1}])
def test_bad_settings(value: object) -> None:
    with pytest.raises(ValueError):
        parse_network(value)


def test_refusal_names_host_and_setting() -> None:
    assert ops().refusal("example.com", 443) == (
        "oploop: host example.com (port 443) is not in agent ops's network allowlist "
        '(agents.ops.network = ["pypi.org", "*.corp.example", "127.0.0.1:8080", '
        '"[::1]:9000", "xn--bcher-kva.example"] in oploop.toml)')


def test_socket_names_are_plain_or_digests() -> None:
    assert socket_name("agent", "ops") == "agent-ops.sock"
    odd = socket_name("agent", "a/../b")
    assert odd.startswith("agent-x") and "/" not in odd and len(odd) < 64


def test_config_agent_and_mcp_network() -> None:
    config = parse_config({
        "agents": {"ops": {"network": ["pypi.org"]}, "web": {"network": "all"}},
        "mcp": {"a": {"command": ["true"], "network": ["*.corp.example"]},
                "b": {"command": ["true"], "sandbox": {"network": True}},
                "c": {"command": ["true"]}},
    })
    assert config.agents["ops"].network == ("pypi.org",)
    assert config.agents["web"].network == "all"
    assert config.agents["default"].network == "none"
    assert [config.mcp[n].sandbox.network for n in "abc"] == [("*.corp.example",), "all", "none"]
    assert sorted(allowlists(config)) == ["agent-ops.sock", "mcp-a.sock"]


@pytest.mark.parametrize(("data", "named"), [
    ({"agents": {"ops": {"network": "open"}}}, "agents.ops.network"),
    ({"agents": {"ops": {"network": ["*"]}}}, "agents.ops.network: [0]"),
    ({"mcp": {"a": {"command": ["true"], "network": "all",
                    "sandbox": {"network": True}}}}, "mcp.a.network: give network or"),
    ({"mcp": {"a": {"command": ["true"], "sandbox": {"network": "yes"}}}},
     "mcp.a.sandbox.network"),
])
def test_config_errors_name_the_key(data: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("[", r"\[")):
        parse_config(data)


def request(head: str) -> bytes:
    return head.replace("\n", "\r\n").encode() + b"\r\n"


def test_decisions() -> None:
    target = parse_request(request(
        "GET http://PyPI.org/simple/?q=1 HTTP/1.1\nHost: pypi.org\nProxy-Connection: keep-alive\n"
        "Accept: */*\n"), ops())
    assert (target.host, target.port, target.tunnel) == ("pypi.org", 80, False)
    assert target.head == (b"GET /simple/?q=1 HTTP/1.1\r\nHost: pypi.org\r\nAccept: */*\r\n"
                           b"Connection: close\r\n\r\n")
    tunnel = parse_request(request("CONNECT a.corp.example:443 HTTP/1.1\nHost: x\n"), ops())
    assert (tunnel.host, tunnel.port, tunnel.tunnel) == ("a.corp.example", 443, True)
    with pytest.raises(Refused) as refused:
        parse_request(request("CONNECT example.com:443 HTTP/1.1\nHost: x\n"), ops())
    assert refused.value.status == 403 and "host example.com (port 443)" in refused.value.reason
    for bad in ("GET /relative HTTP/1.1\nHost: x\n", "GET ftp://pypi.org/ HTTP/1.1\nHost: x\n",
                "CONNECT pypi.org HTTP/1.1\nHost: x\n", "NONSENSE\n"):
        with pytest.raises(Refused) as refused:
            parse_request(request(bad), ops())
        assert refused.value.status == 400, bad


def test_one_allowlist_cannot_take_every_connection(tmp_path, monkeypatch):
    """Past MAX_PER_LIST, one list's connections get a 503 naming its owner; another
    list's socket still serves."""
    import asyncio

    from actors.netproxy import server

    monkeypatch.setattr(server, "MAX_PER_LIST", 3)
    lists = {"agent-a.sock": Allowlist.of(("a.example",), "agent a", "agents.a.network"),
             "agent-b.sock": Allowlist.of(("b.example",), "agent b", "agents.b.network")}

    async def scenario() -> tuple[bytes, bytes]:
        proxy = server.NetProxy(tmp_path / "net", lists)
        await proxy.start()
        held = []
        try:
            for _ in range(3):
                held.append(await asyncio.open_unix_connection(str(tmp_path / "net/agent-a.sock")))
            r, w = await asyncio.open_unix_connection(str(tmp_path / "net/agent-a.sock"))
            over = await r.read()
            w.close()
            r, w = await asyncio.open_unix_connection(str(tmp_path / "net/agent-b.sock"))
            w.write(b"CONNECT c.example:443 HTTP/1.1\r\nHost: c.example\r\n\r\n")
            other = await r.read()
            w.close()
            return over, other
        finally:
            for _, writer in held:
                writer.close()
            await proxy.aclose()

    over, other = asyncio.run(scenario())
    assert over.startswith(b"HTTP/1.1 503 oploop: agent a holds 3 connections"), over
    assert other.startswith(b"HTTP/1.1 403 oploop: host c.example (port 443) is not in agent b"), \
        other
