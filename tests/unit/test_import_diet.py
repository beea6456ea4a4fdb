"""Each actor imports only what its role uses (issue 13, idle RSS).

Checked in a fresh interpreter per case: which modules importing an actor's
entry module loads. A module listed here costs resident memory in every
process of that role, idle or not.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running `statement`."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return set(json.loads(done.stdout))


#: The offline model's HTTP side: the server, its command line, and h11.
OFFLINE_SERVER = {"actors.offline_model.server", "actors.offline_model.cli", "h11"}


def test_an_llm_caller_on_the_sdk_loads_nothing_of_the_offline_model():
    loaded = loaded_after("import actors.llm_caller.actor")
    assert "actors.llm_caller.actor" in loaded
    assert not {m for m in loaded if m.startswith("actors.offline_model")}
    assert "actors.llm_caller.scripted" not in loaded


def test_the_scripted_backend_does_not_load_the_offline_models_server():
    # the scripted backend plays the offline model's scenarios, in process
    loaded = loaded_after("import actors.llm_caller.scripted")
    assert "actors.offline_model.scenario" in loaded  # the case does reach the package
    assert not loaded & OFFLINE_SERVER, sorted(loaded & OFFLINE_SERVER)


def test_a_scenario_the_scripted_backend_cannot_play_is_named(tmp_path):
    from actors.llm_caller.actor import BadScript, backend_for
    from actors.settings import load_settings

    script = tmp_path / "bad.json"
    script.write_text('[{"fault": "status", "status": 529}]')
    settings = load_settings({"OPLOOP_HOME": str(tmp_path), "OPLOOP_LLM_BACKEND": "scripted",
                              "OPLOOP_LLM_SCRIPT": str(script)})
    with pytest.raises(BadScript, match="faults need the offline model"):
        backend_for(settings)


def test_the_offline_model_package_still_exports_its_names():
    loaded = loaded_after(
        "from actors.offline_model import start_server, ScenarioError, main, OfflineServer\n"
        "import actors.offline_model as m\n"
        "assert m.start_server is start_server and 'start_server' in m.__all__")
    assert loaded >= OFFLINE_SERVER


def test_an_unknown_name_of_the_offline_model_package_is_an_attribute_error():
    import actors.offline_model as package

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018 - the access is the test


#: What no actor but those that need it should load: pydantic (~11 MB resident in a
#: process that builds a model), the `anthropic` SDK (the llm callers' only), the sandbox
#: and the built-in tools (the executors' only), SQLite (the journal and event store), the
#: `mcp` SDK (loaded by an executor only when `[mcp.NAME]` servers are configured),
#: psutil (~0.9 MiB resident beside the rest: the host imports it to stop only, the
#: executors read /proc themselves), `email` (~1.5 MiB: the SDK's; a caller without it
#: parses a retry-after date only), the codec and every message type (~1 MiB: what
#: speaks the bus; not the host), shutil (~0.45 MiB with the bz2 and lzma it loads: the
#: sandbox's; elsewhere imported where a command is looked up or a key issued), tenacity
#: (~0.45 MiB: an llm caller's retries, imported after a first failure).
HEAVY = {"pydantic", "anthropic", "httpx", "actors.sandbox", "actors.tools.builtin", "sqlite3",
         "mcp", "mcp_types", "psutil", "email", "bus.codec", "shutil", "tenacity"}
#: What each actor's role does use of them.
USES = {
    "actors.host.actor": set(),
    "actors.broadcaster.actor": {"sqlite3", "bus.codec"},
    "actors.supervisor.actor": {"sqlite3", "bus.codec"},
    "actors.executor.actor": {"actors.sandbox", "actors.tools.builtin", "bus.codec", "shutil"},
    "actors.llm_caller.actor": {"bus.codec"},  # the SDK is imported at the first call
    "actors.offline_model.cli": {"email"},  # an HTTP server (its Date header): no bus, no SDK
}


def test_the_host_runs_on_asyncios_own_loop():
    # it only starts its actors and waits: uvloop (~2 MB resident) buys it nothing
    assert "uvloop" not in loaded_after("import actors.host.actor")


@pytest.mark.parametrize("entry", sorted(USES))
def test_an_actor_loads_none_of_the_heavy_modules_its_role_does_not_use(entry):
    loaded = loaded_after(f"import {entry}")
    assert entry in loaded
    assert not loaded & (HEAVY - USES[entry]), sorted(loaded & (HEAVY - USES[entry]))


def test_an_executor_with_its_sandboxed_catalogue_never_loads_pydantic(tmp_path):
    # Built as the executor builds it (the tools' validators and schemas included),
    # and one call validated: the built-ins state their contracts by hand.
    loaded = loaded_after(
        "from actors.executor.actor import sandboxed_catalogue, default_sandbox\n"
        "from pathlib import Path\n"
        f"cat = sandboxed_catalogue(default_sandbox(Path({str(tmp_path)!r})))\n"
        "assert sorted(cat) == ['list_dir', 'memory', 'read_file', 'shell', 'write_file']\n"
        "cat['shell'].validate({'command': 'true', 'timeout_s': 5})\n"
        "[s.to_wire() for s in cat.specs()]")
    assert "actors.tools.builtin" in loaded
    assert not {m for m in loaded if m.split(".")[0] == "pydantic"}


def test_the_run_core_loads_no_io_and_nothing_of_the_supervisor():
    # actors/core is the run's decisions and their driver: no socket, no database, and
    # the in-process Runner, built on it, never loads the supervisor
    loaded = loaded_after("import actors.core.machine, actors.core.driver, actors.core.fold, "
                          "actors.core.session, actors.runner")
    io = {m for m in loaded if m.split(".")[0] in ("zmq", "sqlite3", "_sqlite3", "aiohttp")}
    assert not io, sorted(io)
    assert not {m for m in loaded if m.startswith("actors.supervisor")}


#: Actors that open no TLS connection of their own: their `__main__` keeps `ssl` out
#: before asyncio loads it (an llm caller's SDK lets it in at its first call).
NO_TLS = ("actors.host.actor", "actors.executor.actor", "actors.broadcaster.actor",
          "actors.supervisor.actor", "actors.llm_caller.actor", "actors.offline_model.cli")


@pytest.mark.parametrize("entry", NO_TLS)
def test_an_actor_without_tls_loads_no_openssl(entry):
    # `hashlib` and `ssl` each load OpenSSL's libcrypto (~3.7 MB resident): what these
    # actors hash is short (actors/digests.py); uvloop is imported when the loop starts,
    # against stand-ins for the names of `ssl` (actors/nossl.py)
    loaded = loaded_after(f"sys.modules.setdefault('ssl', None)\nimport {entry}")
    assert entry in loaded
    assert not loaded & {"_hashlib", "_ssl", "uvloop"}, sorted(loaded & {"_hashlib", "_ssl"})


def test_the_digests_without_openssl_are_hashlibs():
    import hashlib

    from actors.digests import blake2b, sha256

    assert sha256(b"oploop").hexdigest() == hashlib.sha256(b"oploop").hexdigest()
    assert blake2b(b"oploop", digest_size=8).digest() == \
        hashlib.blake2b(b"oploop", digest_size=8).digest()


def test_the_llm_callers_sdk_runs_without_aiohttp():
    # (`python -m actors.llm_caller` keeps aiohttp out: the SDK's optional transport)
    loaded = loaded_after(
        "sys.modules.setdefault('aiohttp', None)\n"
        "import anthropic\n"
        "from actors.llm_caller.backend import AnthropicBackend\n"
        "client = anthropic.AsyncAnthropic(api_key='x', http_client="
        "anthropic.DefaultAsyncHttpxClient())\n"
        "assert client.base_url")
    assert "anthropic" in loaded
    # ("aiohttp" itself is listed: the None that keeps it out)
    assert not {m for m in loaded if m.split(".")[0] in ("aiohttp", "yarl", "multidict")
                and m != "aiohttp"}
