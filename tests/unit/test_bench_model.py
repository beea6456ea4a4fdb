"""The benchmark's scenario (`bench.model`) is one the offline model accepts and plays
as the `history` and `diskio` sections count on."""

from __future__ import annotations

from actors.offline_model.scenario import parse_scenario
from bench.model import STREAM_DELAY_S, STREAM_WORDS, history_scenario


def _play(scenario, session, prompt, turns):
    return [scenario.next_turn(session, prompt) for _ in range(turns)]


def test_tagged_runs_read_n_times_then_answer_and_untagged_runs_read_on():
    scenario = parse_scenario(history_scenario("/tmp/f.txt", (3,), streams=(2,)))
    played = _play(scenario, "a", "#t3 go", 4)
    assert [t.content[0]["type"] for t in played] == ["tool_use"] * 3 + ["text"]
    assert played[0].content[0]["input"] == {"path": "/tmp/f.txt"}
    stream = _play(scenario, "b", "#stream2 go", 2)
    assert stream[0].content[0]["name"] == "read_file"
    assert stream[1].delay_s == STREAM_DELAY_S
    assert len(stream[1].content[0]["text"].split()) == STREAM_WORDS
    endless = _play(scenario, "c", "go", 50)
    assert all(t.content[0]["name"] == "read_file" for t in endless)
