"""How the CLI shows the shared store's outage in a session (`STORE_UNAVAILABLE`,
`STORE_AVAILABLE`: `actors/supervisor/outage.py`)."""

from __future__ import annotations

import io

from actors.render import Renderer


def event(kind: str, data: dict) -> dict:
    return {"seq": 1, "type": kind, "turn": 1, "ts": 0.0, "data": data, "session": "s"}


def test_the_wait_and_the_return_are_one_line_each():
    out = io.StringIO()
    render = Renderer(out=out)
    render.event(event("TOKEN", {"text": "working"}))
    render.event(event("STORE_UNAVAILABLE", {"error": "cannot connect", "since": 1.0}))
    render.event(event("STORE_AVAILABLE", {"since": 1.0, "down_s": 2.25}))
    assert out.getvalue() == (
        "working\n⏸ the store was unavailable: the session waited (cannot connect)\n"
        "▶ the store is back after 2.2 s: the session goes on\n")
