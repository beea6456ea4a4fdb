"""Retention's decision, a pure function: overview + policy + now -> ids to delete."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.config import Retention
from actors.supervisor.retention import PrunePolicy, SessionOverview, select_prunable

DAY = 86_400.0
NOW = 100 * DAY


def s(sid: str, age_days: float, size: int = 10, running: bool = False) -> SessionOverview:
    last = NOW - age_days * DAY
    return SessionOverview(sid, last - 1, last, size, running)


def test_nothing_is_pruned_without_limits():
    assert select_prunable([s("a", 999), s("b", 0)], PrunePolicy(), NOW) == []


def test_age_prunes_the_idle_ones_oldest_first():
    sessions = [s("new", 1), s("old", 40), s("older", 50)]
    assert select_prunable(sessions, PrunePolicy(max_age_s=30 * DAY), NOW) == ["older", "old"]


def test_count_keeps_the_most_recently_active():
    sessions = [s("a", 3), s("b", 1), s("c", 2), s("d", 4)]
    assert select_prunable(sessions, PrunePolicy(max_sessions=2), NOW) == ["d", "a"]
    assert select_prunable(sessions, PrunePolicy(max_sessions=0), NOW) == ["d", "a", "c", "b"]


def test_bytes_drop_the_least_recent_until_the_rest_fits():
    sessions = [s("a", 1, 100), s("b", 2, 100), s("c", 3, 100)]
    assert select_prunable(sessions, PrunePolicy(max_bytes=250), NOW) == ["c"]
    assert select_prunable(sessions, PrunePolicy(max_bytes=99), NOW) == ["c", "b", "a"]
    assert select_prunable(sessions, PrunePolicy(max_bytes=300), NOW) == []


def test_a_running_session_is_never_pruned_and_counts_among_the_kept():
    sessions = [s("run", 90, 1_000, running=True), s("a", 1), s("b", 2)]
    assert select_prunable(sessions, PrunePolicy(max_age_s=DAY / 2), NOW) == ["b", "a"]
    assert select_prunable(sessions, PrunePolicy(max_sessions=2), NOW) == ["b"]
    assert select_prunable(sessions, PrunePolicy(max_sessions=0), NOW) == ["b", "a"]
    assert select_prunable(sessions, PrunePolicy(max_bytes=0), NOW) == ["b", "a"]


def test_the_rules_combine():
    sessions = [s("a", 1, 50), s("b", 2, 50), s("c", 3, 500), s("d", 60, 1)]
    policy = PrunePolicy(max_age_s=30 * DAY, max_sessions=3, max_bytes=200)
    assert select_prunable(sessions, policy, NOW) == ["d", "c"]


def test_configured_policy_reads_zero_as_no_limit_and_applies_overrides():
    r = Retention(max_age_s=0, max_sessions=0, max_bytes=0)
    assert PrunePolicy.configured(r) == PrunePolicy()
    assert PrunePolicy.configured(r, older_than_s=60, keep=0) == PrunePolicy(60, 0, None)
    assert PrunePolicy.configured(Retention()) == PrunePolicy(30 * DAY, 1000, 1 << 30)


overviews = st.lists(
    st.builds(SessionOverview, st.text("abcdef", min_size=1, max_size=4),
              st.floats(0, NOW), st.floats(0, NOW), st.integers(0, 10_000), st.booleans()),
    max_size=30, unique_by=lambda o: o.sid)
policies = st.builds(PrunePolicy, st.none() | st.floats(0, NOW), st.none() | st.integers(0, 40),
                     st.none() | st.integers(0, 100_000))


@given(overviews, policies)
def test_every_rule_holds_for_what_is_kept(sessions, policy):
    doomed = select_prunable(sessions, policy, NOW)
    by_id = {o.sid: o for o in sessions}
    kept = [o for o in sessions if o.sid not in set(doomed)]
    assert len(doomed) == len(set(doomed))
    assert not any(by_id[sid].running for sid in doomed)
    finished = [o for o in kept if not o.running]
    if policy.max_age_s is not None:
        assert all(o.last_activity >= NOW - policy.max_age_s for o in finished)
    if policy.max_sessions is not None:
        assert len(finished) <= policy.max_sessions or not finished
        assert len(kept) <= max(policy.max_sessions, sum(o.running for o in sessions))
    if policy.max_bytes is not None:
        assert sum(o.bytes for o in kept) <= policy.max_bytes or not finished
    # Nothing pruned is more recently active than something finished that was kept,
    # when only the count rule applies (it keeps the newest).
    if policy.max_age_s is None and policy.max_bytes is None and doomed and finished:
        assert max(by_id[d].last_activity for d in doomed) <= min(
            o.last_activity for o in finished)
