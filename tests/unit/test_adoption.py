"""Adoption in the dispatcher: the jobs an executor reports in hand when it announces
itself again go to the resumed runs that wait for them (same session, call id and
machine); every other report is fenced off (aborted, or its result dropped)."""

from __future__ import annotations

import asyncio
from typing import Any

from supervisorkit import Pipe

from actors.machines import LOCAL
from actors.supervisor.dispatch import Dispatcher
from bus.messages import Abort, Envelope, JobFailed, Ready, ToolJob, ToolOutput, ToolResult


def entry(job: str, sid: str, call: str, done: bool = False) -> dict[str, Any]:
    return {"job": job, "sid": sid, "call": call, "done": done}


def ready(*running: dict[str, Any], machine: str = "") -> Envelope:
    return Envelope(Ready("tool", 4, [], machine, list(running)), id="1")


def aborted(pipe: Pipe) -> list[str]:
    return [env.job for env, _ in pipe.sent if isinstance(env.body, Abort)]


def test_a_reported_job_goes_to_the_call_that_waits_for_it_and_no_other():
    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        waiting = dispatcher.expect("s1", "call-1", LOCAL)
        elsewhere = dispatcher.expect("s3", "call-3", "m1")  # on worker machine m1
        dispatcher.handle_work(b"ex", ready(
            entry("jA", "s1", "call-1"),        # the call s1 waits for
            entry("jB", "s1", "call-9"),        # a call nobody waits for: aborted
            entry("jC", "s2", "call-1", True),  # another session's result: dropped
            entry("jD", "s3", "call-3"),        # the right call, the wrong machine
            {"job": "jE"},                      # malformed: dropped
        ), b"")
        job = waiting.result()
        assert (job.id, job.worker, job.env.sid) == ("jA", b"ex", "s1")
        assert not elsewhere.done()
        assert aborted(work) == ["jB", "jD"]
        worker = dispatcher.workers[b"ex"]
        assert worker.inflight == {"jA", "jB", "jD"}  # (aborts hold a slot until acked)
        # ... counted per session like any job it takes (what dispatch asks of it).
        assert worker.sessions == {"s1": 2, "s3": 1}
        # What comes before the run takes the job over is held for it, then its result.
        dispatcher.handle_work(b"ex", Envelope(ToolOutput("stdout", "x"), job="jA", sid="s1"),
                               b"")
        assert [e.body.text for e in job.early or ()] == ["x"]
        dispatcher.handle_work(b"ex", Envelope(ToolResult("out", False, 1.0), job="jA"), b"")
        assert job.future.result().body.output == "out"
        for jid in ("jB", "jD", "jC"):  # the aborts acknowledged; jC's late result ignored
            dispatcher.handle_work(b"ex", Envelope(JobFailed("aborted", "aborted"), job=jid),
                                   b"")
        assert worker.inflight == set() and set(dispatcher.jobs) == set()
        assert worker.sessions == {}
        # Reported again (the wait over): nobody waits now, so it is aborted.
        dispatcher.unexpect("s1", "call-1")
        dispatcher.handle_work(b"ex2", ready(entry("jA2", "s1", "call-1")), b"")
        assert aborted(work)[-1] == "jA2"

    asyncio.run(main())


def test_a_worker_that_re_announces_itself_keeps_the_jobs_it_reports():
    """A live supervisor that lost a worker for a while: the jobs it still reports go on
    (their results still reach their calls); those it does not report are lost."""

    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        dispatcher.handle_work(b"ex", ready(), b"")
        kept = dispatcher.submit("tool", ToolJob("shell", {}, call_id="c1"), sid="s1",
                                 deadline=0.0, on_progress=lambda env: None)
        lost = dispatcher.submit("tool", ToolJob("shell", {}, call_id="c2"), sid="s2",
                                 deadline=0.0, on_progress=lambda env: None)
        await asyncio.sleep(0)  # (the loop's turn is over: both are sent)
        assert [env.job for env, _ in work.sent[-2:]] == [kept.id, lost.id]
        dispatcher.handle_work(b"ex", ready(entry(kept.id, "s1", "c1")), b"")
        assert not kept.future.done()
        assert lost.future.result().body.error == "worker_died"
        dispatcher.handle_work(b"ex", Envelope(ToolResult("done", False, 1.0), job=kept.id),
                               b"")
        assert kept.future.result().body.output == "done"

    asyncio.run(main())
