"""The search judged on a measured landscape: `bench/search_efficiency.py --landscape FILE` (docs/landscapes.md).

Per sampler and seed, the real search loop (`run_search`, the profile's finalists, no `try_first`) against the table
replayed by `tunectl/wiring/replay.py`: no model in between. Reported per sampler: trials until a config whose TRUE value
(the table's mean over its launches) reaches 95% of the table's best; crash waste (share of trials after trial 10
that crashed); the share of proposals the table has no measurement of; and the winner the search declares: its
true value against the table's best and what the search claimed for it (its mean over its own readings).

    python bench/search_efficiency.py --landscape docs/real-gpu/landscapes/llama8b-h100/landscape.json \
        [--seeds 30] [--trials 40] [--samplers tpe,random] [--client builtin|bench_serving] [--readings launches|none]
        [--slo median_tpot_ms=10]      # the objective under an SLO on the table's latencies (their launch means)
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from tunectl.commands.sweep import parse_slo
from tunectl.profile import Profile
from tunectl.wiring import landscape
from tunectl.wiring.replay import Replay, ReplayEvaluator, Unmeasured, replay_profile
from tunectl.search.study import open_storage
from tunectl.wiring.study import run_search


def one_run(job: tuple[str, str | None, str, str, int, int, dict[str, float]]) -> dict[str, Any]:
    path, client, noise, sampler, seed, trials, slo = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    land = landscape.load(path)
    replay = Replay(land, client, noise)
    prof = profile(land, slo)
    prof.search.sampler = sampler  # type: ignore[assignment]
    evaluate = ReplayEvaluator(prof, replay, seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        url = f"memory:{path}:{sampler}:{seed}:{sorted(slo.items())}"      # one study per run, SLO included
        out = run_search(prof, trials=trials, root=root, evaluate=evaluate, seed=seed, storage_url=url)
        every = optuna.load_study(study_name=prof.name, storage=open_storage(url)).trials
    ordered = [t for t in every if t.user_attrs.get("role") in ("search", "baseline")
               and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    best, _ = replay.best(prof)
    true = [_true(replay, t.params, prof) for t in ordered]
    reach = next((i + 1 for i, v in enumerate(true) if v >= 0.95 * best), None)
    late = [t.user_attrs.get("crash_class") is not None for t in ordered[10:]]
    win = out.best or {}
    claimed = win.get("confirmed_value") or win.get("value")
    return {"reach": reach, "waste": sum(late) / max(1, len(late)), "cpu": time.monotonic() - started,
            "unmeasured": evaluate.unmeasured / max(1, evaluate.calls),
            "win_true": _true(replay, win["params"], prof) if win else 0.0, "claimed": claimed,
            "win_params": win.get("params")}


def profile(land: dict[str, Any], slo: dict[str, float]) -> Profile:
    """The landscape's replay profile, its objective under `slo` (--slo: the search maximizes the best level that
    meets it, as a study with `objective.slo` does)."""
    prof = replay_profile(land)
    if slo:
        prof.objective = prof.objective.model_copy(update={"slo": dict(slo)})
    return prof


def _true(replay: Replay, params: dict[str, Any], prof: Profile) -> float:
    try:
        return replay.true_value(params, prof)
    except Unmeasured:
        return 0.0


def summarize(runs: list[dict[str, Any]], trials: int, best: float) -> dict[str, Any]:
    reach = [r["reach"] or trials + 1 for r in runs]
    wins = [r for r in runs if r["claimed"]]
    return {"median": statistics.median(reach), "reached": sum(r["reach"] is not None for r in runs),
            "waste": statistics.mean(r["waste"] for r in runs),
            "unmeasured": statistics.mean(r["unmeasured"] for r in runs), "per_seed": reach,
            "win_true": statistics.median(r["win_true"] for r in runs) / best if best else 0.0,
            "win_95": sum(r["win_true"] >= 0.95 * best for r in runs),
            "claim_over": statistics.median(r["claimed"] / r["win_true"] - 1 for r in wins if r["win_true"])
            if any(r["win_true"] for r in wins) else None,
            "cpu": sum(r["cpu"] for r in runs)}


def print_table(land: dict[str, Any], replay: Replay, rows: dict[str, dict[str, Any]], seeds: int,
                trials: int, prof: Profile) -> None:
    best, where = replay.best(prof)
    n = land["counts"]
    slo = f"; SLO {', '.join(f'{k} <= {v:g}' for k, v in prof.objective.slo.items())}" if prof.objective.slo else ""
    print(f"\n{land['name']}: {n['configs']} configs, {n['measured']} measured, {n['configs_crash']} crash; "
          f"client {replay.client}, readings: {replay.noise}{slo}; best {best:,.0f} tok/s at {where}")
    head = (f"  {'sampler':8} {'median to 95%':>13} {'seeds reaching':>14} {'vs random':>9} {'crash waste':>11} "
            f"{'unmeasured':>10} {'winner true':>11} {'winner >=95%':>12} {'claimed vs true':>15} {'cpu':>5}")
    print(head + "\n  " + "-" * (len(head) - 2))
    rand = rows.get("random", {}).get("median")
    for sampler, r in rows.items():
        ratio = f"{rand / r['median']:.1f}x" if rand else "-"
        over = "-" if r["claim_over"] is None else f"{r['claim_over']:+.1%}"
        print(f"  {sampler:8} {r['median']:>13.1f} {r['reached']:>11}/{seeds:<2} {ratio:>9} {r['waste']:>11.0%} "
              f"{r['unmeasured']:>10.0%} {r['win_true']:>11.1%} {r['win_95']:>9}/{seeds:<2} {over:>15} "
              f"{r['cpu']:>4.0f}s")
    print(f"  median: trials until a config whose table value is >= 95% of the best ({trials + 1} = not within "
          f"{trials}); winner true: the declared winner's table value / the best (median over seeds); claimed vs "
          "true: what the search claimed for its winner over its table value (median)")


def main(args: argparse.Namespace, pool: Any) -> None:
    land = landscape.load(args.landscape)
    replay = Replay(land, args.client, args.readings)
    slo = parse_slo(args.slo or [])
    replay.check_slo(slo)
    prof = profile(land, slo)                                # its mistakes once, before the workers start
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    samplers = args.samplers.split(",")
    jobs = [(args.landscape, args.client, args.readings, s, seed, args.trials, slo) for s in samplers
            for seed in seeds]
    runs = pool.map(one_run, jobs, chunksize=1)
    best, _ = replay.best(prof)
    if not best:
        raise SystemExit(f"landscape {land['name']}: no measured config meets the SLO {slo}: nothing to reach")
    rows = {s: summarize([r for j, r in zip(jobs, runs) if j[3] == s], args.trials, best) for s in samplers}
    print_table(land, replay, rows, args.seeds, args.trials, prof)
