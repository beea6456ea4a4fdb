"""`oploop.toml`: what it sets, and that every mistake names its key."""

from __future__ import annotations

import pytest

from actors.config import ConfigError, config_path, load_config, parse_config


def test_defaults_without_a_file(tmp_path):
    config = load_config(config_path(tmp_path, cwd=tmp_path))
    assert set(config.agents) == {"default"} and config.aliases["sonnet"]
    assert not config.router.enabled


def test_a_full_file(tmp_path):
    path = tmp_path / "oploop.toml"
    path.write_text("""
[models]
fast = "claude-fast-9"
[hidden.local]
readonly = ["shell", "write_file"]
[router]
enabled = true
model = "fast"
[limits]
max_prompt_chars = 100
[agents.ops]
model = "fast"
max_turns = 3
temperature = 1
category_allowlist = ["fs"]
streaming = false
""")
    config = load_config(path)
    ops = config.agent("ops")
    assert ops.model_id(config.aliases) == "claude-fast-9" and ops.max_turns == 3
    assert ops.temperature == 1.0 and ops.category_allowlist == ("fs",) and not ops.streaming
    assert config.hidden[("local", "readonly")] == {"shell", "write_file"}
    assert config.router.enabled and config.limits.max_prompt_chars == 100
    assert config.agent("") is config.agents["default"] and config.agent("nope") is None


@pytest.mark.parametrize("text, key", [
    ("[agents.a]\nmax_turnz = 3", "agents.a.max_turnz"),
    ("[agents.a]\nmax_turns = '3'", "agents.a.max_turns"),
    ("[agents.a]\nmax_turns = 0", "agents.a.max_turns"),
    ("[agents.a]\nstreaming = 1", "agents.a.streaming"),
    ("[agents.a]\ncategory_allowlist = 'fs'", "agents.a.category_allowlist"),
    ("[agents.a]\ntemperature = 3.0", "agents.a.temperature"),
    ("[agents.a]\nname = 'b'", "agents.a.name"),
    ("[hidden.local]\nreadonly = [1]", "hidden.local.readonly[0]"),
    ("[hidden]\nlocal = 1", "hidden.local"),
    ("[models]\nfast = 2", "models.fast"),
    ("[router]\nmax_tokens = 'x'", "router.max_tokens"),
    ("[limitz]\nx = 1", "limitz"),
    ("agents = 3", "agents"),
    ("[agents.a]\nread_paths = '/srv'", "agents.a.read_paths"),
    ("[agents.a]\nread_paths = [1]", "agents.a.read_paths[0]"),
])
def test_mistakes_name_their_key(text, key):
    import tomllib

    with pytest.raises(ConfigError) as err:
        parse_config(tomllib.loads(text), "oploop.toml")
    assert f"oploop.toml: {key}" in str(err.value)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[agents\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize("network, key", [
    ({"listen": "tcp://0.0.0.0:7400", "curve": False}, "network.curve"),
    ({"listen": "tcp://db-1.example:7400", "curve": False}, "network.curve"),
    ({"listen": "ipc:///tmp/x"}, "network.listen"),
    ({"listen": "tcp://127.0.0.1"}, "network.listen"),
    ({"listen": "tcp://127.0.0.1:65534"}, "network.listen"),
    ({"curve": True}, "network.listen"),
    ({"listen": "tcp://127.0.0.1:7400", "curve": "yes"}, "network.curve"),
    ({"listen": "tcp://127.0.0.1:7400", "port": 1}, "network.port"),
])
def test_bad_network_settings_name_their_key(network, key):
    with pytest.raises(ConfigError, match=key):
        parse_config({"network": network})


def test_network_settings():
    assert parse_config({}).network is None
    curve = parse_config({"network": {"listen": "tcp://0.0.0.0:7400"}}).network
    assert curve is not None and curve.curve and curve.address("replay") == "tcp://0.0.0.0:7404"
    plain = parse_config({"network": {"listen": "tcp://127.0.0.1:7400", "curve": False}}).network
    assert plain is not None and not plain.curve and plain.address("api").endswith(":7400")
    v6 = parse_config({"network": {"listen": "tcp://[::1]:7400", "curve": False}}).network
    assert v6 is not None and v6.address("work") == "tcp://[::1]:7402"


def test_agent_read_paths():
    """An agent's read_paths (what its confined reads may see) reach its ToolJobs."""
    from bus.messages import ToolJob

    config = parse_config({"agents": {"ops": {"read_paths": ["/srv/logs", "/var/log"]}}})
    agent = config.agent("ops")
    assert agent is not None and agent.read_paths == ("/srv/logs", "/var/log")
    assert config.agent("").read_paths == ()  # type: ignore[union-attr]
    from bus.codec import decode, encode
    from bus.messages import Envelope

    job = ToolJob("read_file", {"path": "x"}, "/", 1.0, list(agent.read_paths))
    assert decode(encode(Envelope(job))).body.read_paths == ["/srv/logs", "/var/log"]


def test_the_store_table():
    assert parse_config({}).store.url == ""  # the SQLite file in the home
    got = parse_config({"store": {"url": "postgresql://o@db/oploop", "lease_s": 3}}).store
    assert (got.url, got.lease_s) == ("postgresql://o@db/oploop", 3.0)
    for bad, key in (({"url": "mysql://x"}, "store.url"), ({"lease_s": 1}, "store.lease_s"),
                     ({"urls": ""}, "urls")):
        with pytest.raises(ConfigError, match=key):
            parse_config({"store": bad})
