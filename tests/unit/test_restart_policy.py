"""The host's restart policy: backoff, its reset after a stable run, the storm cap."""

from __future__ import annotations

import pytest

from actors.restarts import RestartPolicy


def test_backoff_doubles_up_to_the_cap():
    policy = RestartPolicy(base_s=0.1, cap_s=0.5, storm=100, window_s=30.0)
    delays = [policy.on_death(now=float(i), ran_s=0.5) for i in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5, 0.5])


def test_a_stable_run_resets_the_backoff():
    policy = RestartPolicy(base_s=0.1, storm=100, stable_s=10.0)
    for i in range(3):
        policy.on_death(now=float(i), ran_s=1.0)
    assert policy.on_death(now=3.0, ran_s=1.0) == pytest.approx(0.8)
    assert policy.on_death(now=20.0, ran_s=15.0) == pytest.approx(0.1)
    assert policy.on_death(now=21.0, ran_s=1.0) == pytest.approx(0.1)
    assert policy.on_death(now=22.0, ran_s=1.0) == pytest.approx(0.2)


def test_a_storm_within_the_window_means_failed():
    policy = RestartPolicy(storm=5, window_s=30.0)
    delays = [policy.on_death(now=float(i), ran_s=0.5) for i in range(5)]
    assert all(d is not None for d in delays[:4])
    assert delays[4] is None


def test_deaths_spread_beyond_the_window_never_make_a_storm():
    policy = RestartPolicy(storm=3, window_s=10.0)
    # Two deaths per window at most: restarted forever.
    assert all(policy.on_death(now=6.0 * i, ran_s=6.0) is not None for i in range(20))


def test_the_window_slides():
    policy = RestartPolicy(storm=3, window_s=10.0)
    assert policy.on_death(now=0.0, ran_s=1.0) is not None
    assert policy.on_death(now=9.0, ran_s=1.0) is not None
    assert policy.on_death(now=10.5, ran_s=1.0) is not None  # 0.0 has left the window
    assert policy.on_death(now=11.0, ran_s=0.5) is None       # 9.0, 10.5, 11.0
