"""Permission rules: parsing `[agents.NAME.permissions]`, first match wins, `default` last,
and the machine refusing a `deny` call before it is run."""

from __future__ import annotations

import pytest

from actors.config import ConfigError, parse_config
from actors.core.machine import Begin, ModelReplied, RunState, RunToolCalls, Start, step
from actors.permissions import BadRule, check_tools, decide, parse_rules, rule_of_tool

TABLE = {"shell(ls *)": "allow", "write_file(/tmp/*)": "allow", "shell": "ask",
         "write_file": "deny", "default": "allow"}


def test_the_first_matching_rule_decides_and_default_catches_the_rest():
    rules = parse_rules(TABLE)
    assert decide(rules, "shell", {"command": "ls -l /"}) == ("allow", "shell(ls *)")
    assert decide(rules, "shell", {"command": "rm -rf /"}) == ("ask", "shell")
    assert decide(rules, "write_file", {"path": "/tmp/x", "content": ""}) == \
        ("allow", "write_file(/tmp/*)")
    assert decide(rules, "write_file", {"path": "/etc/x"}) == ("deny", "write_file")
    assert decide(rules, "read_file", {"path": "/etc/x"}) == ("allow", "default")
    assert decide((), "shell", {"command": "x"}) == ("allow", "")  # no rules: as always
    assert decide(rules, "shell", "not a dict") == ("ask", "shell")
    assert rule_of_tool(rules, "shell") == "allow if ls *; ask"
    assert rule_of_tool(rules, "list_dir") == "allow"


@pytest.mark.parametrize("table, where", [
    ({"shell": "maybe"}, "shell: expected one of allow, ask, deny"),
    ({"shell()": "allow"}, "shell(): an empty pattern"),
    ({"shell(ls [)": "allow"}, "unbalanced"),
    ({"default": "ask", "shell": "allow"}, "shell: never reached"),
    ({"sh ell": "allow"}, "sh ell: expected TOOL or TOOL(GLOB)"),
])
def test_a_bad_rule_is_named(table, where):
    with pytest.raises(BadRule, match=where.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        parse_rules(table)


def test_the_config_reads_rules_in_order_and_names_the_bad_key():
    config = parse_config({"agents": {"ops": {"permissions": TABLE, "approval_timeout_s": 5}}},
                          "oploop.toml")
    ops = config.agent("ops")
    assert [r[0] for r in ops.permissions] == list(TABLE)
    assert ops.approval_timeout_s == 5.0
    assert config.agent("").permissions == ()  # the built-in default: unchanged
    with pytest.raises(ConfigError, match=r"oploop.toml: agents.ops.permissions.shell: "):
        parse_config({"agents": {"ops": {"permissions": {"shell": "yes"}}}}, "oploop.toml")
    assert check_tools(parse_rules({"shel": "ask"}), {"shell"}).startswith(
        "shel: no tool named 'shel'")
    assert "takes no pattern" in check_tools(parse_rules({"web(x)": "ask"}), {"web"})


def test_a_denied_call_is_refused_by_the_machine_and_never_run():
    rules = parse_rules(TABLE)
    s, _ = step(RunState(), Start("go", 3, offered=frozenset({"write_file", "shell"}),
                                  rules=rules))
    s, _ = step(s, Begin())
    reply = {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "a", "name": "write_file", "input": {"path": "/etc/x"}},
        {"type": "tool_use", "id": "b", "name": "write_file", "input": {"path": "/tmp/x"}}]}
    s, actions = step(s, ModelReplied(reply))
    run = next(a for a in actions if isinstance(a, RunToolCalls))
    refusals = {j.call.id: j.refusal for j in run.jobs}
    assert refusals["b"] is None
    assert refusals["a"].is_error and "denied by the permission rule 'write_file'" in \
        refusals["a"].output
