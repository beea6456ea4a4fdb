"""`python -m bench --against REF ...`: the same sections on REF and on this tree, side by side.

A figure measured once, on a shared machine, says little; the same figure measured on
the previous release in the same sitting says whether a change made it better or
worse. This builds REF (any commit-ish) in a worktree of its own with its own venv,
both cached under `~/.cache/oploop-bench/<commit>` (a second comparison against the
same REF starts at once), then runs the chosen sections on REF and on this tree
alternately, `--rounds` times each (so a burst of load hits both alike), and prints
every figure the two have in common: the median of each side over the rounds, and
the ratio this/REF. Figures that moved more than 10% are marked; which way is better
depends on the figure (a time or a size: lower; turns/s: higher), so the mark says
only that it moved.

Not a section: `against` has no `run`/`table`, so `discover()` does not list it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.stats import median

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "oploop-bench"

#: Leaves that describe a run rather than measure it.
_SKIP = {"elapsed_s", "started", "quick", "machine", "runs", "samples", "error"}
#: A ratio beyond this from 1 is marked as moved.
MOVED = 0.10


class AgainstError(RuntimeError):
    """REF cannot be built or run (the message says why)."""


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AgainstError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def prepare(ref: str) -> Path:
    """A worktree of `ref` with its bench venv installed (both cached); its path."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = CACHE / commit
    if not (tree / ".git").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        _git("worktree", "prune")
        _git("worktree", "add", "--detach", "--force", str(tree), commit)
    # REF's own set-up script, so REF is installed as it installed itself.
    script = ". scripts/_venv.sh bench >/dev/null"
    done = subprocess.run(["bash", "-c", script], cwd=tree, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise AgainstError(f"installing {ref} ({commit[:9]}) failed: {done.stderr[-2000:]}")
    return tree


def run_once(tree: Path, bench_args: list[str]) -> dict[str, Any]:
    """`python -m bench ARGS --json` in `tree` with its own venv; the report."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = Path(out.name)
    try:
        python = tree / ".venv" / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{tree / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        subprocess.run([str(python), "-m", "bench", *bench_args, "--json", str(path)],
                       cwd=tree, env=env, check=False)
        if path.stat().st_size == 0:
            raise AgainstError(f"the bench in {tree} wrote no results")
        report: dict[str, Any] = json.loads(path.read_text())
        return report
    finally:
        path.unlink(missing_ok=True)


def figures(report: dict[str, Any]) -> dict[str, float]:
    """Every numeric leaf of a report's sections, by its dotted path."""
    flat: dict[str, float] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if str(key) not in _SKIP:
                    walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, bool):
            return
        elif isinstance(node, int | float) and math.isfinite(node):
            flat[path] = float(node)

    walk(report.get("sections", {}), "")
    return flat


def compare(ref_runs: list[dict[str, Any]], this_runs: list[dict[str, Any]]
            ) -> list[tuple[str, float, float, float]]:
    """(figure, REF median, this median, this/REF) for every figure both sides have."""
    ref = [figures(r) for r in ref_runs]
    this = [figures(r) for r in this_runs]
    common = sorted(set().union(*ref) & set().union(*this)) if ref and this else []
    rows = []
    for key in common:
        a = median(r[key] for r in ref if key in r)
        b = median(r[key] for r in this if key in r)
        ratio = b / a if a else math.nan
        rows.append((key, a, b, ratio))
    return rows


def table(rows: list[tuple[str, float, float, float]], ref: str) -> str:
    """The side-by-side as text; moved figures marked `*`."""
    width = max((len(k) for k, *_ in rows), default=10)
    lines = [f"{'figure':<{width}}  {ref[:12]:>12}  {'this tree':>12}  {'ratio':>7}"]
    for key, a, b, ratio in rows:
        moved = "*" if not math.isnan(ratio) and abs(ratio - 1) > MOVED else " "
        lines.append(f"{key:<{width}}  {a:>12.6g}  {b:>12.6g}  {ratio:>6.2f}x{moved}")
    lines.append(f"(median of each side's rounds; ratio = this tree / {ref}; * moved > "
                 f"{MOVED:.0%}: lower is better for times and sizes, higher for rates)")
    return "\n".join(lines)


def main(ref: str, rounds: int, bench_args: list[str], json_path: Path | None) -> int:
    """Build REF, alternate the runs, print (and write) the side-by-side."""
    try:
        tree = prepare(ref)
    except AgainstError as exc:
        print(f"bench --against: {exc}", file=sys.stderr)
        return 2
    ref_runs: list[dict[str, Any]] = []
    this_runs: list[dict[str, Any]] = []
    loads = []
    for i in range(rounds):
        for name, where, runs in ((ref, tree, ref_runs), ("this tree", ROOT, this_runs)):
            print(f"\n#### round {i + 1}/{rounds}: {name}", flush=True)
            try:
                runs.append(run_once(where, bench_args))
            except AgainstError as exc:  # e.g. a section REF does not have
                print(f"bench --against: {exc}", file=sys.stderr)
                return 2
            loads.append(os.getloadavg()[0])
    rows = compare(ref_runs, this_runs)
    print(f"\n#### side by side: {ref} against this tree, {rounds} round(s) each, alternating; "
          f"load average (1 min) {min(loads):.1f}-{max(loads):.1f} during the runs")
    print(table(rows, ref))
    if json_path:
        json_path.write_text(json.dumps({
            "ref": ref, "rounds": rounds, "loads": loads, "args": bench_args,
            "rows": [{"figure": k, "ref": a, "this": b, "ratio": r} for k, a, b, r in rows],
            "ref_runs": ref_runs, "this_runs": this_runs}, indent=1, default=str))
        print(f"results written to {json_path}")
    failed = any("error" in s for r in ref_runs + this_runs for s in r["sections"].values()
                 if isinstance(s, dict))
    return 1 if failed else 0
