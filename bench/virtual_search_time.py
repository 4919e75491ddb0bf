"""Wall and CPU time of `tunectl search --virtual` (the stand-in's virtual-clock model, no processes), as a user
runs it, for one or more checkouts side by side (e.g. before and after a change: `git archive REF | tar -x -C DIR`).

Runs alternate between the checkouts (A, B, A, B, ...) so that each sees the same load on a shared host; each run
is a fresh results folder. The table gives the median and range of wall and CPU seconds per checkout, the load
average around the runs, and the winner each found (the same seed must find the same winner: the storage and
caching are mechanics, not the search).

    python bench/virtual_search_time.py [--trials 40] [--runs 3] [--checkout DIR ...] [--profile PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(checkout: Path, trials: int, profile: str | None) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "tunectl.cli", "search", "--virtual", "--trials", str(trials), "--json",
               "--results", str(Path(tmp) / "results")] + (["--profile", profile] if profile else [])
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        load0 = os.getloadavg()[0]
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        res = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if res.returncode != 0:
            raise SystemExit(f"{checkout}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
        best = json.loads(res.stdout)["best"] or {}
    return {"wall": wall, "cpu": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
            "load": max(load0, os.getloadavg()[0]),
            "winner": f"trial {best.get('trial')} {best.get('value', 0):,.1f}"}


def _span(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--checkout", action="append", help="[LABEL=]DIR, a source tree (default: this one)")
    ap.add_argument("--profile", help="profile YAML (default: the embedded default)")
    args = ap.parse_args()
    trees = [c.rpartition("=")[::-2] for c in (args.checkout or [str(ROOT)])]         # (dir, label)
    checkouts = {label or Path(d).resolve().name: Path(d).resolve() for d, label in trees}
    runs: dict[str, list[dict[str, float | str]]] = {c: [] for c in checkouts}
    for i in range(args.runs):
        for label, tree in checkouts.items():
            runs[label].append(one_run(tree, args.trials, args.profile))
            print(f"  run {i + 1}/{args.runs} {label}: {runs[label][-1]['wall']:.1f} s", file=sys.stderr)
    print(f"tunectl search --virtual --trials {args.trials}, {args.runs} runs each, {os.cpu_count()} CPUs")
    print(f"{'checkout':<24} {'wall s median (range)':>24} {'CPU s median (range)':>24} {'load':>10}  winner")
    for c, rs in runs.items():
        winners = sorted({str(r["winner"]) for r in rs})
        loads = [float(r["load"]) for r in rs]
        print(f"{c:<24} {_span([float(r['wall']) for r in rs]):>24} {_span([float(r['cpu']) for r in rs]):>24}"
              f" {min(loads):4.1f}-{max(loads):<4.1f}  {' | '.join(winners)}")


if __name__ == "__main__":
    main()
