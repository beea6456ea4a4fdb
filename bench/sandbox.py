"""Sandbox benchmark: per-call overhead of a sandboxed `true`, each layer's share,
kill-to-gone time for a 7-process tree, and the confined `read_file`/`list_dir`
against the unconfined ones.

`run(quick)` returns the figures as a dict (the ./scripts/bench harness calls it);
`python -m bench.sandbox [--quick]` prints the table. Goals (issue 5): full stack
≤ 30 ms p50 per call, a killed tree gone ≤ 50 ms p99; (issue 15) the shell's full
stack ≤ 10 ms p50, a confined read ≤ 3 ms p50 over an unconfined one (on the
session's persistent reader; a fresh reader's row shows a session's first read).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.sandbox import (
    LAYERS,
    Policy,
    Sandbox,
    SandboxConfig,
    bwrap,
    layers_report,
    modes,
    release_all,
)
from actors.tools import Catalogue, ToolContext, invoke, make_list_dir, make_read_file
from actors.tools.builtin import LIST_CAP, READ_CAP
from actors.tools.process import Spawner, run_command, spawn_local

GOAL_CALL_P50_MS = 30.0
GOAL_GONE_P99_MS = 50.0
GOAL_SHELL_P50_MS = 10.0
GOAL_READ_ADDED_P50_MS = 3.0

# Layers switched on one group at a time, in the launcher's order, to show each share.
_STEPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("launcher, no layer", frozenset()),
    ("+ setsid, pdeathsig, rlimits", frozenset({"setsid", "pdeathsig", "rlimits"})),
    ("+ cgroup (join, limits)", frozenset({"cgroup", "cgroup_kill"})),
    ("+ namespaces (mnt net ipc uts pid)", frozenset({"namespaces"})),
    ("+ uid, no_new_privs", frozenset({"uid", "no_new_privs"})),
    ("+ landlock", frozenset({"landlock"})),
    ("+ seccomp (full stack)", frozenset({"seccomp"})),
)

_TREE = (
    "sleep 600 & sleep 600 & sleep 600 & (sleep 600 &) ; "
    "( setsid sh -c 'trap \"\" TERM; sleep 600 & exec sleep 600' & ) ; "
    "exec sleep 600"
)
"""3 sleeps, a double-forked sleep, a setsid'd TERM-ignoring sh (its sleep and the exec'd
sleep it becomes), and the shell itself exec'd into a sleep: 7 tool processes."""
_TREE_SIZE = 7


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(samples), 2),
        "p99": round(_pct(samples, 0.99), 2),
        "n": len(samples),
    }


async def _time_calls(spawn: Spawner, cwd: Path, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = await run_command("true", cwd, timeout_s=30, cap=4096, spawn=spawn)
        out.append((time.perf_counter() - t0) * 1000)
        if res.returncode != 0 or res.refused:
            raise RuntimeError(f"benchmark call failed: {res}")
    return out


async def _time_read(catalogue: Catalogue, name: str, ctx: ToolContext[None],
                     sandbox: Sandbox | None = None) -> float:
    """One tool call as the executor makes it (invoke), in milliseconds; with `sandbox`,
    on a fresh reader (its readers are retired first, untimed): a session's first read."""
    path = "/etc/hostname" if name == "read_file" else "/etc"
    if sandbox is not None:
        sandbox.readers.close()
    t0 = time.perf_counter()
    out = await invoke(catalogue, name, {"path": path}, ctx)
    elapsed = (time.perf_counter() - t0) * 1000
    if out.is_error:
        raise RuntimeError(f"benchmark {name} failed: {out.output}")
    return elapsed


def _readers(sandbox: Sandbox) -> dict[str, tuple[Catalogue, str, Sandbox | None]]:
    confined = Catalogue([make_read_file(sandbox.file_reader(READ_CAP)),
                          make_list_dir(sandbox.dir_lister(LIST_CAP))])
    unconfined = Catalogue([make_read_file(), make_list_dir()])
    # "confined": the session's persistent reader, reused (the steady state of a
    # session); "fresh reader": a reader started for the call (a session's first read).
    return {
        "read_file unconfined": (unconfined, "read_file", None),
        "read_file confined": (confined, "read_file", None),
        "read_file confined, fresh reader": (confined, "read_file", sandbox),
        "list_dir unconfined": (unconfined, "list_dir", None),
        "list_dir confined": (confined, "list_dir", None),
    }


async def _kill_to_gone(sandbox: Sandbox, policy: Policy, cwd: Path, n: int) -> list[float]:
    out = []
    for _ in range(n):
        child = await sandbox.launch("shell", policy, cwd, argv=["/bin/sh", "-c", _TREE])
        cgroup = child.cgroup
        assert cgroup is not None, "kill-to-gone needs the cgroup layer"
        await _until(lambda cg=cgroup: len(cg.pids()) >= _TREE_SIZE + 2)  # + launcher, init
        t0 = time.perf_counter()
        child.kill()
        await child.process.wait()
        await child.aclose()
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def _until(cond: Callable[[], bool], bound_s: float = 10.0) -> None:
    deadline = time.monotonic() + bound_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("tree did not start")
        await asyncio.sleep(0.002)


def _in_mode(sandbox: Sandbox, view: modes.WorkView) -> Spawner:
    """The full stack's shell in a sandbox mode (issue 26): the calls run in `view`."""
    inner = sandbox.spawner("shell", Policy())

    async def spawn(command: str, cwd: Path) -> Any:
        with modes.using(view):
            return await inner(command, Path(view.cwd))

    return spawn


#: The rows of the shell's full stack in each mode (the last layer step is scratch's).
_MODE_ROWS = {modes.WORKSPACE_WRITE: "full stack, workspace-write",
              modes.READ_ONLY: "full stack, read-only"}


async def _measure(quick: bool) -> dict[str, Any]:
    n = 15 if quick else 60
    home = Path(tempfile.mkdtemp(prefix="opb-", dir="/tmp"))
    os.chmod(home, 0o711)  # passable by the tool uid, for the bwrap backend's row
    sandbox = Sandbox(SandboxConfig(), home / "workspaces", hide=(home,))
    sandbox.start()
    project = Path(tempfile.mkdtemp(prefix="opbp-", dir="/tmp"))
    try:
        cwd = sandbox.workspace("bench")
        load_before = os.getloadavg()[0]
        spawners: dict[str, Spawner] = {"unsandboxed (sh -c true)": spawn_local}
        on: set[str] = set()
        for name, group in _STEPS:
            on |= group
            spawners[name] = sandbox.spawner("shell", Policy(off=frozenset(set(LAYERS) - on)))
        # A project owned by an ordinary user (nobody), as a user's would be.
        os.chown(project, 65534, 65534)
        for mode, row in _MODE_ROWS.items():
            spawners[row] = _in_mode(sandbox, sandbox.view(mode, str(project), "bench"))
        if bwrap.find()[0]:
            spawners["bwrap backend (full stack)"] = sandbox.spawner(
                "shell", Policy(backend="bwrap")
            )
        samples: dict[str, list[float]] = {name: [] for name in spawners}
        readers = _readers(sandbox)
        ctx: ToolContext[None] = ToolContext(cwd=cwd, workspace=cwd)
        read_samples: dict[str, list[float]] = {name: [] for name in readers}
        for spawn in spawners.values():
            await _time_calls(spawn, cwd, 2)  # warm caches
        for catalogue, tool, fresh in readers.values():
            await _time_read(catalogue, tool, ctx, fresh)
        # Round-robin, one call of each configuration per round: the machine's noise
        # (it is shared) then falls on every configuration alike.
        for _ in range(n):
            for name, spawn in spawners.items():
                samples[name] += await _time_calls(spawn, cwd, 1)
            for _ in range(3):  # the reads are short: three samples a round
                for name, (catalogue, tool, fresh) in readers.items():
                    read_samples[name].append(await _time_read(catalogue, tool, ctx, fresh))
        per_call = {name: _summary(ts) for name, ts in samples.items()}
        reads = {name: _summary(ts) for name, ts in read_samples.items()}
        read_added = round(reads["read_file confined"]["p50"]
                           - reads["read_file unconfined"]["p50"], 2)
        by_mode = {modes.SCRATCH: per_call[_STEPS[-1][0]]["p50"]}
        by_mode.update({mode: per_call[row]["p50"] for mode, row in _MODE_ROWS.items()})
        shell_p50 = max(by_mode.values())
        gone = _summary(await _kill_to_gone(sandbox, Policy(), cwd, max(10, n // 2)))
        return {
            "machine": {
                "cpus": os.cpu_count(),
                "load_1m_before": round(load_before, 2),
                "load_1m_after": round(os.getloadavg()[0], 2),
            },
            "layers": layers_report(),
            "per_call_ms": per_call,
            "layer_share_ms": _shares(per_call),
            "kill_to_gone_7_ms": gone,
            "reads_ms": reads,
            "goals": {
                "read_added_p50_ms": read_added,
                "read_added_goal_ms": GOAL_READ_ADDED_P50_MS,
                "read_met": read_added <= GOAL_READ_ADDED_P50_MS,
                "shell_p50_goal_ms": GOAL_SHELL_P50_MS,
                "shell_p50_by_mode_ms": by_mode,
                "shell_met": shell_p50 <= GOAL_SHELL_P50_MS,
                "full_stack_p50_ms": GOAL_CALL_P50_MS,
                "full_stack_overhead_p50_ms": round(
                    per_call[_STEPS[-1][0]]["p50"] - per_call["unsandboxed (sh -c true)"]["p50"], 2
                ),
                "tree_gone_p99_ms": GOAL_GONE_P99_MS,
                "met": per_call[_STEPS[-1][0]]["p50"] <= GOAL_CALL_P50_MS
                and gone["p99"] <= GOAL_GONE_P99_MS,
            },
        }
    finally:
        sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)


def _shares(per_call: dict[str, dict[str, float]]) -> dict[str, float]:
    """p50 added by each step over the previous one (the first over an unsandboxed call)."""
    names = [n for n in per_call
             if not n.startswith("bwrap") and n not in _MODE_ROWS.values()]
    return {
        names[i]: round(per_call[names[i]]["p50"] - per_call[names[i - 1]]["p50"], 2)
        for i in range(1, len(names))
    }


def run(quick: bool) -> dict[str, Any]:
    """Measure and return the figures (milliseconds); `quick` takes fewer samples."""
    result: dict[str, Any] = asyncio.run(_measure(quick))
    return result


def table(result: dict[str, Any]) -> str:
    """The figures of `run` as a printable table."""
    lines = [
        f"sandbox benchmark — {result['machine']['cpus']} cpus, load(1m) "
        f"{result['machine']['load_1m_before']} → {result['machine']['load_1m_after']}",
        "",
        f"{'per call of `true`':40} {'p50 ms':>8} {'p99 ms':>8} {'share':>8}",
    ]
    shares = result["layer_share_ms"]
    for name, s in result["per_call_ms"].items():
        share = f"{shares[name]:+.2f}" if name in shares else ""
        lines.append(f"{name:40} {s['p50']:8.2f} {s['p99']:8.2f} {share:>8}")
    g = result["kill_to_gone_7_ms"]
    lines += ["", f"{'per call of a file tool (invoke)':40} {'p50 ms':>8} {'p99 ms':>8}"]
    for name, s in result["reads_ms"].items():
        lines.append(f"{name:40} {s['p50']:8.2f} {s['p99']:8.2f}")
    goals = result["goals"]
    lines += [
        "",
        f"{'kill → 7-process tree gone':40} {g['p50']:8.2f} {g['p99']:8.2f}",
        "",
        f"read_file confined adds {goals['read_added_p50_ms']:.2f} ms p50 (goal ≤ "
        f"{GOAL_READ_ADDED_P50_MS:g}): {'met' if goals['read_met'] else 'NOT met'}; "
        f"shell full stack p50 goal ≤ {GOAL_SHELL_P50_MS:g} ms in every mode ("
        + ", ".join(f"{m} {v:.2f}" for m, v in goals["shell_p50_by_mode_ms"].items())
        + f"): {'met' if goals['shell_met'] else 'NOT met'}",
        "",
        f"goals: full stack p50 ≤ {GOAL_CALL_P50_MS:g} ms, tree gone p99 ≤ "
        f"{GOAL_GONE_P99_MS:g} ms: {'met' if result['goals']['met'] else 'NOT met'}",
        "",
        "layers on this machine:",
    ]
    lines += [f"  {layer:14} {state}" for layer, state in result["layers"].items()]
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.sandbox [--quick]`: measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    print(table(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
