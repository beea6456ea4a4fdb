"""Permission rules judge what a call does (issue 27 item 1): paths as the tool opens
them, shell lines as the simple commands they run. The table holds every case of the
issue's attack, each of which slipped through the raw-string matching before."""

from __future__ import annotations

import os

import pytest

from actors.config import parse_config
from actors.permissions import check_tools, decide, parse_rules, refusal_here, rule_of_tool
from actors.permissions.paths import lexical, real
from actors.permissions.shell import parse

#: The rules of the attack: the README's `shell(ls *)`, a deny on `rm`, the rest asked.
ATTACK = parse_rules({
    "read_file(/etc/passwd)": "deny",
    "list_dir(/etc/ssl*)": "deny",
    "write_file(/tmp/*)": "allow",
    "write_file(/etc/*)": "deny",
    "shell(ls *)": "allow",
    "shell(git status*)": "allow",
    "shell(rm *)": "deny",
    "shell": "ask",
})
CWD = "/home/u/proj"

PATHS = [
    ("read_file", "/etc/passwd", "deny"),
    ("read_file", "/etc//passwd", "deny"),
    ("read_file", "/etc/./passwd", "deny"),
    ("read_file", "/usr/../etc/passwd", "deny"),
    ("read_file", "/proc/self/root/etc/passwd", "deny"),
    ("read_file", "/proc/1/root/etc/passwd", "deny"),
    ("read_file", "/proc/self/root/proc/self/root/etc/passwd", "deny"),
    ("read_file", "../../../etc/passwd", "deny"),  # against the session's cwd
    ("read_file", "/proc/self/cwd/../../../etc/passwd", "deny"),
    ("read_file", "//etc/passwd", "deny"),
    ("read_file", "/etc/hosts", "allow"),
    ("read_file", "notes.txt", "allow"),
    ("list_dir", "/etc//ssl", "deny"),
    ("list_dir", "/etc/ssl/certs/..", "deny"),
    ("list_dir", "/etc", "allow"),
    ("write_file", "/tmp/x", "allow"),
    ("write_file", "/tmp/../etc/x", "deny"),
    ("write_file", "/tmp/./y", "allow"),
]

COMMANDS = [
    ("ls -la", "allow"),
    ("ls", "allow"),  # `ls *` also names ls alone
    ("ls; ls -l /tmp", "allow"),
    ("(ls) && { ls -a; }", "allow"),
    ("ls 2>/dev/null >&2", "allow"),
    ("for f in a b; do ls $f; done", "allow"),
    ("ls > /tmp/out.txt", "allow"),  # a write write_file(/tmp/*) allows
    ("nice -n 5 ls", "allow"),
    ("git status --short", "allow"),
    ("ls /; echo INJECTED > proof.txt; cat proof.txt", "ask"),
    ("ls $(echo x; echo SUBST-RAN >&2)", "ask"),
    ("ls `echo x`", "ask"),
    ("ls <(echo x)", "ask"),
    ("ls | sort", "ask"),
    ("ls && echo done", "ask"),
    ("ls || echo failed", "ask"),
    ("ls & echo bg", "ask"),
    ("ls > proof.txt", "ask"),  # a write no write_file rule names: the plain shell rule
    ("ls >> $OUT", "ask"),
    ("ls 'unclosed", "ask"),
    ("$CMD -rf /", "ask"),
    ("$(echo rm) -rf /", "ask"),
    ("eval \"$x\"", "ask"),
    ("bash -c \"$x\"", "ask"),
    ("echo rm -rf / | sh", "ask"),
    ("bash script.sh", "ask"),
    ("PATH=/tmp/evil ls", "ask"),
    ("LD_PRELOAD=/tmp/x.so ls", "ask"),
    ("r? -rf /", "ask"),
    ("env -S 'rm -rf /'", "ask"),
    ("git status; git push", "ask"),
    ("ls > /etc/motd", "deny"),
    (" rm -rf /", "deny"),
    ("\\rm -rf /", "deny"),
    ("'r'm -rf /", "deny"),
    ("\"rm\" -rf /", "deny"),
    ("/bin/rm -rf /", "deny"),
    ("command rm x", "deny"),
    ("builtin rm x", "deny"),
    ("exec rm x", "deny"),
    ("sudo -u root rm x", "deny"),
    ("env A=1 rm x", "deny"),
    ("timeout -s KILL 5 rm x", "deny"),
    ("find . -name '*.o' | xargs rm", "deny"),
    ("nice rm x", "deny"),
    ("ls; rm x", "deny"),
    ("ls && rm x", "deny"),
    ("ls $(rm x)", "deny"),
    ("ls `rm x`", "deny"),
    ("diff <(rm x) /dev/null", "deny"),
    ("(cd /; rm x)", "deny"),
    ("{ ls; rm x; }", "deny"),
    ("f() { rm -rf /; }; ls", "deny"),
    ("if ls; then rm x; fi", "deny"),
    ("while true; do rm x; done", "deny"),
    ("case $1 in a) rm x;; esac", "deny"),
    ("eval 'rm -rf /'", "deny"),
    ("bash -c 'ls; rm -rf /'", "deny"),
    ("sh -lc \"rm x\"", "deny"),
    ("echo \"$(rm x)\"", "deny"),
    ("cat <<EOF\n$(rm x)\nEOF\n", "deny"),
    ("trap 'rm -rf /' EXIT", "deny"),
    ("rm", "deny"),
    ("r\\\nm -rf /", "deny"),  # bash joins a line continuation before reading words
    ("coproc rm x", "deny"),
    ("! rm x", "deny"),
    ("ls |& rm x", "deny"),
    ("ls ${x:-$(rm y)}", "deny"),
    ("a=$(rm x)", "deny"),
    ("ls > >(rm x)", "deny"),
    ("cat <<< $(rm x)", "deny"),
    ("x=rm; $x -rf /", "ask"),
    ("ls \\\n -l", "allow"),
    ("ls #; rm x", "allow"),  # a comment
    ("ls \\; rm x", "allow"),  # an escaped `;` is an argument of ls
]


#: Lines where tree-sitter's reading and dash's (`/bin/sh -c`) differed, or where a
#: command ran code the walk did not see (the second review's bypasses: each was
#: `allow` before, and dash ran the hidden command).
BYPASSES = [
    # 1. A word that swallows the newline after it: one `ls` to the grammar, two to dash.
    ("ls ==\nrm -rf ~/proj", "ask"),
    ("ls =~\nrm -rf ~/proj", "ask"),
    ("ls <$\nrm -rf ~/proj", "ask"),
    ("ls 2<$\nrm -rf ~/proj", "ask"),
    ("ls $\\ \nrm -rf ~/proj", "ask"),
    # 2. `$'...'` is one word to bash and the grammar; dash has no ANSI-C quoting.
    ("ls $'\\' ; rm -rf ~/proj ; #'", "ask"),
    # 3. \r \v \f are blanks to the grammar (a comment follows), not to a shell.
    ("ls a\r#; rm -rf ~/proj", "ask"),
    ("ls a\v#; rm -rf ~/proj", "ask"),
    ("ls a\f#; rm -rf ~/proj", "ask"),
    # 4. env -S inside a cluster of options, or as a long option written out or abridged.
    ("env -S'rm -rf x' ls", "ask"),
    ("env -iS'rm -rf x' ls", "ask"),
    ("env --split-string='rm -rf x' ls", "ask"),
    ("env --split='rm -rf x' ls", "ask"),
    # 5. A `>` inside `[ ]` is a redirection to dash; `[[` is no keyword of dash.
    ("ls; [ x > /home/u/.bashrc ]", "ask"),
    ("ls; [[ x > /home/u/.bashrc ]]", "ask"),
    ("(( x > 2 )); ls", "ask"),
    # 6. `> 5` writes the file 5 (only `>&5` is a descriptor).
    ("ls > 5", "ask"),
    ("ls &> 5", "ask"),
    # 7. A quoted or escaped NAME= in export is an assignment all the same.
    ("ls; export 'PATH=.'; ls", "ask"),
    ("ls; export \"LD_PRELOAD=/tmp/x.so\"; ls", "ask"),
    ("ls; export 'BASH_ENV=/tmp/x'; ls", "ask"),
    ("ls; export PA\\TH=.; ls", "ask"),
    # 8. Variables that make an allowed command run code.
    ("GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.fsmonitor GIT_CONFIG_VALUE_0='touch PWN'"
     " git status", "ask"),
    ("GIT_EXTERNAL_DIFF=/tmp/x git status", "ask"),
    ("env GIT_SSH_COMMAND='rm x' git status", "ask"),
    ("export GIT_PAGER='rm x'; git status", "ask"),
    ("for PATH in /tmp; do ls; done", "ask"),
    ("read PATH < f; ls", "ask"),
    # Wrapper options as getopt reads them: a value attached to a cluster, an abridged
    # long option, each once took the next word for the command.
    ("sudo -Eu root rm x", "deny"),
    ("timeout --sig KILL 5 rm x", "deny"),
    ("nice --adj 5 rm x", "deny"),
    # A program of the project's named by its path is not the command of that name.
    ("./ls -la", "ask"),
    ("bin/ls", "ask"),
    ("/usr/bin/../../home/u/proj/ls", "ask"),
    ("./rm x", "deny"),
]

#: The deny-list rules (`rm` denied, the rest allowed) and what got past them.
DENY_LIST = parse_rules({"shell(rm *)": "deny"})
DENY_LIST_BYPASSES = [
    "echo rm x | xargs env",
    "echo rm x | xargs nice",
    "echo rm x | xargs timeout 5",
    "echo '\"rm x\"' | xargs sh -c",
    "echo rm | xargs -I X X y",
    "alias x='rm v'\nx",
    "git -c core.fsmonitor='rm x' status",
    "git --config-env=core.fsmonitor=CMD status",
    "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.fsmonitor GIT_CONFIG_VALUE_0='touch PWN'"
    " git status",
    "GIT_CONFIG_COUNT=1; export GIT_CONFIG_COUNT; git status",
    "set -a; GIT_SSH_COMMAND='rm x'; git fetch",
    # The third review's: a substitution the grammar reads as a plain word, or in a
    # heredoc body it never parses (`<<-`).
    "ls \"${x:-`rm -rf ~`}\"",
    "ls ${x:-`rm -rf ~`}",
    "ls ${x#`rm -rf ~`}",
    "ls <<-E\n\t$(rm -rf ~)\n\tE",
    "ls <<-E\n\t`rm -rf ~`\n\tE",
]

#: What users rely on stays allowed under the attack's rules.
STILL_ALLOWED = [
    "ls -la *.py",
    "git status --short",
    "ls | ls",
    "ls |\n ls",
    "ls <<EOF\n$HOME\nEOF\n",
    "ls <<'EOF'\nrm x\nEOF\n",
    "ls 2>&1 >&2",
    "ls >&2 2>/dev/null",
    "[ -d /tmp ] && ls /tmp",
    "LANG=C ls",
    "n=1; ls -$n",
    "export LC_ALL=C; ls",
    "ls | xargs ls -l",
    "ls \\\n -l",
    "ls '\n'",
    "ls \"a\nb\"",
    "ls <<-'E'\n\t$(rm x)\n\tE",
    "ls <<-E\n\tplain\n\tE",
    "ls '`rm x`'",
    "/bin/ls -l",
    "/usr/bin/git status",
]


@pytest.mark.parametrize("line, expected", BYPASSES)
def test_where_the_grammar_and_dash_differ_the_line_is_not_allowed(line, expected):
    assert decide(ATTACK, "shell", {"command": line}, CWD)[0] == expected


@pytest.mark.parametrize("line", DENY_LIST_BYPASSES)
def test_a_deny_list_asks_what_runs_code_it_cannot_see(line):
    assert decide(DENY_LIST, "shell", {"command": line}, CWD)[0] == "ask"


@pytest.mark.parametrize("line", STILL_ALLOWED)
def test_the_lines_users_rely_on_are_still_allowed(line):
    assert decide(ATTACK, "shell", {"command": line}, CWD)[0] == "allow"


def test_a_shell_write_through_a_symlink_is_judged_where_it_lands(tmp_path):
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", tmp_path / "lnk")
    rules = parse_rules({f"write_file({tmp_path}/secret/*)": "deny",
                         f"write_file({tmp_path}/*)": "allow",
                         "shell(ls *)": "allow", "shell": "ask"})
    call = {"command": "ls > lnk/x"}
    assert decide(rules, "shell", call, str(tmp_path))[0] == "allow"  # the name
    refusal = refusal_here(rules, "shell", call, str(tmp_path))
    assert refusal is not None and "denied by the permission rule" in refusal
    assert f"resolves to {tmp_path}/secret/x" in refusal
    assert refusal_here(rules, "shell", {"command": "ls > y"}, str(tmp_path)) is None


@pytest.mark.parametrize("tool, path, expected", PATHS)
def test_a_path_is_judged_as_the_tool_opens_it(tool, path, expected):
    assert decide(ATTACK, tool, {"path": path}, CWD)[0] == expected


@pytest.mark.parametrize("line, expected", COMMANDS)
def test_a_command_line_is_judged_by_every_simple_command_in_it(line, expected):
    assert decide(ATTACK, "shell", {"command": line}, CWD)[0] == expected


def test_the_table_is_large_enough():
    assert len(PATHS) + len(COMMANDS) >= 40


def test_the_part_that_decided_is_named():
    assert decide(ATTACK, "shell", {"command": "ls; \\rm x"}, CWD) == ("deny", "shell(rm *)")
    assert decide(ATTACK, "shell", {"command": "$X"}, CWD) == \
        ("ask", "undecided: the command name $X is expanded")
    assert decide(ATTACK, "shell", {"command": "ls > /etc/x"}, CWD) == \
        ("deny", "write_file(/etc/*)")


def test_the_parser_names_the_commands_and_writes():
    parsed = parse("ls /etc//x | sudo -u a rm -f 'a b' > out 2>/dev/null", CWD)
    assert [c.text for c in parsed.commands] == ["ls /etc/x", "sudo -u a rm -f a b",
                                                 "rm -f a b"]
    assert parsed.writes == [f"{CWD}/out"]
    assert parsed.undecided == []


def test_a_shell_with_no_pattern_rule_is_judged_whole():
    # Nothing judges parts (no shell pattern, no write_file rule): as before, undecidable
    # lines included (`shell = allow` allows every line, as written).
    rules = parse_rules({"shell": "allow", "read_file(/etc/*)": "deny"})
    assert decide(rules, "shell", {"command": "eval \"$x\""}) == ("allow", "shell")
    rules = parse_rules({"read_file(/etc/*)": "deny"})
    assert decide(rules, "shell", {"command": "$X"}) == ("allow", "")


def test_a_deny_list_still_asks_what_it_cannot_see():
    rules = parse_rules({"shell(rm *)": "deny"})  # everything else allowed
    assert decide(rules, "shell", {"command": "ls | wc -l"})[0] == "allow"
    assert decide(rules, "shell", {"command": "echo x > f"})[0] == "allow"
    assert decide(rules, "shell", {"command": "$X -rf /"})[0] == "ask"
    assert decide(rules, "shell", {"command": "echo rm -rf / | bash"})[0] == "ask"


def test_mcp_wildcards_cover_a_servers_present_and_future_tools():
    config = parse_config({"agents": {"ops": {"permissions": {
        "mcp__git__git_status": "allow", "mcp__git__*": "deny"}}}}, "oploop.toml")
    rules = config.agent("ops").permissions
    assert decide(rules, "mcp__git__git_status", {}) == ("allow", "mcp__git__git_status")
    assert decide(rules, "mcp__git__git_commit", {}) == ("deny", "mcp__git__*")
    assert decide(rules, "mcp__git__added_later", {}) == ("deny", "mcp__git__*")
    assert decide(rules, "mcp__time__now", {}) == ("allow", "")
    assert decide(rules, "mcp__gitx__y", {}) == ("allow", "")
    assert rule_of_tool(rules, "mcp__git__git_log") == "deny"
    assert check_tools(rules, {"read_file", "mcp__git__*", "mcp__git__git_status"}) is None
    assert "no tool named 'mcp__nope__*'" in check_tools(
        parse_rules({"mcp__nope__*": "deny"}), {"read_file"})


def test_lexical_paths():
    assert lexical("/etc//./ssl/../passwd") == "/etc/passwd"
    assert lexical("/proc/self/root") == "/"
    assert lexical("/proc/thread-self/root/etc") == "/etc"
    assert lexical("x/../../y", "/a/b") == "/a/y"
    assert lexical("/proc/self/cwd/x", "/a") == "/a/x"
    assert lexical("x/../y") == "y"  # no cwd: relative, normalised


def test_the_executor_follows_symlinks_before_it_runs_a_call(tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("k")
    os.symlink(tmp_path / "secret", tmp_path / "innocent")
    rules = parse_rules({f"read_file({tmp_path}/secret/*)": "deny",
                         f"list_dir({tmp_path}/secret*)": "ask"})
    call = {"path": "innocent/key"}
    assert decide(rules, "read_file", call, str(tmp_path))[0] == "allow"  # the name
    assert real("innocent/key", str(tmp_path)) == f"{tmp_path}/secret/key"
    refusal = refusal_here(rules, "read_file", call, str(tmp_path))
    assert refusal is not None and "denied by the permission rule" in refusal
    assert f"resolves to {tmp_path}/secret/key" in refusal
    refusal = refusal_here(rules, "list_dir", {"path": "innocent"}, str(tmp_path))
    assert refusal is not None and "makes ask" in refusal
    # Asked and approved by its real name: runs.
    assert refusal_here(rules, "list_dir", {"path": f"{tmp_path}/secret"}, "/") is None
    assert refusal_here(rules, "read_file", {"path": "other"}, str(tmp_path)) is None


def test_the_readmes_rules_and_table_as_written():
    import re
    import tomllib
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    toml = re.search(r"```toml\n(\[models\].*?)```", readme, re.DOTALL)
    assert toml is not None
    rules = parse_config(tomllib.loads(toml.group(1)), "README.md").agent("ops").permissions
    section = readme.split("**Permission rules judge what a call does**", 1)[1]
    table = section.split("What the parser cannot decide", 1)[0]
    rows = re.findall(r"^\| `(\w+)` `(.+?)` \| (\w+) \|$", table, re.MULTILINE)
    assert len(rows) >= 8
    for tool, value, expected in rows:
        key = "command" if tool == "shell" else "path"
        assert decide(rules, tool, {key: value}, CWD)[0] == expected, (tool, value)
