"""The soak, short: sessions on a real host while its actors are SIGKILLed one by one.

The same driver and checks as `./scripts/soak` (`bench.soak`), reduced: ~30 sessions
over 10 s, one kill each of the supervisor, the broadcaster, an llm caller, an
executor and the offline model, at set times while sessions run. What is asserted
does not depend on where the kills land: every session ends with exactly one
terminal event (DONE; CANCELLED for those the driver cancels, once acknowledged),
every viewer's events are contiguous and identical (and identical to the stored
log), every actor came back, and nothing is left after `oploop down`. RSS is reported
but checked only by the script (a timing-ish figure).
"""

from __future__ import annotations

import pytest

from bench.soak import SoakConfig, soak, summary

KILLS = [(1.0, "supervisor"), (3.0, "broadcaster"), (5.0, "llm-1"), (7.0, "executor-1"),
         (9.0, "offline-model")]


@pytest.mark.timeout(300)  # a guard only: it takes ~25 s on 2 busy cores
def test_short_soak_keeps_every_invariant():
    config = SoakConfig(sessions=30, duration_s=10.0, seed=7, viewers=2, llm_callers=2,
                        executors=2, kill_plan=KILLS, rss_tolerance=None)
    rep = soak(config)
    text = summary(rep) + "\n" + rep.get("host_log_tail", "")
    assert rep["problems"] == [], text
    sessions = rep["sessions"]
    assert sessions["started"] == sessions["total"] == 30, text
    assert len(sessions["by_kind"]) == 9 and sessions["by_kind"]["cancel"] >= 3, text
    # a "cancel" session may end DONE (its tool's executor killed first): checked above
    ends = sessions["terminal"]
    assert set(ends) <= {"DONE", "CANCELLED"}, text
    assert ends.get("CANCELLED", 0) <= sessions["by_kind"]["cancel"], text
    assert [(k["actor"], k["back_s"] >= 0) for k in rep["kills"]["list"]] == [
        (name, True) for _, name in KILLS], text
    assert all(rep["restarts"][name] == 1 for _, name in KILLS), text
    assert rep["failed_actors"] == [] and rep["orphans"] == [], text
