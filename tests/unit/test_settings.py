"""`actors.settings`: every setting read in one place, each mistake named like a config key."""

from __future__ import annotations

import pytest

from actors.config import ConfigError
from actors.settings import RetrySettings, load_settings


def env(tmp_path, **values: str) -> dict[str, str]:
    """An environment with a home of its own (no oploop.toml) and `values`."""
    return {"OPLOOP_HOME": str(tmp_path), **values}


def test_defaults_match_the_documented_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_settings(env(tmp_path))
    assert s.home == tmp_path
    assert s.retry == RetrySettings(attempts=6, base_s=0.5, cap_s=32.0, idle_s=2.0, first_s=60.0,
                                   pause_s=30.0, retry_after_cap_s=120.0)
    assert (s.token_batch_s, s.llm_backend, s.llm_callers, s.executors) == (0.02, "anthropic", 1, 1)
    assert (s.log_level, s.viewer_queue, s.connect) == ("WARNING", 100_000, "")
    r = s.config.retention
    assert (r.max_sessions, r.max_age_s) == (1000, 30 * 86_400)


def test_values_are_read_and_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_settings(env(tmp_path, OPLOOP_RETRY_ATTEMPTS="2", OPLOOP_RETRY_BASE_S="0.01",
                          OPLOOP_TOKEN_BATCH_MS="0", OPLOOP_LOG_LEVEL="debug",
                          OPLOOP_EXECUTORS="3", OPLOOP_EVENT_RETENTION_SESSIONS="5",
                          OPLOOP_EVENT_RETENTION_DAYS="0.5", OPLOOP_INTENT_ROUTER="on"))
    assert (s.retry.attempts, s.retry.base_s, s.token_batch_s) == (2, 0.01, 0.0)
    assert (s.log_level, s.executors, s.config.router.enabled) == ("DEBUG", 3, True)
    assert (s.config.retention.max_sessions, s.config.retention.max_age_s) == (5, 43_200)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("OPLOOP_RETRY_ATTEMPTS", "x", "OPLOOP_RETRY_ATTEMPTS: expected int, got 'x'"),
    ("OPLOOP_RETRY_MAX_S", "soon", "OPLOOP_RETRY_MAX_S: expected float, got 'soon'"),
    ("OPLOOP_EXECUTORS", "0", "OPLOOP_EXECUTORS: must be at least 1, got '0'"),
    ("OPLOOP_TOKEN_BATCH_MS", "1e9", "OPLOOP_TOKEN_BATCH_MS: must be within 0..10000"),
    ("OPLOOP_EVENT_RETENTION_SESSIONS", "-3", "OPLOOP_EVENT_RETENTION_SESSIONS: must be at"),
    ("OPLOOP_LOG_LEVEL", "loud", "OPLOOP_LOG_LEVEL: expected one of DEBUG"),
    ("OPLOOP_INTENT_ROUTER", "maybe", "OPLOOP_INTENT_ROUTER: expected one of on, off"),
])
def test_a_bad_value_names_its_variable(tmp_path, monkeypatch, name, value, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_settings(env(tmp_path, **{name: value}))
    assert str(err.value).startswith(message)


def test_the_file_comes_from_oploop_config_then_the_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "oploop.toml").write_text("[limits]\nmax_prompt_chars = 7\n")
    assert load_settings(env(tmp_path)).config.limits.max_prompt_chars == 7
    other = tmp_path / "other.toml"
    other.write_text("[limits]\nmax_prompt_chars = 9\n")
    chosen = load_settings(env(tmp_path, OPLOOP_CONFIG=str(other)))
    assert chosen.config.limits.max_prompt_chars == 9
    other.write_text("[limits]\nmax_prompt_chars = 'x'\n")
    with pytest.raises(ConfigError, match="limits.max_prompt_chars: expected int"):
        load_settings(env(tmp_path, OPLOOP_CONFIG=str(other)))


def test_oploop_store_overrides_the_store_url(tmp_path):
    s = load_settings(env(tmp_path, OPLOOP_STORE="postgresql://o@/x?host=/run/pg"))
    assert s.config.store.url == "postgresql://o@/x?host=/run/pg"
    with pytest.raises(ConfigError, match="OPLOOP_STORE: expected a postgresql:// URL"):
        load_settings(env(tmp_path, OPLOOP_STORE="sqlite:///x"))
