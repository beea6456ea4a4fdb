"""The MCP parts of issue 30 that need no process: a stdio server's command as the
sandbox can run it (npm installs, npx, uvx), what a server's program needs to read, an
HTTP error's status and whether it lost our session, content for the user only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mcp_types as types
import pytest

from actors.config import ConfigError, parse_config
from actors.mcp.errors import HttpStatus, http_cause, lost_session
from actors.mcp.hub import runtime_paths
from actors.mcp.installed import NotRunnable, runnable
from actors.mcp.results import outcome_of


def npm_tree(root: Path, package: str = "@acme/server-notes") -> Path:
    """What `npm install PACKAGE` leaves in `root`: the package with a `bin`, and the
    `.bin` link to it. Returns the program."""
    folder = root / "node_modules" / package
    (folder / "dist").mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps(
        {"name": package, "bin": {"mcp-server-notes": "dist/index.js"}}))
    program = folder / "dist" / "index.js"
    program.write_text("#!/usr/bin/env node\n")
    program.chmod(0o755)
    (root / "node_modules" / ".bin").mkdir()
    (root / "node_modules" / ".bin" / "mcp-server-notes").symlink_to(
        f"../{package}/dist/index.js")
    return program


def test_npx_of_a_package_installed_in_the_servers_cwd_runs_its_program(tmp_path):
    program = npm_tree(tmp_path)
    assert runnable(("npx", "-y", "@acme/server-notes@1.2", "--flag"), str(tmp_path)) == (
        str(program), "--flag")


def test_npx_of_a_globally_installed_package_runs_its_program(tmp_path):
    # npm's own layout: bin/npx -> lib/node_modules/npm/bin/npx-cli.js, and the global
    # packages beside npm in lib/node_modules
    prefix = tmp_path / "usr"
    cli = prefix / "lib" / "node_modules" / "npm" / "bin" / "npx-cli.js"
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/usr/bin/env node\n")
    cli.chmod(0o755)
    (prefix / "bin").mkdir()
    (prefix / "bin" / "npx").symlink_to(cli)
    program = npm_tree(prefix / "lib")
    assert runnable((str(prefix / "bin" / "npx"), "-y", "@acme/server-notes")) == (
        str(program),)


def test_npx_of_a_package_not_installed_and_uvx_are_refused_with_the_fix(tmp_path):
    with pytest.raises(NotRunnable, match=r"npm install -g @acme/missing.*then point "
                                          r"command at"):
        runnable(("npx", "-y", "@acme/missing"), str(tmp_path))
    with pytest.raises(NotRunnable, match=r"pip install mcp-server-fetch.*then point "
                                          r"command at"):
        runnable(("uvx", "mcp-server-fetch"))
    with pytest.raises(NotRunnable, match="uvx fetches"):
        runnable(("uv", "tool", "run", "mcp-server-sqlite"))
    assert runnable(("mcp-server-time", "--x")) == ("mcp-server-time", "--x")


def test_oploop_toml_refuses_what_would_fetch_packages_naming_the_key():
    with pytest.raises(ConfigError, match=r"mcp\.f\.command: uvx fetches"):
        parse_config({"mcp": {"f": {"command": ["uvx", "mcp-server-fetch"]}}})


def test_a_program_of_an_npm_package_may_read_its_whole_node_modules(tmp_path):
    program = npm_tree(tmp_path)
    link = tmp_path / "node_modules" / ".bin" / "mcp-server-notes"
    for given in (link, program):
        assert str(tmp_path / "node_modules") in runtime_paths(str(given))


def test_a_venvs_console_script_may_read_its_venv_and_its_python(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python3"
    python.symlink_to(os.path.realpath("/usr/bin/python3"))
    script = venv / "bin" / "mcp-server-fetch"
    script.write_text(f"#!{python}\nimport sys\n")
    assert str(venv) in runtime_paths(str(script))


def status_of(code: int, reason: str, said: str = "") -> HttpStatus:
    status = HttpStatus()
    status.code, status.reason, status.said = code, reason, said
    status._at = __import__("time").monotonic()
    return status


def test_a_lost_session_is_told_from_other_errors():
    sdk_404 = types.ErrorData(code=-32600, message="Session terminated")
    generic = types.ErrorData(code=-32603, message="Server returned an error response")
    assert lost_session(sdk_404, status_of(404, "Not Found"))
    assert lost_session(generic, status_of(400, "Bad Request",
                                           "Bad Request: No valid session ID provided"))
    assert not lost_session(generic, status_of(400, "Bad Request", "invalid params"))
    assert not lost_session(generic, status_of(401, "Unauthorized"))
    assert not lost_session(types.ErrorData(code=-32602, message="bad arguments"),
                            HttpStatus())


def test_an_http_error_says_its_status_and_what_to_do():
    generic = types.ErrorData(code=-32603, message="Server returned an error response")
    said = http_cause(generic, status_of(401, "Unauthorized"), "docs")
    assert said.startswith("unauthorized: check headers or run `oploop mcp login docs` "
                           "(HTTP 401 Unauthorized"), said
    assert http_cause(generic, status_of(503, "Service Unavailable")).startswith(
        "HTTP 503 Service Unavailable (error -32603")
    assert http_cause(generic, HttpStatus()) == ("error -32603: Server returned an error "
                                                 "response")


def test_content_for_the_user_only_is_kept_from_the_model():
    result = types.CallToolResult(content=[
        types.TextContent(text="for you", annotations=types.Annotations(audience=["user"])),
        types.TextContent(text="for both",
                          annotations=types.Annotations(audience=["user", "assistant"])),
        types.TextContent(text="for the model", annotations=types.Annotations(
            audience=["assistant"])),
        types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png",
                           annotations=types.Annotations(audience=["user"])),
    ])
    out = outcome_of(result)
    assert out.output.splitlines() == ["for both", "for the model"]
    assert out.shown.splitlines() == ["for you", "[an image of type image/png, not shown]"]
    assert out.images == []
