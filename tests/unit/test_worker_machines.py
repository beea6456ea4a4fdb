"""Worker machines without processes: names, the supervisor's registry, a session's
machine across the session log, the worker machine's arguments."""

from __future__ import annotations

import pytest

from actors.config import Agent, ConfigError
from actors.host.workers import WorkerMachineError, WorkerMachineSpec
from actors.machines import LOCAL, machine_name_error, machine_of
from actors.settings import load_settings
from actors.supervisor.fold import _agent
from actors.supervisor.machines import MAX_GONE, Machines
from actors.supervisor.request import reminders


def test_machine_names():
    assert machine_name_error("db-1.eu_west") is None
    for bad in ("", "-x", "a/b", "a b", "x" * 65):
        assert "machine name" in (machine_name_error(bad) or ""), bad
    assert machine_of("") == LOCAL and machine_of("B") == "B"


def test_oploop_machine_is_checked_at_start(tmp_path):
    env = {"OPLOOP_HOME": str(tmp_path)}
    assert load_settings({**env, "OPLOOP_MACHINE": "B"}).machine == "B"
    for bad in ("a/b", LOCAL):
        with pytest.raises(ConfigError, match="OPLOOP_MACHINE"):
            load_settings({**env, "OPLOOP_MACHINE": bad})


def test_a_bad_target_machine_is_named(tmp_path):
    from actors.config import load_config

    for bad in ("a b", LOCAL):
        path = tmp_path / "oploop.toml"
        path.write_text(f'[agents.ops]\ntarget_machine = "{bad}"\n')
        with pytest.raises(ConfigError, match="agents.ops.target_machine"):
            load_config(path)


def test_the_registry_follows_workers_and_remembers_the_gone():
    machines = Machines()
    machines.joined("B", "tool", "tool-1", "10.0.0.2", "worker:B")
    machines.joined("B", "llm", "llm-2")
    [b] = machines.describe()
    assert b["state"] == "up" and b["workers"] == {"tool": 1, "llm": 1}
    assert b["address"] == "10.0.0.2" and b["key"] == "worker:B"
    machines.left("B", "tool", "tool-1", "lost")
    machines.left("B", "tool", "tool-1", "lost")  # told twice: counted once
    assert machines.describe()[0]["state"] == "up"
    machines.left("B", "llm", "llm-2", "lost")
    [b] = machines.describe()
    assert b["state"] == "lost" and b["workers"] == {} and b["worker_ids"] == []
    machines.joined("B", "tool", "tool-3")  # back: up again, counted afresh
    assert machines.describe()[0]["workers"] == {"tool": 1}
    for i in range(MAX_GONE + 10):
        machines.joined(f"m{i}", "tool", f"t{i}")
        machines.left(f"m{i}", "tool", f"t{i}", "left")
    assert len(machines.known) == MAX_GONE + 1  # the gone ones are bounded; B stays


def test_a_session_aimed_at_a_machine_stays_aimed_after_a_reload():
    configured = {"default": Agent()}
    raw = {"name": "default", "target_machine": "B"}
    assert _agent(raw, configured).target_machine == "B"
    assert _agent({"name": "default"}, configured) is configured["default"]
    aimed = reminders(_agent(raw, configured), [], "/tmp")
    assert any(r.startswith("Target machine") and "B" in r for r in aimed)
    assert not any(r.startswith("Environment") for r in aimed)


def test_worker_machine_arguments_are_checked(tmp_path):
    def spec(**kw):
        base = {"connect": "tcp://10.0.0.1:7600", "keys": tmp_path, "machine": "B"}
        return WorkerMachineSpec(**{**base, **kw})

    for kw, said in (({"machine": "local"}, "host's own"), ({"machine": "a b"}, "machine name"),
                     ({"executors": 0}, "at least one worker"),
                     ({"connect": "http://x"}, "tcp://HOST:PORT"),
                     ({}, "cannot read key")):
        with pytest.raises(WorkerMachineError, match=said):
            spec(**kw).check()


def test_a_worker_machine_runs_the_proxy_for_its_allowlists(tmp_path):
    from actors.host.workers import WorkerMachine

    spec = WorkerMachineSpec("tcp://127.0.0.1:7400", tmp_path / "keys", "db1", executors=2)
    machine = WorkerMachine(spec, tmp_path)
    assert [c.name for c in machine.workers()] == ["executor-1", "executor-2"]
    (tmp_path / "oploop.toml").write_text('[agents.ops]\nnetwork = ["pypi.org"]\n')
    assert [c.name for c in machine.workers()] == ["executor-1", "executor-2", "netproxy"]
    llm_only = WorkerMachine(WorkerMachineSpec(spec.connect, spec.keys, "db1", 0, 1), tmp_path)
    assert [c.name for c in llm_only.workers()] == ["llm-1"]  # no executor: no proxy
