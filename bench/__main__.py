"""`python -m bench [--quick] [--json PATH] [--section NAME ...] [--against REF [--rounds N]]`:
run the benchmark (with `--against`, on REF and on this tree alternately, side by side)."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import bench
from bench.stats import machine

#: Sections in report order; modules written later (sandbox, fanout, ...) join if present.
SECTIONS = ("floor", "turns", "throughput", "memory", "startup", "sandbox", "netproxy", "fanout",
            "curve", "history", "growth", "diskio", "idle", "context")

_HELPERS = {"stats", "host", "driver", "peers", "model", "against"}


def discover() -> dict[str, ModuleType]:
    """Every section module of the package: those named in SECTIONS first."""
    names = [m.name for m in pkgutil.iter_modules(bench.__path__)
             if not m.name.startswith("_") and m.name not in _HELPERS]
    ordered = [n for n in SECTIONS if n in names] + sorted(n for n in names if n not in SECTIONS)
    found = {}
    for name in ordered:
        module = importlib.import_module(f"bench.{name}")
        if callable(getattr(module, "run", None)) and callable(getattr(module, "table", None)):
            found[name] = module
    return found


def floor_multiples(sections: dict[str, Any]) -> dict[str, float]:
    """oploop's per-turn figures over the bus round trip measured in the same run."""
    floor, turns = sections.get("floor", {}), sections.get("turns", {})
    rtt = floor.get("rtt_p50_s")
    mine = turns.get("systems", {}).get("oploop")
    if not rtt or not mine or "error" in mine:
        return {}
    return {f"oploop turn p50 at {n} turns": mine[n]["p50_s"] / rtt for n in ("20", "200")}


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections; print tables; write JSON. Exit 1 if a section failed."""
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="every section reduced (< 3 min)")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--section", action="append", metavar="NAME",
                        help="run only this section (repeatable)")
    parser.add_argument("--against", metavar="REF",
                        help="also run on git REF (built once in a cached worktree), "
                             "alternating, and print each figure side by side with the ratio")
    parser.add_argument("--rounds", type=int, default=2,
                        help="with --against: runs of each side (default 2)")
    args = parser.parse_args(argv)
    sections = discover()
    chosen = args.section or list(sections)
    unknown = [n for n in chosen if n not in sections]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; have {', '.join(sections)}")
    if args.against:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        from bench import against

        passed = (["--quick"] if args.quick else []) + [
            a for name in (args.section or ()) for a in ("--section", name)]
        return against.main(args.against, args.rounds, passed, args.json)
    report: dict[str, Any] = {"quick": args.quick, "started": time.time(),
                              "machine": machine(), "sections": {}}
    print(f"oploop bench{' --quick' if args.quick else ''}: {report['machine']['cores']} cores, "
          f"load average {' '.join(f'{x:.2f}' for x in report['machine']['loadavg'])}")
    failed = False
    for name in chosen:
        t0 = time.perf_counter()
        try:
            result = sections[name].run(args.quick)
            text = sections[name].table(result)
        except Exception as exc:  # one broken section must not lose the others' figures
            failed = True
            result = {"error": f"{type(exc).__name__}: {exc}"}
            text = f"FAILED: {result['error']}\n{traceback.format_exc()}"
        elapsed = time.perf_counter() - t0
        result["elapsed_s"] = elapsed
        report["sections"][name] = result
        print(f"\n== {name} ({elapsed:.1f} s)\n{text}", flush=True)
    summary = floor_multiples(report["sections"])
    if summary:
        report["floor_multiples"] = summary
        print("\n== as multiples of the floor (bus round trip p50)")
        for name, value in summary.items():
            print(f"  {name}: {value:.1f}x")
    report["machine"]["loadavg_end"] = list(machine()["loadavg"])
    print(f"\nload average at the end: "
          f"{' '.join(f'{x:.2f}' for x in report['machine']['loadavg_end'])}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
