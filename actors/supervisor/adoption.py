"""Adoption: the tool jobs an executor reports in hand when it announces itself again
(`Ready.running`), given to the resumed runs that wait for them.

After a supervisor restart, a resumed run waits for its calls in flight
(`Dispatcher.expect`, by session and call id, on the call's machine). A reported job of
that session, call and machine becomes that call's job again (`adopt`): its messages
and result go to the run as if nothing happened. Any other report is fenced off: a job
still running is aborted (`Abort` on `work`, the pipe it just came on), a result
already there is dropped; each with a log line, never given to another call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from actors.supervisor.jobstate import Job, WorkerState
from bus.errors import BusError
from bus.messages import Abort, Envelope, ToolJob

if TYPE_CHECKING:
    from bus.sockets import Port

#: What resumed runs wait for: (session, call id) -> (machine, the job's future).
Expected = dict[tuple[str, str], tuple[str, "asyncio.Future[Job]"]]

log = logging.getLogger("oploop.dispatch")

#: Jobs one `Ready` may report in hand (a bound: they come from a worker).
MAX_REPORTED = 4_096


def reported(peer: bytes, running: list[Any]) -> list[dict[str, Any]]:
    """The well-formed entries of a `Ready.running` (`{job, sid, call, done}`), at most
    `MAX_REPORTED`; a bad one is dropped and logged."""
    good = []
    for entry in running[:MAX_REPORTED]:
        if (isinstance(entry, dict) and all(isinstance(entry.get(k), str) and entry[k]
                                            for k in ("job", "sid", "call"))
                and isinstance(entry.get("done"), bool)):
            good.append({k: entry[k] for k in ("job", "sid", "call", "done")})
        else:
            log.warning("worker %r reported a bad job in hand: %.200r", peer, entry)
    return good


def adopt(jobs: dict[str, Job], expected: Expected, work: Port, worker: WorkerState,
          entries: list[dict[str, Any]]) -> None:
    """The jobs `worker` reports in hand (or over, their results following): each
    one a resumed run waits for in `expected` (its session, call and machine) is that
    call's job again, in `jobs`; any other is aborted on `work`, or its result
    dropped, and logged."""
    name = worker.id.decode(errors="replace")
    for entry in entries:
        jid, sid, call = entry["job"], entry["sid"], entry["call"]
        if jid in jobs:
            log.warning("job %s reported by %s is already another's: ignored", jid, name)
            continue
        machine, future = expected.get((sid, call), ("", None))
        env = Envelope(ToolJob("", {}, call_id=call), id=jid, sid=sid, job=jid)
        loop = asyncio.get_running_loop()
        if future is not None and not future.done() and machine == worker.machine:
            del expected[(sid, call)]
            early: list[Envelope] = []
            job = Job(jid, "tool", env, loop.create_future(), early.append,
                      worker=worker.id, dispatches=1, early=early)
            jobs[jid] = job
            worker.take(job)
            future.set_result(job)
            log.warning("adopted job %s of session %s (call %s) from %s%s", jid, sid, call,
                        name, ", over: its result follows" if entry["done"] else "")
        elif entry["done"]:
            log.warning("result of job %s (session %s, call %s) from %s dropped: no run "
                        "waits for that call", jid, sid, call, name)
        else:
            log.warning("job %s (session %s, call %s) reported by %s: no run waits for "
                        "it: aborted", jid, sid, call, name)
            job = Job(jid, "tool", env, loop.create_future(), lambda env: None,
                      worker=worker.id, dispatches=1, aborted=True)
            jobs[jid] = job  # (its slot is taken until the abort is acknowledged)
            worker.take(job)
            with contextlib.suppress(BusError):  # (on `work`: known to be connected)
                work.send(Envelope(Abort(), job=jid, sid=sid), worker.id)
