"""Group commit of streamed text (issue 28 item 5): TOKENs share a commit, and still
nothing is published before it is in the session log.

In process, on the same real `Supervisor` and journal as `test_backfill` (`Host`): what
the supervisor pushes is collected, and the log is read through a second connection,
as a supervisor restarted after a kill -9 would read it.
"""

from __future__ import annotations

import asyncio
import time

from test_backfill import SID, Host, pushed_seqs

from actors.sessionlog import SessionLog
from actors.supervisor.actor import TOKEN_COMMIT_S
from bus.messages import Envelope, RunStarted

WAIT_S = 10.0  # a bound on waits that went wrong, never a timing under test


def logged(host: Host) -> list[int]:
    """The seqs a fresh reader of the log finds (what survives the supervisor's death)."""
    log = SessionLog(host.journal.path, reserve_mb=0, readonly=True)
    try:
        return [r.seq for r in log.records(SID)]
    finally:
        log.close()


def test_tokens_wait_for_more_and_any_other_event_commits_them_with_it(short_home):
    async def scenario() -> None:
        host = Host(short_home)
        try:
            host.emit("SESSION_START")
            await asyncio.sleep(0)
            assert pushed_seqs(host.pushed) == [1]
            host.pushed.clear()
            commits = host.journal.commits
            for _ in range(5):
                host.emit("TOKEN")
                await asyncio.sleep(0)
            # Not committed yet, so not published: a viewer has seen nothing of them.
            assert host.journal.commits == commits and host.pushed == []
            assert logged(host) == [1]
            host.emit("TURN_END")  # not streamed text: commits now, the TOKENs with it
            await asyncio.sleep(0)
            assert host.journal.commits == commits + 1
            assert pushed_seqs(host.pushed) == [2, 3, 4, 5, 6, 7]
            assert logged(host) == [1, 2, 3, 4, 5, 6, 7]
        finally:
            host.close()

    asyncio.run(scenario())


def test_a_lone_token_is_committed_and_published_within_the_group_window(short_home):
    async def scenario() -> float:
        host = Host(short_home)
        try:
            host.emit("SESSION_START")
            await asyncio.sleep(0)
            host.pushed.clear()
            started = time.monotonic()
            host.emit("TOKEN")
            async with asyncio.timeout(WAIT_S):  # (the commit's timer publishes it)
                while not host.pushed:
                    await asyncio.sleep(0.01)
            waited = time.monotonic() - started
            assert pushed_seqs(host.pushed) == [2] and logged(host) == [1, 2]
            return waited
        finally:
            host.close()

    assert asyncio.run(scenario()) >= TOKEN_COMMIT_S * 0.9  # (timers may fire a hair early)


def test_a_reply_waiting_for_the_commit_does_not_wait_for_more_tokens(short_home):
    async def scenario() -> None:
        host = Host(short_home)
        sent: list[Envelope] = []
        host.supervisor.api.reply = lambda env, peer: sent.append(env) or True  # type: ignore[method-assign]
        try:
            host.emit("SESSION_START")
            await asyncio.sleep(0)
            host.emit("TOKEN")
            reply = Envelope(RunStarted(SID, 1, 1), id="r")
            host.supervisor.reply_committed(reply, b"client")
            assert sent == []  # it follows the commit of what was emitted before it
            await asyncio.sleep(0)
            assert sent == [reply] and logged(host) == [1, 2]
        finally:
            host.close()

    asyncio.run(scenario())
