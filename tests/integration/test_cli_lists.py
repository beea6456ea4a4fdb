"""The CLI as a user lists and follows sessions (issue 33): `sessions` with a header and
the web list's columns, `inspect` with readable times, one line and exit 1 for an
unknown actor or session, `up`/`down` when there is nothing to do, "did you mean",
`watch` following later runs until Ctrl-C, and no traceback for a Ctrl-C however
early it comes.

Real processes throughout: `oploop` commands against a host started with
`oploop up --detach` (the offline model), Ctrl-C through a pseudo-terminal.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import test_cli_edges as edges
from hostkit import OPLOOP, WAIT_S, cli_env, events_of, oploop, running_host

from actors.cli.listing import COLUMNS
from actors.usage import Usage, money, short_count

#: Where oploop's own code lives: a traceback through it would be ours.
OURS = tuple(str(Path(__file__).resolve().parents[2] / d) for d in ("actors", "bus"))
DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+ (s|min) ago\)"


def _sid(home: str, prompt: str) -> str:
    done = oploop(home, "run", "--json", prompt)
    assert done.returncode == 0, done.stderr
    return str(events_of(done.stdout)[0]["session"])


def test_sessions_has_a_header_and_the_web_lists_columns_and_inspect_readable_times(
        short_home):
    with running_host(short_home):
        first = _sid(short_home, "run `echo the first one`")
        second = _sid(short_home, "run `echo the second one`")
        table = oploop(short_home, "sessions")
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split() == list(COLUMNS)
        assert [r.split()[0] for r in rows] == [second, first]  # newest first
        cells = rows[0].split()
        assert cells[1:3] == ["idle", "default"]
        assert re.fullmatch(r"\d+ s ago", " ".join(cells[3:6])), cells  # started
        assert re.fullmatch(r"\d+(\.\d)? (ms|s)", " ".join(cells[6:8])), cells  # duration
        summary = json.loads(oploop(short_home, "sessions", "--json").stdout.splitlines()[0])
        usage = Usage.from_dict(summary["usage"])
        assert cells[8:11] == [str(summary["turns"]), short_count(usage.tokens),
                               money(usage.cost)], cells
        assert rows[0].endswith("run `echo the second one`")
        # Columns line up under the header.
        assert rows[0].index("idle") == header.index("STATE")

        text = oploop(short_home, "inspect", first)
        assert text.returncode == 0, text.stderr
        lines = dict(re.findall(r"^  (\S+(?: \S+)*?)\s{2,}(.*)$", text.stdout, re.M))
        assert lines["title"] == "run `echo the first one`"
        assert re.fullmatch(DATE, lines["started"]), text.stdout
        assert re.fullmatch(DATE, lines["last run ended"]), text.stdout
        assert lines["ended by"] == "DONE"
        assert "created" not in text.stdout and not re.search(r"\d{10}\.\d", text.stdout)


def test_unknown_actor_or_session_is_one_line_and_exit_1(short_home):
    with running_host(short_home, {"OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}):
        sid = _sid(short_home, "run `echo hi`")
        logs = oploop(short_home, "logs", "nosuchactor")
        assert logs.returncode == 1 and logs.stdout == ""
        assert logs.stderr.count("\n") == 1 and "nosuchactor" in logs.stderr, logs.stderr
        for actor in ("supervisor", "llm_caller", "gateway"):
            assert oploop(short_home, "logs", actor).returncode == 0
        web = oploop(short_home, "web", "nosuch", "--no-open")
        assert web.returncode == 1 and web.stdout == ""
        assert web.stderr.count("\n") == 1 and "nosuch" in web.stderr, web.stderr
        known = oploop(short_home, "web", sid, "--no-open")
        assert known.returncode == 0 and f"/s/{sid}" in known.stdout, known.stderr


def test_up_on_a_running_host_and_down_with_none_say_so_and_exit_0(short_home):
    with running_host(short_home):
        again = oploop(short_home, "up", "--detach")
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stdout
    none = oploop(short_home, "down")
    assert none.returncode == 0, none.stderr
    assert "no host is running" in none.stdout


@pytest.mark.parametrize(("args", "meant"), [
    (("sesions",), "'sessions'"),
    (("sessions", "--josn"), "'--json'"),
    (("watch", "S", "--no-folow"), "'--no-follow'"),
    (("cancel", "S", "--mode", "opration"), "'operation'"),
    (("sessions", "prune", "--olde-than", "1d"), "'--older-than'"),
])
def test_did_you_mean(short_home, args, meant):
    done = oploop(short_home, *args)
    assert done.returncode == 2
    assert f"did you mean {meant}?" in done.stderr, done.stderr
    edges._no_traceback(done.stderr)


def test_watch_follows_later_runs_until_ctrl_c_and_no_follow_ends_after_the_replay(
        short_home):
    with running_host(short_home):
        sid = _sid(short_home, "run `echo first-run`")
        replay = oploop(short_home, "watch", "--no-follow", sid)
        assert replay.returncode == 0 and "first-run" in replay.stdout, replay.stderr
        viewer = edges.Terminal(short_home, "watch", sid)
        viewer.expect("following its next run")  # the replay is over: it stays
        said = oploop(short_home, "say", sid, "run `echo second-run`")
        assert said.returncode == 0, said.stderr
        viewer.expect("second-run")
        viewer.expect("following its next run")
        viewer.ctrl_c()
        assert viewer.finish() == 130, viewer.text()
        edges._no_traceback(viewer.text())


@pytest.mark.parametrize("delay_ms", [20, 60, 120, 200, 300, 450])
def test_ctrl_c_at_any_moment_of_start_up_prints_no_traceback(short_home, delay_ms):
    # `sessions` with no host: imports, parsing, then "no host is running". A SIGINT
    # after `delay_ms` lands somewhere in that (on a loaded machine, earlier in it).
    proc = subprocess.Popen([*OPLOOP, "sessions"], env=cli_env(short_home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay_ms / 1000)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT_S)
    if "Fatal Python error: init" in err or "Could not import runpy module" in err:
        return  # inside CPython's own start-up, before any of oploop's code
    lost = edges.LOST_IN_IMPORTER.match(err)
    if lost:  # dropped by CPython before oploop ran: the command runs on, no host is found
        err = err[lost.end():]
        edges._no_traceback(out + err)
        assert proc.returncode == 1 and "no host is running" in err, (proc.returncode, err)
        return
    frames = re.findall(r'^  File "([^"]+)"', err, re.M)
    if frames and not any(f.startswith(OURS) for f in frames):
        # Still finding the module to run (runpy, importlib, a .pth's finder), before
        # the first line of oploop (`actors/__init__.py`): the interpreter's own report,
        # a moment that a loaded machine stretches. Nothing of oploop ran.
        assert err.rstrip().endswith("KeyboardInterrupt"), err
        return
    edges._no_traceback(out + err)
    # -2: killed by the signal before Python took SIGINT over (a shell shows 130 too).
    assert proc.returncode in (130, 1, -signal.SIGINT), (proc.returncode, err)
