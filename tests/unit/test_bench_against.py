"""`bench --against`: the figures two reports share, side by side (pure parts)."""

from __future__ import annotations

import math

from bench.against import compare, figures, table


def _report(turns_per_s: float, p50: float) -> dict:
    return {"quick": True, "machine": {"cores": 2}, "sections": {
        "throughput": {"elapsed_s": 9.0, "oploop": {"100": {"turns_per_s": turns_per_s}},
                       "runs": [{"x": 1}], "note": "text is not a figure", "ok": True},
        "turns": {"p50_s": p50, "error": "kept out"}}}


def test_figures_are_the_numeric_leaves_of_the_sections_by_path():
    assert figures(_report(250.0, 0.003)) == {
        "throughput.oploop.100.turns_per_s": 250.0, "turns.p50_s": 0.003}


def test_compare_takes_each_sides_median_and_the_ratio():
    ref = [_report(200, 0.004), _report(300, 0.002), _report(250, 0.003)]
    this = [_report(500, 0.003), _report(600, 0.003)]
    rows = {k: (a, b, r) for k, a, b, r in compare(ref, this)}
    assert rows["throughput.oploop.100.turns_per_s"] == (250, 550, 2.2)
    a, b, r = rows["turns.p50_s"]
    assert (a, b) == (0.003, 0.003) and math.isclose(r, 1.0)


def test_only_shared_figures_are_compared_and_moved_ones_marked():
    ref = [{"sections": {"a": {"x": 1.0, "old": 2.0}}}]
    this = [{"sections": {"a": {"x": 1.5, "new": 3.0}}}]
    rows = compare(ref, this)
    assert [k for k, *_ in rows] == ["a.x"]
    text = table(rows, "939a901")
    assert "1.50x*" in text and "old" not in text and "new" not in text
