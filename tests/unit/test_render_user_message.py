"""How the CLI shows a message said into a session (`USER_MESSAGE`)."""

from __future__ import annotations

import io
import json

from actors.render import Renderer


def event(kind: str, data: dict) -> dict:
    return {"seq": 1, "type": kind, "turn": 2, "ts": 0.0, "data": data, "session": "s"}


def test_a_message_is_one_line_naming_who_said_it():
    out = io.StringIO()
    render = Renderer(out=out)
    render.event(event("TOKEN", {"text": "working"}))
    render.event(event("USER_MESSAGE", {"text": "also check /var/log\nand /tmp", "by": "control"}))
    assert out.getvalue() == "working\n› control: also check /var/log …\n"


def test_json_lines_and_quiet_output():
    out = io.StringIO()
    ev = event("USER_MESSAGE", {"text": "hi", "by": "local"})
    Renderer(json_lines=True, out=out).event(ev)
    assert json.loads(out.getvalue())["data"] == {"text": "hi", "by": "local"}
    quiet = io.StringIO()
    Renderer(quiet=True, out=quiet).event(ev)
    assert quiet.getvalue() == ""  # only the final answer
