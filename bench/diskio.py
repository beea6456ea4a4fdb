"""Disk writes per TOKEN event, at turn 1 and at turn 200 of a session.

Method. A host whose llm caller calls the offline model over HTTP (`bench.model`)
runs a session whose turn N is a streamed text answer of `STREAM_WORDS` words,
one SSE delta every 30 ms — slower than the llm caller's 20 ms batching, so
each delta becomes one TOKEN event. The turns before it each read a 20 KB
file, so at turn 200 the history holds ~4 MB. The driver's subscription sees
every TOKEN; on each one it reads `/proc/<pid>/io` of the supervisor and of
the broadcaster (the two writers of `journal.db` and `events.db`). The bytes
written between the first and the last TOKEN of the turn, divided by the
number of TOKEN events between them, is the figure:

- `wchar`: bytes the process handed to write()/pwrite() (SQLite's WAL and
  database pages; zmq's socket sends do not count, they go through send());
  the honest measure of the work done per event;
- `write_bytes`: bytes the kernel accounted to the storage layer (page-sized,
  and a page dirtied again before writeback is not counted twice, so it can
  read lower than `wchar`).

The supervisor journals an event before it publishes it, so the reading
taken on seeing a TOKEN already includes that TOKEN's commit. Goal (issue
13): the figure at turn 200 no larger than at turn 1 (constant per event).

A chat (`chat.*`): one session, `CHAT_RUNS` short runs one after the other (each
`say` starts the next: a 20 KB read, then a short answer); the supervisor's bytes
written per run, the median of the first ten runs after the first and of the last
ten. What a run writes should not grow with the runs before it.

The last TOKENs of a stream are committed with the run's end (group commit: the
end's events are urgent and take the waiting TOKENs with them), and the run's end
writes the session's compaction, whose size is the history's (~80 KB at turn 200,
~680 B spread over the turn's TOKENs). `body.*` is the same figure over the first
`BODY` of the TOKENs only: the commits that held streamed text alone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import uvloop

from bench.driver import Driver, Run
from bench.host import BenchHost, target_text
from bench.model import STREAM_WORDS, OfflineModel, history_scenario
from bench.stats import median
from bench.stats import table as text_table

#: Turns at which the streamed answer is measured.
AT_TURNS = (1, 200)
FILE_BYTES = 20 * 1024
#: Processes whose writes are read (the actors writing SQLite files).
WRITERS = ("supervisor", "broadcaster")
_FIELDS = ("wchar", "write_bytes")
#: The share of a stream's TOKENs `body.*` covers (the end's commit holds the rest).
BODY = 0.8
#: Runs of the chat (`chat.*`), and how many at each end make its figures.
CHAT_RUNS = 100
CHAT_SAMPLE = 10


def proc_io(pid: int) -> dict[str, int]:
    """`/proc/<pid>/io` as numbers."""
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = int(value)
    return out


async def _streamed_turn(driver: Driver, pids: dict[str, int], turn: int) -> dict[str, float]:
    """Start a `#stream{turn}` session; bytes per TOKEN of its streamed turn."""
    readings: list[dict[str, dict[str, int]]] = []
    session = ""

    def on_event(sid: str, ev: Any) -> None:
        if sid == session and ev.type == "TOKEN":
            readings.append({name: proc_io(pid) for name, pid in pids.items()})

    driver.observers.append(on_event)
    try:
        started = await driver.client.start(f"#stream{turn} read, then talk",
                                            max_turns=turn + 5, cwd=driver.cwd, timeout=60)
        session = started.session
        run = driver.runs.setdefault(session, Run())
        await asyncio.wait_for(run.done.wait(), 600)
    finally:
        driver.observers.remove(on_event)
    if run.terminal != "DONE" or len(readings) < 10:
        raise RuntimeError(f"stream{turn}: run ended {run.terminal} {run.stop!r} after "
                           f"{len(readings)} TOKEN events")
    driver.check_no_tool_errors([session])
    first, last = readings[0], readings[-1]
    events = len(readings) - 1
    out: dict[str, float] = {"tokens": float(len(readings))}
    body = readings[int(len(readings) * BODY)]
    body_events = int(len(readings) * BODY)
    for name in pids:
        for key in _FIELDS:
            out[f"{name}.{key}"] = (last[name][key] - first[name][key]) / events
            out[f"body.{name}.{key}"] = (body[name][key] - first[name][key]) / body_events
    return out


async def _chat(driver: Driver, pid: int) -> dict[str, float]:
    """Bytes the supervisor writes per run of a `#chat` session, early and late."""
    written: list[int] = []
    before = proc_io(pid)["wchar"]
    started = await driver.client.start("#chat read, then answer", max_turns=5,
                                        cwd=driver.cwd, timeout=60)
    run = driver.runs.setdefault(started.session, Run())
    for n in range(CHAT_RUNS):
        if n:
            run.done.clear()
            await driver.client.say(started.session, f"again ({n})")
        await asyncio.wait_for(run.done.wait(), 60)
        if run.terminal != "DONE":
            raise RuntimeError(f"chat run {n + 1} ended {run.terminal} {run.stop!r}")
        after = proc_io(pid)["wchar"]
        written.append(after - before)
        before = after
    driver.check_no_tool_errors([started.session])
    return {"chat.early": median(written[1:1 + CHAT_SAMPLE]),
            "chat.late": median(written[-CHAT_SAMPLE:])}


async def _measure(host: BenchHost, repeats: int, workdir: Path) -> dict[str, Any]:
    state = host.state() or {}
    pids = {a["name"]: a["pid"] for a in state.get("actors", []) if a["name"] in WRITERS}
    out: dict[str, Any] = {}
    # The runs work where the file is (the sandbox shows them their working directory,
    # not the host's /tmp: elsewhere every read fails).
    async with Driver(host.home, cwd=workdir) as driver:
        for turn in AT_TURNS:
            samples = [await _streamed_turn(driver, pids, turn) for _ in range(repeats)]
            out[str(turn)] = {k: median(s[k] for s in samples) for k in samples[0]}
            out[str(turn)]["samples"] = samples
        out["chat"] = await _chat(driver, pids["supervisor"])
    return out


def run(quick: bool) -> dict[str, Any]:
    """Bytes written per TOKEN event by the supervisor and the broadcaster."""
    repeats = 1 if quick else 3
    workdir = Path(tempfile.mkdtemp(prefix="oploop-bench-diskio-"))
    try:
        target = workdir / "target.txt"
        target.write_text(target_text(FILE_BYTES))
        scenario = history_scenario(str(target), (), streams=AT_TURNS, chat=CHAT_RUNS)
        with OfflineModel(workdir, scenario) as model, \
                BenchHost(backend="http", base_url=model.url) as host:
            result = uvloop.run(_measure(host, repeats, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"turns": result, "words": STREAM_WORDS, "repeats": repeats,
            "loadavg": list(os.getloadavg())}


def table(result: dict[str, Any]) -> str:
    """Bytes per TOKEN event by writer, at each turn."""
    rows = []
    chat = result["turns"].get("chat")
    for turn, figs in result["turns"].items():
        if turn == "chat":
            continue
        for name in WRITERS:
            rows.append([f"turn {turn}: {name}", f"{figs[f'{name}.wchar']:,.0f} B",
                         f"{figs[f'{name}.write_bytes']:,.0f} B"])
        total = sum(figs[f"{name}.wchar"] for name in WRITERS)
        rows.append([f"turn {turn}: both", f"{total:,.0f} B", f"({figs['tokens']:.0f} TOKENs)"])
        if "body.supervisor.wchar" in figs:
            rows.append([f"turn {turn}: supervisor, first {BODY:.0%} of the TOKENs",
                         f"{figs['body.supervisor.wchar']:,.0f} B",
                         f"{figs['body.supervisor.write_bytes']:,.0f} B"])
    if chat:
        rows.append([f"chat: supervisor per run, runs 2-{1 + CHAT_SAMPLE}",
                     f"{chat['chat.early']:,.0f} B", ""])
        rows.append([f"chat: supervisor per run, last {CHAT_SAMPLE} of {CHAT_RUNS}",
                     f"{chat['chat.late']:,.0f} B", ""])
    load = " ".join(f"{x:.2f}" for x in result["loadavg"])
    return (text_table(["bytes per TOKEN event", "wchar", "write_bytes"], rows)
            + f"\n(median of {result['repeats']} streamed turns; load average {load})")
