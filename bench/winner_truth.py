"""The declared winner judged by its true value: `bench/search_efficiency.py --truth` (noise on, every card).

For each profile (default: one `profiles/sim-*.yaml` per sim card) and seed, a full `run_search` on the virtual
clock with the card's noise on (launch-to-launch and drift, sim/noise.py) and the profile's finalists' race; then the
declared winner's TRUE value, the card's noise-free model (`VirtualEvaluator(noise=0)`), against the card's best
(its documented optimum, or `--scan`). Reported per card: the share of seeds whose winner's true value is within 2%
of the best, how often the claimed gain over the baseline lies inside its own 95% interval of the true gain, the
winner's curse (claimed gain / true gain - 1: mean and worst), ties declared, and the reruns the race spent.
Targets: >= 90% of seeds within 2%, the true gain inside the claimed interval in >= 90%, on every card.

    python bench/search_efficiency.py --truth [--profiles all|P1,P2] [--seeds 30] [--trials 40] [--jobs 2]
        [--budget-reruns N] [--noise-launch SD] [--noise-level SD] [--machine SD] [--machine-launches N]
        [--label-machines]

`--noise-launch` / `--noise-level`: every card plays this launch-to-launch / within-launch spread (a log-normal sd,
e.g. 0.026: what a real-size relaunch showed, docs/real-gpu.md) in place of its own `noise:` fields. `--machine`:
every card's machine also changes state (sim/noise.py `machine_state`: a speed shared by the launches run while it
lasts, `--machine-launches` on average), as a real H200 did in the middle of ten launches (docs/real-gpu.md).
`--label-machines`: each such state is recorded as the machine the trial ran on, as the GPUs of a study resumed
elsewhere are, so the race takes each one's level out (search/race.py `machine_terms`; docs/search.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tunectl.objective import score
from tunectl.search import finalists as fin
from tunectl.search.study import open_storage
from tunectl.profile import load_profile
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator


def true_value(path: str, params: dict[str, Any]) -> float:
    """The config's objective on the noise-free model (0 when it crashes there)."""
    prof = load_profile(path)
    res = VirtualEvaluator(prof, 0, noise=0.0)(0, dict(params), "search")
    return score(res, prof).value if res.status == "ok" else 0.0


Job = tuple[str, int, int, float, int | None, float | None, float | None, float | None, float | None, bool]


def one_run(job: Job) -> dict[str, Any]:
    """One seed; an exception comes back as a row (a pool worker's unpicklable exception would hang the pool)."""
    try:
        return _one_run(job)
    except Exception as e:  # noqa: BLE001
        return {"within": False, "claimed": None, "error": f"{type(e).__name__}: {e}"[:300]}


def _one_run(job: Job) -> dict[str, Any]:
    path, seed, trials, target, budget, launch_sd, level_sd, machine_sd, machine_launches, label = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    from bench.search_efficiency import NO_POOL

    prof = load_profile(path)
    prof.search.try_first = []
    prof.search.pool = os.environ.get(NO_POOL) != "1"
    if budget is not None:
        prof.search.finalists.budget = budget
    url = f"memory:truth:{path}:{seed}:{budget}"
    evaluate = VirtualEvaluator(prof, seed)
    if launch_sd is not None:         # the noise another server showed, in place of the card's (--noise-launch)
        evaluate.card.noise.launch = launch_sd
    if level_sd is not None:
        evaluate.card.noise.level = level_sd
    if machine_sd is not None:
        evaluate.card.noise.machine = machine_sd
    if machine_launches is not None:
        evaluate.card.noise.machine_launches = machine_launches
    evaluate.label_machines = label   # --label-machines: each state a machine the trials record
    with tempfile.TemporaryDirectory() as root:
        out = run_search(prof, trials=trials, root=root, evaluate=evaluate, seed=seed, storage_url=url)
    trials = optuna.load_study(study_name=prof.name, storage=open_storage(url)).trials
    served = fin.candidates(trials)
    ceiling = max((true_value(path, t.params) for t in served), default=0.0)   # the best config the search ran
    best = out.best or {}
    if not best:
        return {"within": False, "claimed": None}
    claimed = best.get("confirmed_value") or best["value"]
    truth = true_value(path, best["params"])
    # the baseline the gain is claimed over: the study's own trial 0 (the profile's base values, and the knobs with
    # none drawn by the seed: a true baseline of SGLang's unset defaults would be another config)
    base = next((t for t in trials if t.user_attrs.get("role") == "baseline"), None)
    base_true = true_value(path, dict(base.params) if base is not None else _baseline(path))
    g = best.get("gain") or {}
    true_gain = truth / base_true if base_true else None
    return {"within": truth >= 0.98 * target, "true": truth, "claimed": claimed, "target": target,
            "served": ceiling >= 0.98 * target,
            "ties": len(best.get("ties") or []), "spent": (best.get("race") or {}).get("spent", 0),
            "gain": g.get("ratio"), "gain_low": g.get("low"), "gain_high": g.get("high"), "true_gain": true_gain,
            "launches": best.get("launches")}


def _baseline(path: str) -> dict[str, Any]:
    from tunectl.search.space import baseline_params

    return baseline_params(load_profile(path))


def card_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("claimed")]
    gains = [r for r in ok if r.get("gain") and r.get("true_gain")]
    curse = [r["gain"] / r["true_gain"] - 1 for r in gains]
    runs = [r for r in runs if "error" not in r]
    return {"seeds": len(runs), "within": sum(r["within"] for r in runs) / max(1, len(runs)),
            "served": sum(r.get("served", False) for r in runs) / max(1, len(runs)),
            "gain_inside": sum(r["gain_low"] <= r["true_gain"] <= r["gain_high"] for r in gains) / max(1, len(gains)),
            "curse_mean": statistics.fmean(curse) if curse else 0.0, "curse_max": max(curse, default=0.0),
            "true_share": statistics.fmean(r["true"] / r["target"] for r in ok) if ok else 0.0,
            "worst": min((r["true"] / r["target"] for r in ok), default=0.0),
            "ties": statistics.fmean(r["ties"] for r in ok) if ok else 0.0,
            "spent": statistics.fmean(r["spent"] for r in ok) if ok else 0.0,
            "launches": statistics.fmean(r["launches"] or 1 for r in ok) if ok else 0.0}


def main(args: argparse.Namespace, pool: Any) -> None:
    from bench.search_efficiency import one_per_card, targets

    paths = one_per_card() if args.profiles == "all" else args.profiles.split(",")
    t0 = time.monotonic()
    goal = targets(paths, args, pool)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(p, s, args.trials, goal[p], args.budget_reruns, args.noise_launch, args.noise_level,
             args.machine, args.machine_launches, args.label_machines) for p in paths for s in seeds]
    runs = pool.map(one_run, jobs, chunksize=1)
    for j, r in zip(jobs, runs):
        if "error" in r:
            print(f"{Path(j[0]).name} seed {j[1]}: not counted: {r['error']}")
    print(f"\n{'card':34} {'seeds':>5} {'within 2%':>9} {'ran one':>7} {'true/best':>9} {'worst':>6} {'gain in CI':>10} "
          f"{'curse mean':>10} {'curse max':>9} {'ties':>5} {'launches':>8} {'reruns':>6}")
    ok_all = True
    for path in paths:
        row = card_row([r for j, r in zip(jobs, runs) if j[0] == path])
        ok_all &= row["within"] >= 0.9 and row["gain_inside"] >= 0.9
        card = load_profile(path).server.sim.card
        print(f"{card:34} {row['seeds']:>5} {row['within']:>9.0%} {row['served']:>7.0%} {row['true_share']:>9.1%} "
              f"{row['worst']:>6.1%} "
              f"{row['gain_inside']:>10.0%} {row['curse_mean']:>+10.1%} {row['curse_max']:>+9.1%} "
              f"{row['ties']:>5.1f} {row['launches']:>8.1f} {row['spent']:>6.1f}")
    print(f"\nwithin 2%: seeds whose declared winner's true (noise-free) value is >= 98% of the card's best; ran one: "
          f"seeds whose search ran any config within 2% (the most the finalists could pick); gain in "
          f"CI: the true gain inside the claimed gain's 95% interval; curse: claimed gain / true gain - 1; ties: "
          f"configs declared tied with the winner; launches: the winner's; reruns: the race's, per seed (means)\n"
          f"targets: >= 90% within 2% and >= 90% gain in CI on every card: {'met' if ok_all else 'NOT met'}; "
          f"wall {time.monotonic() - t0:.0f}s")
