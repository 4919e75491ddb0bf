"""The radix cache's verdict depends on the workload: the search on the embedded default (the stand-in) recommends
it ON for chat-like multi-turn traffic and OFF for unique random prompts.

Part 1 (virtual-clock model, `tunectl search --virtual`): for each workload and seed, the embedded default's full
search (its space; the profile lists no `try_first`) with the profile's workload replaced; the
winner's `disable-radix-cache` is the recommendation. Part 2 (the live stand-in, `tunectl sweep`): each workload's
winner launched twice, radix on and off, measured by the built-in client at the levels given; the ordering is
the claim the search acted on.

    python bench/radix_workload.py [--seeds 3] [--trials 40] [--levels 64,256] [--no-live]

Workloads: `random` is the default's (256 in / 128 out, unique ids); `chat` is a 512-token system prompt shared by
all conversations and 4 turns each (128 new tokens per user message, 128 out, lengths x0.5-1), each turn
resending the conversation so far.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run as a script from anywhere in the checkout
from tunectl.profile import load_profile  # noqa: E402
from tunectl.wiring.study import run_search  # noqa: E402
from tunectl.wiring.virtual import VirtualEvaluator  # noqa: E402

DEFAULT = ROOT / "profiles" / "sim-glm5.yaml"
WORKLOADS: dict[str, dict[str, Any]] = {
    "random": {"kind": "random", "input_len": 256, "output_len": 128, "prompts_per_level": 1, "min_prompts": 2},
    "chat": {"kind": "shared_prefix", "name": "chat", "shared_prefix_len": 512, "input_len": 128, "output_len": 128,
             "range_ratio": 0.5, "turns": 4, "prompts_per_level": 2, "min_prompts": 8},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profile_file(folder: Path, workload: str) -> Path:
    data = yaml.safe_load(DEFAULT.read_text())
    data["name"] = f"radix-{workload}"
    data["bench"]["workloads"] = [WORKLOADS[workload]]
    data["server"]["port"] = free_port()          # beside a server someone else runs on the default port
    path = folder / f"radix-{workload}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def searched(path: Path, seed: int, trials: int, root: Path) -> dict[str, Any]:
    prof = load_profile(path)
    out = run_search(prof, trials=trials, study_name=f"{prof.name}-s{seed}", seed=seed, root=root,
                     evaluate=VirtualEvaluator(prof, seed), in_memory=True)
    assert out.best is not None, "the search found no stable config"
    return {"params": out.best["params"], "value": out.best.get("value") or out.best.get("score")}


def flipped(path: Path, params: dict[str, Any]) -> dict[bool, float]:
    """The virtual model's best stable throughput of `params` with the radix cache on and off."""
    prof = load_profile(path)
    ev = VirtualEvaluator(prof, 0)
    return {on: ev(0, {**params, "disable-radix-cache": not on}, "search").best_output_throughput
            for on in (True, False)}


def live(path: Path, params: dict[str, Any], levels: str, radix_on: bool, root: Path) -> dict[int, float]:
    sets = [x for k, v in {**params, "disable-radix-cache": not radix_on}.items()
            for x in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]
    cmd = [sys.executable, "-m", "tunectl", "sweep", "-p", str(path), "-c", levels, *sets, "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    root.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False, cwd=root)
    if res.returncode != 0:
        raise SystemExit(f"sweep failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    data = json.loads(res.stdout)
    return {lv["concurrency"]: lv["metrics"].get("steady_output_throughput", lv["metrics"]["output_throughput"])
            for lv in data["levels"] if lv["status"] == "ok"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--levels", default="64,256")
    ap.add_argument("--no-live", action="store_true")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"search (virtual model, {args.trials} trials, seeds 0-{args.seeds - 1}):")
        print(f"{'workload':8} {'radix on in winners':>20} {'winner tok/s (median)':>22} "
              f"{'winner radix on':>16} {'winner radix off':>17} {'on/off':>7}")
        winners = {}
        for wl in WORKLOADS:
            path = profile_file(work, wl)
            runs = [searched(path, s, args.trials, work / "results") for s in range(args.seeds)]
            on = sum(not r["params"].get("disable-radix-cache", False) for r in runs)
            best = max(runs, key=lambda r: r["value"] or 0.0)
            both = flipped(path, best["params"])
            winners[wl] = (path, best["params"])
            print(f"{wl:8} {f'{on}/{len(runs)}':>20} {statistics.median(r['value'] or 0 for r in runs):>22,.0f} "
                  f"{both[True]:>16,.0f} {both[False]:>17,.0f} {both[True] / both[False]:>7.3f}")
        if args.no_live:
            return
        print(f"\nlive stand-in (tunectl sweep, built-in client), each workload's winner, levels {args.levels}:")
        print(f"{'workload':8} {'c':>5} {'radix on tok/s':>15} {'radix off tok/s':>16} {'on/off':>7}")
        for wl, (path, params) in winners.items():
            on, off = (live(path, params, args.levels, flag, work / "sweeps") for flag in (True, False))
            for c in sorted(on):
                print(f"{wl:8} {c:>5} {on[c]:>15,.0f} {off.get(c, 0):>16,.0f} {on[c] / max(off.get(c, 1), 1):>7.3f}")


if __name__ == "__main__":
    main()
