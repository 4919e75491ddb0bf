"""Warm start vs cold start across an SGLang upgrade, on the stand-in's virtual-clock model
(`bench/search_efficiency.py --warm-start`).

Per seed: a study of the old profile (default: the embedded default on SGLang 0.5.9, with patch 0001 as a knob),
then the same profile moved to the new version (`tunectl.wiring.migrate.move_profile`: 0.5.17, the 0.5.9-only patch knob
dropped) searched twice with the same seed and budget: cold (a new study) and warm (`--warm-start` the old study).
Reported: search trials until a stable config reaches 95% of the new best (the best stable config any run found on
the new version), per seed and as medians. The profiles' try_first is dropped (the search on its own).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from tunectl.wiring.migrate import move_profile
from tunectl.profile import Profile, load_profile
from tunectl.search.study import open_storage
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator


def profiles(path: str, version: str) -> tuple[Profile, Profile]:
    data = yaml.safe_load(Path(path).read_text())
    data["search"]["try_first"] = []
    data["search"]["finalists"] = {"top_k": 0, "reruns": 0}
    new, _ = move_profile(data, version)
    return Profile.model_validate(data), Profile.model_validate(new)


def _values(study: str, url: str) -> list[float]:
    """The stable value of each counted search trial, in order (0 for crashes and pruned trials)."""
    trials = optuna.load_study(study_name=study, storage=open_storage(url)).trials
    ordered = [t for t in trials if t.user_attrs.get("role") in ("search", "baseline")
               and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return [t.values[0] if t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values()) else 0.0
            for t in ordered]


def one_seed(job: tuple[str, str, int, int, int]) -> dict[str, list[float]]:
    path, version, seed, old_trials, trials = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    old, new = profiles(path, version)
    url = f"memory:warm:{path}:{version}:{seed}"
    with tempfile.TemporaryDirectory() as root:
        run_search(old, trials=old_trials, root=root, evaluate=VirtualEvaluator(old, seed), seed=seed,
                   storage_url=url, study_name="old")
        for name, warm in (("cold", None), ("warm", "old")):
            run_search(new, trials=trials, root=root, evaluate=VirtualEvaluator(new, seed), seed=seed,
                       storage_url=url, study_name=name, warm_start=warm)
    return {name: _values(name, url) for name in ("old", "cold", "warm")}


def reach(values: list[float], target: float) -> int | None:
    return next((i + 1 for i, v in enumerate(values) if v >= 0.95 * target), None)


def report(runs: list[dict[str, list[float]]], trials: int, seeds: list[int]) -> None:
    best = max(max(r[k], default=0.0) for r in runs for k in ("cold", "warm"))
    print(f"new best (the best stable config any run found on the new version): {best:,.0f} tok/s; 95% = "
          f"{0.95 * best:,.0f}\n")
    print(f"{'seed':>4} {'old best':>9} {'cold: to 95%':>12} {'best':>7} {'warm: to 95%':>12} {'best':>7} "
          f"{'warm trial 1':>12}")
    rows = {"cold": [], "warm": []}
    for seed, r in zip(seeds, runs):
        cells = []
        for k in ("cold", "warm"):
            n = reach(r[k], best)
            rows[k].append(n or trials + 1)
            cells.append(f"{n if n else f'>{trials}':>12} {max(r[k], default=0):>7,.0f}")
        print(f"{seed:>4} {max(r['old'], default=0):>9,.0f} {cells[0]} {cells[1]} {r['warm'][0]:>12,.0f}")
    cold, warm = statistics.median(rows["cold"]), statistics.median(rows["warm"])
    fewer = sum(w < c for w, c in zip(rows["warm"], rows["cold"]))
    print(f"\nmedian trials to 95% of the new best: cold {cold:.1f}, warm {warm:.1f} (not reached within {trials} "
          f"counts as {trials + 1}); warm needed fewer on {fewer}/{len(seeds)} seeds, as many or more on "
          f"{len(seeds) - fewer}")


def main(args: argparse.Namespace, pool: Any) -> None:
    path = args.profiles if args.profiles != "all" else "profiles/sim-glm5.yaml"
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    print(f"warm start: {Path(path).name} on SGLang {load_profile(path).server.sglang_version} "
          f"({args.old_trials} trials) -> {args.warm_start}, {args.trials} trials cold and warm, {len(seeds)} seeds")
    runs = pool.map(one_seed, [(path, args.warm_start, s, args.old_trials, args.trials) for s in seeds], chunksize=1)
    report(runs, args.trials, seeds)
