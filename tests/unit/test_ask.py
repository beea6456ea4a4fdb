"""ask_machine's pure parts: the peers' configuration, the tool's input, the relay's caps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actors.ask.peers import PeerConfigError, parse_peers
from actors.ask.relay import MAX_FIELD_CHARS, TEXT_EVERY_S, Relay
from actors.ask.tool import check, spec
from actors.config import ConfigError, parse_config


def key_folder(path: Path, secret_mode: int = 0o600) -> Path:
    path.mkdir()
    (path / "server.key").write_text('curve\n    public-key = "x"\n')
    secret = path / "client.key_secret"
    secret.write_text('curve\n    public-key = "y"\n    secret-key = "z"\n')
    os.chmod(secret, secret_mode)
    return path


def test_peers_parse_with_relative_keys(tmp_path):
    key_folder(tmp_path / "kb")
    peers = parse_peers({"b": {"connect": "tcp://127.0.0.2:7400", "keys": "kb",
                               "agent": "ops", "timeout_s": 30}}, tmp_path)
    assert peers["b"].keys == tmp_path / "kb" and peers["b"].agent == "ops"
    assert peers["b"].timeout_s == 30.0


@pytest.mark.parametrize(("table", "named"), [
    ({"connect": "tcp://127.0.0.2:7400", "keys": "missing"}, "peers.b.keys"),
    ({"keys": "kb"}, "peers.b.connect"),
    ({"connect": "http://x", "keys": "kb"}, "peers.b.connect"),
    ({"connect": "tcp://10.0.0.2:7400"}, "peers.b.connect"),  # plain TCP off loopback
    ({"connect": "tcp://127.0.0.2:7400", "keys": "kb", "timeout_s": 0}, "peers.b.timeout_s"),
    ({"connect": "tcp://127.0.0.2:7400", "keys": "kb", "agent": 3}, "peers.b.agent"),
    ({"connect": "tcp://127.0.0.2:7400", "keys": "kb", "role": "x"}, "peers.b.role"),
])
def test_a_bad_peer_names_its_key(tmp_path, table, named):
    key_folder(tmp_path / "kb")
    with pytest.raises(PeerConfigError, match=named.replace(".", r"\.")):
        parse_peers({"b": table}, tmp_path)


def test_a_secret_open_to_others_is_refused(tmp_path):
    key_folder(tmp_path / "kb", 0o644)
    with pytest.raises(PeerConfigError, match="open to others"):
        parse_peers({"b": {"connect": "tcp://127.0.0.2:7400", "keys": "kb"}}, tmp_path)


def test_the_config_file_names_the_peer_key(tmp_path):
    with pytest.raises(ConfigError, match=r"peers\.b\.connect"):
        parse_config({"peers": {"b": {"keys": "x"}}}, str(tmp_path / "oploop.toml"))


def test_a_call_is_checked_against_the_peers(tmp_path):
    key_folder(tmp_path / "kb")
    peers = parse_peers({"b": {"connect": "tcp://127.0.0.2:7400", "keys": "kb"},
                         "c": {"connect": "tcp://127.0.0.3:7400", "keys": "kb"}}, tmp_path)
    assert spec(peers)["input_schema"]["properties"]["machine"]["enum"] == ["b", "c"]
    peer, prompt = check({"machine": "b", "prompt": "uptime"}, peers)  # type: ignore[misc]
    assert (peer.name, prompt) == ("b", "uptime")
    assert "configured peers: b, c" in str(check({"machine": "z", "prompt": "x"}, peers))
    assert "prompt is required" in str(check({"machine": "b", "prompt": " "}, peers))
    assert "unknown input" in str(check({"machine": "b", "prompt": "x", "cwd": "/"}, peers))
    assert "must be an object" in str(check(["b"], peers))


def ev(seq: int, kind: str, **data: object) -> dict[str, object]:
    return {"seq": seq, "type": kind, "turn": 1, "data": data}


def test_streamed_text_is_coalesced_and_flushed_on_time_or_change():
    relay = Relay("b", "t1", "s1")
    assert relay.feed(ev(1, "TOKEN", text="a"), 0.0) == []
    assert relay.feed(ev(2, "TOKEN", text="b"), 0.1) == []
    assert relay.tick(0.1) == []
    (out,) = relay.tick(TEXT_EVERY_S)
    assert out["event"]["data"]["text"] == "ab" and out["event"]["seq"] == 1
    relay.feed(ev(3, "TOKEN", text="c"), 1.0)
    text, tool = relay.feed(ev(4, "TOOL_START", name="shell", input={}), 1.0)
    assert text["event"]["data"]["text"] == "c" and tool["event"]["type"] == "TOOL_START"
    assert tool["machine"] == "b" and tool["session"] == "s1" and tool["tool_use_id"] == "t1"


def test_a_chatty_remote_is_capped_and_its_end_always_goes():
    relay = Relay("b", "t1", "s1", max_events=3)
    sent = [p for i in range(10) for p in relay.feed(ev(i, "TURN_START"), float(i))]
    assert len(sent) == 3 and relay.dropped == 7
    (end,) = relay.feed(ev(11, "DONE", text="x" * (MAX_FIELD_CHARS + 10)), 11.0)
    assert end["dropped"] == 7
    assert len(end["event"]["data"]["text"]) < MAX_FIELD_CHARS + 40


def test_a_cancel_not_yet_sendable_is_sent_again(monkeypatch):
    """A remote run's cancel that cannot leave yet (Backpressure: no connection to the
    peer) is tried again, like one that timed out, instead of being given up."""
    import asyncio

    from actors.ask import asker as asker_mod
    from actors.ask.asker import Asker
    from actors.ask.peers import Peer
    from bus.errors import Backpressure

    monkeypatch.setattr(asker_mod.link, "RENEW_EVERY_S", 0.01)

    class Client:
        calls = 0

        async def cancel(self, session, mode, reason, **_):
            Client.calls += 1
            if Client.calls < 3:
                raise Backpressure("client.control: not connected")

    peer = Peer("b", "tcp://127.0.0.1:7480", None)
    ask = Asker({"b": peer})
    asyncio.run(ask._send_cancel(Client(), peer, "s1"))  # type: ignore[arg-type]
    assert Client.calls == 3 and ask.counts["cancels_sent"] == 3
