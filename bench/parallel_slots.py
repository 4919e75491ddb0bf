"""Wall time of a live study on the stand-in with one GPU slot and with all of them (`tunectl search --parallel`).

The profile (default: profiles/parallel-sim-llama70b-8xh100.yaml: 8 simulated H100s, TP 2 per trial, 4 slots) runs
as a user runs it, `tunectl search --json`, real stand-in servers through the local runner, once with `--parallel 1`
and once with `--parallel N` (default: every slot), each on a fresh results folder. From the launch records
(`trials/<n>/slot.json`: when each server started and stopped, on which GPUs) the table gives the most servers
alive at once and whether any GPU ever had two servers; the speed-up is the one-slot wall time over the N-slot one.
CPU seconds of the whole process tree and the load average are printed beside it: the stand-in's servers mostly
sleep in modelled time, but their clients and the coordinator share the machine's cores.

    python bench/parallel_slots.py [--trials 40] [--profile PATH] [--parallel 4] [--levels 1,8,32,64,128]
        [--time-scale 0.05]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "profiles" / "parallel-sim-llama70b-8xh100.yaml"


def alive_at_once(recs: list[dict[str, Any]]) -> int:
    edges = sorted([(r["server_started_at"], 1) for r in recs] + [(r["server_stopped_at"], -1) for r in recs])
    return max(itertools.accumulate(d for _, d in edges), default=0)


def gpu_shared(recs: list[dict[str, Any]]) -> bool:
    gpus = {g for r in recs for g in r["gpus"] or []}
    return any(alive_at_once([r for r in recs if g in (r["gpus"] or [])]) > 1 for g in gpus)


def profile_copy(src: Path, tmp: Path, levels: list[int] | None, scale: float | None) -> Path:
    data = yaml.safe_load(src.read_text())
    data.setdefault("host", {})["workdir"] = str(tmp / "host")
    if scale:
        data["server"].setdefault("sim", {})["time_scale"] = scale
    if levels:
        data["bench"]["levels"] = levels
    out = tmp / "profile.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def one_run(src: Path, trials: int, parallel: int, levels: list[int] | None, scale: float | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cmd = [sys.executable, "-m", "tunectl", "search", "-p", str(profile_copy(src, tmp, levels, scale)), "--json",
               "-n", str(trials), "--results", str(tmp / "r"), "--study", "bench",
               *(["--parallel", str(parallel)] if parallel else [])]
        load0, cpu0, t0 = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        wall, cpu1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if res.returncode != 0:
            raise SystemExit(f"--parallel {parallel}: exit {res.returncode}: {res.stderr.strip()[-800:]}")
        out = json.loads(res.stdout)
        recs = [json.loads(p.read_text()) for p in (tmp / "r" / "bench").glob("trials/*/slot.json")]
        recs = [r for r in recs if "server_started_at" in r and "server_stopped_at" in r]
        return {"parallel": parallel, "trials": out["trials"], "launches": len(recs), "wall_s": wall,
                "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
                "load": (load0 + os.getloadavg()[0]) / 2, "alive": alive_at_once(recs), "shared": gpu_shared(recs),
                "slots": len({r["key"] for r in recs}), "best": (out["best"] or {}).get("value")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--profile", type=Path, default=DEFAULT)
    ap.add_argument("--parallel", type=int, default=0, help="slots for the parallel run (default: all)")
    ap.add_argument("--levels", default="", help="comma-separated ladder (default: the profile's)")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="the stand-in's wall seconds per modelled second (default: the profile's)")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x] or None
    print(f"{args.profile.name}: {args.trials} search trials, time scale {args.time_scale or 'as profiled'}, "
          f"{os.cpu_count()} cores", flush=True)
    rows = []
    for parallel in (1, args.parallel):
        print(f"  running --parallel {parallel or 'all slots'} ...", flush=True)
        rows.append(one_run(args.profile, args.trials, parallel, levels, args.time_scale))
    base = rows[0]["wall_s"]
    print(f"{'trials':>6} {'launches':>8} {'slots':>5} {'wall s':>8} {'cpu s':>7} {'load':>5} "
          f"{'max alive':>9} {'GPU shared':>10} {'speed-up':>8} {'best tok/s':>10}")
    for r in rows:
        print(f"{r['trials']:>6} {r['launches']:>8} {r['slots']:>5} {r['wall_s']:>8.1f} {r['cpu_s']:>7.1f} "
              f"{r['load']:>5.1f} {r['alive']:>9} {'yes' if r['shared'] else 'no':>10} "
              f"{base / r['wall_s']:>7.2f}x {r['best'] or 0:>10,.0f}")


if __name__ == "__main__":
    main()
