"""Measurement noise on the embedded default: the same config on fresh launches, on a quiet host and on a host with
one busy-loop process per core running beside it.

Prints, per level: the steady throughput of each launch with its 95% interval, the launch-to-launch spread
((max - min) / mean; goal <= 3% quiet, <= 5% loaded), the virtual model's reading and the live-vs-virtual gap
(goal: within 5%, or the level flagged), and the levels flagged (client-bound, capped, a client/server
disagreement). Then the seeds' config (which crashes with page_table_1_flattened) on `--crash-runs` launches under
load: its crash class and level each time (goal: the same class every time, at 256 or 512).

Usage: python bench/measurement_noise.py [--launches 3] [--crash-runs 5] [--scenarios quiet,loaded]
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# the stand-in this script launches runs this checkout's code too, not whichever tunectl is installed
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

from tunectl.profile import default_profile_path, load_profile  # noqa: E402
from tunectl.runners.hosts.local import LocalRunner  # noqa: E402
from tunectl.store import StudyStore  # noqa: E402
from tunectl.wiring.trial import TrialContext, run_trial  # noqa: E402
from tunectl.wiring.virtual import VirtualEvaluator  # noqa: E402

# The card's best stable config (docs/sim.md): the kind of config whose small gains the search must tell apart.
GAP = 0.05          # the live reading vs the virtual model's
CRASH_LEVELS = (256, 512)   # where the seeds saw their config crash
# The seeds' hand-tuned config (write-up 002; an example in profiles/sim-glm5.yaml's comments), over the baseline.
SEEDS = {"disable-cuda-graph": True, "max-running-requests": 2048, "flashinfer-cutlass-autotune": True,
         "disable-radix-cache": True}
BEST = {"disable-cuda-graph": False, "cuda-graph-max-bs": 512, "mem-fraction-static": 0.85,
        "flashinfer-cutlass-autotune": True, "disable-radix-cache": True, "disable-chunked-prefix-cache": True,
        "max-running-requests": 512, "chunked-prefill-size": 16384}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def busy_loops() -> list[subprocess.Popen[bytes]]:
    """One busy-loop process per core, each in its own process group (stopped by that group)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(os.cpu_count() or 1)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


def launch(params: dict[str, Any], root: str, n: int) -> Any:
    prof = load_profile(default_profile_path(), {"server.port": free_port(), "host.workdir": f"{root}/work"})
    store = StudyStore("noise", root)
    return run_trial(TrialContext(prof, LocalRunner(), store), n, params, role="sweep")


def level_rows(runs: list[Any], virtual: dict[int, float]) -> list[dict[str, Any]]:
    rows = []
    for c in sorted({lv.concurrency for r in runs for lv in r.stable_levels}):
        lvs = [lv for r in runs for lv in r.stable_levels if lv.concurrency == c]
        vals = [lv.output_throughput for lv in lvs]
        flags = sorted({f for lv in lvs for f in (["client-bound"] * lv.client_bound + ["capped"] * lv.capped
                                                 + ([lv.witness["flag"]] if lv.witness.get("flag") else []))})
        v = virtual.get(c)
        rows.append({"c": c, "launches": len(lvs), "values": [_with_ci(lv) for lv in lvs],
            "spread": (max(vals) - min(vals)) / statistics.mean(vals) if len(vals) > 1 else 0.0,
            "virtual": v, "gap": (statistics.mean(vals) / v - 1) if v else None, "flags": flags})
    return rows


def _with_ci(lv: Any) -> str:
    ci = lv.output_throughput_ci95
    return f"{lv.output_throughput:,.0f}" + (f" ({ci[0]:,.0f}-{ci[1]:,.0f})" if ci else " (whole run)")


def print_table(name: str, rows: list[dict[str, Any]], load: float, goal: float) -> None:
    print(f"\n{name} (load average {load:.1f} on {os.cpu_count()} cores); goal: spread <= {goal:.0%}, "
          f"live within {GAP:.0%} of the virtual model (or flagged)")
    print("| c | steady tok/s per launch (95% interval) | spread | virtual | live vs virtual | flags |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ok = "" if r["spread"] <= goal else " **over**"
        gap = f"{r['gap']:+.1%}" if r["gap"] is not None else "-"
        gap += "" if r["gap"] is None or abs(r["gap"]) <= GAP or r["flags"] else " **over**"
        virt = f"{r['virtual']:,.0f}" if r["virtual"] else "-"
        print(f"| {r['c']} | {' / '.join(r['values'])} | {r['spread']:.1%}{ok} | {virt} | {gap} | "
              f"{', '.join(r['flags']) or '-'} |")
    spread_ok = sum(r["spread"] <= goal for r in rows)
    gap_ok = sum(r["gap"] is None or abs(r["gap"]) <= GAP or bool(r["flags"]) for r in rows)
    print(f"spread goal met on {spread_ok} of {len(rows)} levels; live vs virtual within {GAP:.0%} (or flagged) "
          f"on {gap_ok} of {len(rows)}")


def scenario(name: str, launches: int, root: str, virtual: dict[int, float]) -> None:
    hogs = busy_loops() if name == "loaded" else []
    try:
        runs = []
        for i in range(launches):
            r = run_trial_logged(BEST, root, i, name)
            runs.append(r)
        load = os.getloadavg()[0]
    finally:
        stop(hogs)
    print_table(f"{name}: the best stable config on {launches} fresh launches", level_rows(runs, virtual), load,
                0.03 if name == "quiet" else 0.05)


def run_trial_logged(params: dict[str, Any], root: str, n: int, name: str) -> Any:
    t0 = time.monotonic()
    r = launch(params, f"{root}/{name}", n)
    print(f"  {name} launch {n + 1}: {r.status}, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return r


def crash_runs(runs: int, root: str) -> None:
    seeds = dict(SEEDS)
    hogs = busy_loops()
    try:
        found = []
        for i in range(runs):
            r = run_trial_logged(seeds, root, i, "crash")
            c = r.crash
            found.append(f"{c.cls}/{c.signature} @ {c.level}" if c else r.status)
    finally:
        stop(hogs)
    same = len(set(f.split(" @")[0] for f in found)) == 1
    at = sum(any(f.endswith(f"@ {c}") for c in CRASH_LEVELS) for f in found)
    print(f"\nthe seeds' config under load, {runs} launches: " + "; ".join(found)
          + (" (the same class every time" if same else " (**classes differ**") + f"; at 256 or 512: {at} of {runs})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--crash-runs", type=int, default=5)
    ap.add_argument("--scenarios", default="quiet,loaded")
    args = ap.parse_args()
    prof = load_profile(default_profile_path())
    virt = VirtualEvaluator(prof)(0, dict(BEST), "sweep", None)
    virtual = {lv.concurrency: lv.output_throughput for lv in virt.stable_levels}
    with tempfile.TemporaryDirectory(prefix="tunectl-noise-") as root:
        for name in args.scenarios.split(","):
            scenario(name, args.launches, root, virtual)
        if args.crash_runs:
            crash_runs(args.crash_runs, root)


if __name__ == "__main__":
    main()
