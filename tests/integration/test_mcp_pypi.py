"""Two more PyPI servers nobody here wrote, installed as docs/mcp.md says (a virtualenv
of its own each, from PyPI, by the test): `mcp-server-sqlite` (it needs `mcp<2`: with the
newest SDK it crashes at its start) on a database in a folder its uid may write, and
`mcp-server-fetch` reaching a loopback page through the host's proxy (a network
allowlist; its HTML extraction's JavaScript installed with it: it would run `npm
install` at its first use otherwise, which fails in the sandbox). Inside the executor's
sandbox, driven by sessions whose offline model calls their tools: the tools from the
first turn, the sqlite server's resource (`memo://insights`) through `read_resource`,
its prompt through `oploop prompts`."""

from __future__ import annotations

import http.server
import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from homes import make_home
from hostkit import of_type, oploop, run, running_host
from mcpkit import call, venv_server

from actors.sandbox.workspaces import remove_home

pytestmark = pytest.mark.timeout(900)

PAGE = b"<html><body><h1>Hello from loopback</h1><p>fetched through the proxy</p></body></html>"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """A page on loopback: what the fetch server's allowlist names."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def host(web: int) -> Iterator[str]:
    sqlite = venv_server("mcp-server-sqlite", "mcp<2")
    # Its HTML extraction (readabilipy) runs `npm install` at its first use when node is
    # there and its JavaScript is not: no network then, in the sandbox; done at install.
    fetch = venv_server("mcp-server-fetch", setup="from readabilipy.utils import "
                        "run_npm_install; run_npm_install()")
    data = Path(tempfile.mkdtemp(prefix="opmp-db-", dir="/tmp"))
    data.chmod(0o777)  # the server's uid writes the database there
    home = make_home("opmp-")
    Path(home, "oploop.toml").write_text(f"""
[mcp.sqlite]
command = ["{sqlite}", "--db-path", "{data}/shop.db"]
start_timeout_s = 90
[mcp.sqlite.sandbox]
write_paths = ["{data}"]

[mcp.fetch]
command = ["{fetch}", "--ignore-robots-txt", "--allow-private-ips"]  # (a loopback page)
network = ["127.0.0.1:{web}"]
start_timeout_s = 90
""")
    scripts = {
        "create": call("mcp__sqlite__create_table",
                       query="CREATE TABLE fruit (name TEXT, price REAL)"),
        "insert": call("mcp__sqlite__write_query",
                       query="INSERT INTO fruit VALUES ('apple', 1.5), ('pear', 2.25)"),
        "select": call("mcp__sqlite__read_query",
                       query="SELECT name, price FROM fruit ORDER BY price DESC"),
        "memo": call("mcp__sqlite__read_resource", uri="memo://insights"),
        "fetch": call("mcp__fetch__fetch", url=f"http://127.0.0.1:{web}/"),
    }
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": scripts}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as h:
            yield h
    finally:
        remove_home(Path(home))
        shutil.rmtree(data, ignore_errors=True)


def output(home: str, prompt: str) -> str:
    (end,) = of_type(run(home, prompt), "TOOL_END")
    server = end["data"]["name"].split("__")[1]
    assert not end["data"]["is_error"], (  # (with what the server said on its stderr)
        end["data"]["output"] + oploop(home, "logs", f"mcp:{server}").stdout[-3000:])
    return end["data"]["output"]


def test_their_tools_are_offered_from_the_first_turn(host):
    listed = oploop(host, "tools", "--json")
    names = {json.loads(line)["name"] for line in listed.stdout.splitlines() if line.strip()}
    assert {"mcp__sqlite__read_query", "mcp__sqlite__write_query",
            "mcp__sqlite__read_resource", "mcp__fetch__fetch"} <= names, names


def test_mcp_server_sqlite_writes_and_reads_a_database(host):
    assert output(host, "#create") == "Table created successfully"
    output(host, "#insert")
    rows = output(host, "#select")
    assert rows.index("pear") < rows.index("apple") and "2.25" in rows, rows


def test_mcp_server_sqlite_resource_and_prompt(host):
    assert "No business insights have been discovered yet" in output(host, "#memo")
    prompts = oploop(host, "prompts")
    assert prompts.returncode == 0, prompts.stderr
    assert "sqlite/mcp-demo topic=" in prompts.stdout, prompts.stdout


def test_mcp_server_fetch_reaches_a_page_through_the_proxy(host):
    text = output(host, "#fetch")
    assert "Hello from loopback" in text and "fetched through the proxy" in text, text
