"""Which machine a worker's key lets it serve (issue 27 item 3): the supervisor's rule
and the `[network] local_worker_keys` setting."""

from __future__ import annotations

import pytest

from actors.config import ConfigError, parse_config
from actors.supervisor.machines import machine_problem

NETWORK = {"listen": "tcp://127.0.0.1:7400"}


def test_a_worker_key_serves_the_machine_it_names_only():
    assert machine_problem("B", "worker:B") is None
    assert "may serve machine 'B', not 'C'" in (machine_problem("C", "worker:B") or "")
    # Unnamed: the host's own machine, not for a worker key unless listed.
    assert "serves machine 'B' only" in (machine_problem("", "worker:B") or "")
    assert machine_problem("", "worker:B", frozenset({"B"})) is None
    assert machine_problem("", "local") is None  # the host's own workers
    assert machine_problem("", None) is None  # plain ipc
    assert machine_problem("local", "worker:local") is not None


def test_local_worker_keys_is_read_and_checked():
    assert parse_config({"network": NETWORK}).local_worker_keys == frozenset()
    config = parse_config({"network": {**NETWORK, "local_worker_keys": ["gpu", "far"]}})
    assert config.local_worker_keys == frozenset({"gpu", "far"})
    with pytest.raises(ConfigError, match="network.local_worker_keys"):
        parse_config({"network": {**NETWORK, "local_worker_keys": "gpu"}})
