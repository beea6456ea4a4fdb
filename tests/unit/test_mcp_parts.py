"""The MCP parts that need no process: `[mcp.NAME]` checking, tool names, routes and
clashes, and how a `CallToolResult` becomes a tool_result (issue 18)."""

from __future__ import annotations

import re

import mcp_types as types
import pytest

from actors.config import ConfigError, parse_config
from actors.mcp.hub import McpHub, public_name
from actors.mcp.results import outcome_of
from actors.tools.spec import ToolSpec

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_a_stdio_server_is_risky_and_an_http_one_is_not_by_default():
    config = parse_config({"mcp": {
        "time": {"command": ["mcp-server-time"], "tags": ["time"]},
        "docs": {"url": "https://example.org/mcp", "headers": {"Authorization": "Bearer x"}},
    }})
    time, docs = config.mcp["time"], config.mcp["docs"]
    assert (time.transport, time.risky, time.timeout_s, time.tags) == ("stdio", True, 60.0,
                                                                       ("time",))
    assert (docs.transport, docs.risky, docs.headers) == ("http", False,
                                                          {"Authorization": "Bearer x"})
    assert time.sandbox.network == "none" and time.sandbox.write_paths == ()


@pytest.mark.parametrize(("table", "named"), [
    ({"x": {"command": "mcp-server-time"}}, "mcp.x.command: expected a list"),
    ({"x": {"command": ["mcp-server-time", 3]}}, "mcp.x.command[1]: expected str"),
    ({"x": {}}, "mcp.x: set exactly one of command"),
    ({"x": {"url": "http://a/mcp", "env": {"A": "b"}}}, "mcp.x.env: not for a server with url"),
    ({"x": {"command": ["mcp-server-time"], "headers": {}}}, "mcp.x.headers: not for"),
    ({"x": {"command": ["mcp-server-time"], "env": {"A": 1}}}, "mcp.x.env.A: expected str"),
    ({"x": {"command": ["mcp-server-time"], "cwd": "rel"}}, "mcp.x.cwd: expected an absolute"),
    ({"x": {"command": ["mcp-server-time"], "risky": "yes"}}, "mcp.x.risky: expected bool"),
    ({"x": {"command": ["mcp-server-time"], "timeout_s": 0}}, "mcp.x.timeout_s: expected 0 <"),
    ({"x": {"command": ["mcp-server-time"], "sandbox": {"write_paths": ["tmp"]}}},
     "mcp.x.sandbox.write_paths[0]: expected an absolute path"),
    ({"x": {"command": ["mcp-server-time"], "sandbox": {"ro": []}}},
     "mcp.x.sandbox.ro: unknown key"),
    ({"x": {"command": ["surely-not-installed-mcp"]}}, "mcp.x.command[0]: 'surely-not"),
    ({"a.b": {"command": ["mcp-server-time"]}}, "mcp.a.b: a server name must match"),
    ({"x": []}, "mcp.x: expected a table"),
])
def test_a_bad_table_is_refused_naming_the_key(table, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        parse_config({"mcp": table}, "oploop.toml")


def test_tool_names_are_prefixed_and_fit_the_api_pattern():
    assert public_name("time", "get_current_time") == "mcp__time__get_current_time"
    assert public_name("web", "search.docs v2") == "mcp__web__search_docs_v2"
    long = public_name("server", "x" * 80)
    assert NAME.match(long) and len(long) == 64
    assert long == public_name("server", "x" * 80)  # stable
    assert long != public_name("server", "x" * 81)  # cut names stay apart


def tool(name: str, schema: object = None) -> types.Tool:
    return types.Tool(name=name, description=f"{name} it",
                      input_schema=schema or {"type": "object", "properties": {}})


def test_clashing_or_schema_less_tools_are_left_out_and_said_so():
    config = parse_config({"mcp": {"a": {"command": ["mcp-server-time"]},
                                   "b": {"url": "http://127.0.0.1:1/mcp", "tags": ["b"]}}})
    changes = []
    hub = McpHub(config.mcp, None, lambda: changes.append(1),
                 reserved=frozenset({"mcp__a__shell"}))
    a, b = hub.servers["a"], hub.servers["b"]
    a.tools = [tool("shell"), tool("x y"), tool("x_y"), tool("bad", {"type": "string"})]
    b.tools = [tool("fetch")]
    hub._tools_changed(a)
    assert sorted(hub.routes) == ["mcp__a__x_y", "mcp__b__fetch"]
    assert hub.routes["mcp__a__x_y"] == (a, "x y")  # the first of the clashing pair
    notes = hub.left_out["a"]
    assert any("built-in" in n for n in notes) and any("clashes" in n for n in notes)
    assert any("not an object schema" in n for n in notes)
    fetch = next(s for s in hub.specs() if s.name == "mcp__b__fetch")
    assert (fetch.server, fetch.tags, fetch.risky) == ("b", ("b",), False)
    assert ToolSpec.from_wire(fetch.to_wire()) == fetch
    assert changes and hub.statuses()[0]["left_out"] == notes


def test_a_result_maps_text_images_structured_content_and_the_error_flag():
    png = {"type": "image", "data": "iVBORw0KGgo=", "mime_type": "image/png"}
    result = types.CallToolResult(content=[
        types.TextContent(text="first"), types.ImageContent(**png),
        types.AudioContent(data="AAAA", mime_type="audio/wav"),
        types.ImageContent(data="AAAA", mime_type="image/tiff"),
    ], structured_content={"n": 1}, is_error=True)
    out = outcome_of(result)
    assert out.is_error
    assert out.output.splitlines() == ["first", "[audio of type audio/wav, not shown]",
                                       "[an image of type image/tiff, not shown]", '{"n": 1}']
    assert out.images == [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]


def test_structured_content_already_said_in_text_is_not_repeated():
    same = types.CallToolResult(content=[types.TextContent(text='{"n": 1}')],
                                structured_content={"n": 1})
    assert outcome_of(same).output == '{"n": 1}'
    wrapped = types.CallToolResult(content=[types.TextContent(text="hi")],
                                   structured_content={"result": "hi"})
    assert outcome_of(wrapped).output == "hi"
    only = types.CallToolResult(content=[], structured_content={"answer": 42})
    assert outcome_of(only).output == '{"answer": 42}' and not outcome_of(only).is_error


def test_an_image_only_result_says_so_in_text():
    png = types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png")
    out = outcome_of(types.CallToolResult(content=[png]))
    assert out.output == "[1 image(s)]" and len(out.images) == 1


def test_the_readme_mcp_example_is_a_valid_configuration_and_scenario():
    import json
    import tomllib
    from pathlib import Path

    from actors.offline_model import parse_scenario

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## MCP servers", 1)[1].split("\n## ", 1)[0]
    toml = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    assert toml is not None
    config = parse_config(tomllib.loads(toml.group(1)), "README.md")
    assert sorted(config.mcp) == ["docs", "git", "time"]
    scenario = re.search(r"\$ cat time.json\n(.*?)\n\$ ", section, re.DOTALL)
    assert scenario is not None
    parse_scenario(json.loads(scenario.group(1)), "README.md")


def test_a_path_that_is_or_holds_a_hidden_one_is_refused_to_a_server(tmp_path):
    from actors.mcp.hub import overlaps

    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True)
    hidden = (str(home),)
    assert overlaps(str(home / "keys"), hidden) and overlaps(str(tmp_path), hidden)
    assert overlaps(str(home), hidden) and not overlaps(str(tmp_path / "repo"), hidden)
    with pytest.raises(ConfigError, match=r"sandbox\.write_paths\[0\]: the whole file system"):
        parse_config({"mcp": {"x": {"command": ["mcp-server-time"],
                                    "sandbox": {"write_paths": ["/"]}}}})
