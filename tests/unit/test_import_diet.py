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


@pytest.mark.parametrize("statement", [
    "import actors.llm_caller.actor",
    # the scripted backend plays the offline model's scenarios, in process
    "import actors.llm_caller.scripted",
])
def test_the_llm_caller_does_not_load_the_offline_models_server(statement):
    loaded = loaded_after(statement)
    assert "actors.offline_model.scenario" in loaded  # the case does reach the package
    assert not loaded & OFFLINE_SERVER, sorted(loaded & OFFLINE_SERVER)


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
