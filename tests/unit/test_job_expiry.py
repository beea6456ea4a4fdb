"""The supervisor's job timeouts (`workerio._Expiry`): a job not answered in time is
given `_EXPIRED` (never early, at most a tick late); one answered, or removed, is not."""

from __future__ import annotations

import asyncio

from actors.supervisor.workerio import _EXPIRED, EXPIRY_TICK_S, _Expiry


def test_a_job_expires_once_its_time_is_up_and_not_before() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        expiry = _Expiry()
        late: asyncio.Future = loop.create_future()  # type: ignore[type-arg]
        t0 = loop.time()
        expiry.add(late, 0.2)
        assert await asyncio.wait_for(late, 0.2 + EXPIRY_TICK_S + 5.0) is _EXPIRED
        return loop.time() - t0

    waited = asyncio.run(scenario())
    assert waited >= 0.2 * 0.9  # (timers may fire a hair early)


def test_an_answered_or_removed_job_is_left_alone() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        expiry = _Expiry()
        answered: asyncio.Future = loop.create_future()  # type: ignore[type-arg]
        removed: asyncio.Future = loop.create_future()  # type: ignore[type-arg]
        witness: asyncio.Future = loop.create_future()  # type: ignore[type-arg]
        expiry.add(answered, 0.05)
        expiry.remove(expiry.add(removed, 0.05), removed)
        expiry.add(witness, 0.05)  # (added last: its bucket fires at or after theirs)
        answered.set_result("reply")
        assert await asyncio.wait_for(witness, EXPIRY_TICK_S + 5.0) is _EXPIRED
        assert answered.result() == "reply"
        assert not removed.done()

    asyncio.run(scenario())
