"""A session's title and times (`core/timeline.py`), and how the CLI shows them
(`cli/listing.py`): the fold of its events, the same live and from a snapshot."""

from __future__ import annotations

from actors.cli import listing
from actors.core.timeline import TITLE_CHARS, Timeline, title_of


def test_the_title_is_the_first_prompt_on_one_line_cut():
    assert title_of("  check\nthe   disk ") == "check the disk"
    long = title_of("x" * 500)
    assert len(long) == TITLE_CHARS and long.endswith("…")
    assert title_of(None) == ""


def test_runs_add_up_and_a_follow_up_keeps_the_first_title():
    t = Timeline()
    t.apply("SESSION_START", {"prompt": "first"}, 100.0)
    t.apply("TOKEN", {"text": "x"}, 101.0)
    t.apply("DONE", {}, 104.5)
    t.apply("SESSION_START", {"prompt": "second"}, 200.0)
    assert (t.title, t.run_started, t.ended, t.busy_s) == ("first", 200.0, 104.5, 4.5)
    t.apply("CANCELLED", {"mode": "ui"}, 201.0)
    assert (t.ended, t.busy_s) == (201.0, 5.5)
    assert Timeline.from_state(t.to_state()) == t
    assert Timeline.from_state(None) == Timeline()  # an older snapshot: none kept
    assert Timeline.from_state(["t", "x", 1, 2]) == Timeline()


def test_the_cli_shows_times_for_people():
    now = 1_800_000_000.0
    assert listing.ago(now - 5, now) == "5 s ago"
    assert listing.ago(now - 600, now) == "10 min ago"
    assert listing.ago("DONE", now) == "" and listing.ago(None, now) == ""
    assert listing.took(0.25) == "250 ms" and listing.took(75) == "1 min 15 s"
    running = {"state": "running", "duration_s": 10.0, "run_started": now - 5}
    assert listing.run_time(running, now) == 15.0
    assert listing.run_time({**running, "state": "idle"}, now) == 10.0
    lines = listing.table([
        {"session": "old", "state": "idle", "agent": "a", "started": now - 90, "turns": 2,
         "usage": {"input_tokens": 1200, "output_tokens": 30, "cost_usd": 0.012},
         "title": "the first"},
        {"session": "new", "state": "running", "agent": "a", "started": now - 3, "turns": 1,
         "run_started": now - 3, "usage": None, "title": "y" * 100}], now)
    assert lines[0].split() == list(listing.COLUMNS)
    assert lines[1].startswith("new ") and lines[1].endswith("y" * 59 + "…")
    assert lines[2].split() == ["old", "idle", "a", "2", "min", "ago", "0", "ms", "2",
                                "1.2k", "$0.01", "the", "first"]
