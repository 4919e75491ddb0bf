"""Search efficiency on the stand-in's virtual-clock model, over every sim card: tunectl's search vs random.

For each profile (default: one `profiles/sim-*.yaml` per sim card), sampler and seed, a full `run_search` without
the profile's `try_first` (the real loop, storage and feedback; the trial engine replaced by the model) with the
profile's space. Reported per profile and
sampler: trials until a stable config reaches 95% of the best stable throughput of the space (the card's
documented optimum for that profile, or `--scan`: exhaustive over the profile's grid), and the share of trials
after trial 10 spent on configs that crash. Targets (issue 35's): median <= 10 trials, every seed reaching 95%
within the trials, >= 2x fewer than random, <= 10% crash waste, on every card (each missed one is named). Runs are spread over `--jobs` processes (default 2).

    python bench/search_efficiency.py [--profiles all|P1,P2] [--seeds 10] [--trials 40] [--first-seed 0]
        [--samplers tpe,random] [--target TOK_S | --scan] [--jobs 2] [--parallel 4] [--budget]

`--parallel N`: each sampler also with N trials in flight (the parallel loop of `tunectl search --parallel`, each
virtual trial held for its modelled duration x PACE), its rows named `tpe xN` beside the sequential ones.
`--budget`: per card, the trials before 95% summed over the seeds, by who proposed them (the sampler, a local step,
a repair step and the crash or log hint it answered) and what came of them (gain, served, crashed, pruned).
    python bench/search_efficiency.py --warm-start 0.5.17 [--profiles profiles/sim-glm5.yaml] [--seeds 10]
        [--old-trials 40] [--trials 40]      # warm vs cold start after an upgrade (bench/warm_start.py)
    python bench/search_efficiency.py --truth [--seeds 30] [--budget-reruns N] [--noise-launch SD] [--machine SD]
        # noise on: the winner's true value vs the card's best, the winner's curse (bench/winner_truth.py,
        # docs/search.md); --noise-launch: every card plays that launch spread
    python bench/search_efficiency.py --landscape FILE [--seeds 30]   # on a measured landscape, replayed
        (bench/landscape_judge.py, docs/landscapes.md)
"""
from __future__ import annotations

import argparse
import os
import collections
import itertools
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run as a script from anywhere in the checkout
from tunectl.search import finalists as fin
from tunectl.search.feedback import judge
from tunectl.search.space import GRID_POINTS, grid_space, is_active, knob_order
from tunectl.search.study import open_storage

from tunectl.profile import Profile, load_profile
from tunectl.reports.data import unit
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator


NO_POOL = "TUNECTL_BENCH_NO_POOL"            # --no-pool, for the worker processes
MEDIAN_TARGET = 10                            # issue 35: trials to 95% of the best, median over seeds


def one_per_card() -> list[str]:
    """Every sim card once: of the `profiles/sim-*.yaml` that play one card (sim-glm5, sim-glm5-chat, ...), the
    one with the shortest name (the card's plain profile; the others vary its workload or objective)."""
    by_card: dict[str, Path] = {}
    for p in sorted((ROOT / "profiles").glob("sim-*.yaml")):
        card = load_profile(p).server.sim.card
        if card not in by_card or len(p.name) < len(by_card[card].name):
            by_card[card] = p
    return sorted(str(p) for p in by_card.values())


def grid_configs(prof: Profile) -> list[dict[str, Any]]:
    grid = grid_space(prof.search, points=GRID_POINTS)
    names, seen, out = list(grid), set(), []
    for values in itertools.product(*(grid[n] for n in names)):
        full, params = dict(zip(names, values)), {}
        for name in knob_order(prof.search.space):
            if is_active(prof.search.space[name], params):
                params[name] = full[name]
        key = tuple(sorted(params.items()))
        if key not in seen:
            seen.add(key)
            out.append(params)
    return out


def _scan_chunk(job: tuple[str, list[dict[str, Any]], int]) -> tuple[float, dict[str, Any], int]:
    """Best config of a chunk that is stable on every seed (later seeds only for a new best), by the profile's
    objective (an SLO-bound level, a weighted sum, a capacity: the value the search is told, infeasible configs
    left out), and its crashes."""
    path, configs, seeds = job
    prof = load_profile(path)
    evals = [VirtualEvaluator(prof, s, noise=0.0) for s in range(seeds)]     # the card's true (noise-free) values
    best: tuple[float, dict[str, Any]] = (0.0, {})
    crashes = 0
    for params in configs:
        low = None
        for ev in evals:
            r = ev(0, params, "search")
            verdict = judge(r, prof)            # the study's objective, as the search is told it: SLO limits kept
            if r.status != "ok" or not verdict.feasible or not verdict.values:
                crashes += ev is evals[0] and r.status != "ok"
                low = None
                break
            value = verdict.values[0]
            low = value if low is None else min(low, value)
            if low <= best[0]:
                break
        if low is not None and low > best[0]:
            best = (low, params)
    return best[0], best[1], crashes


def card_best(path: str, pool: Any, jobs: int, seeds: int = 2) -> tuple[float, dict[str, Any], float, int]:
    """Best stable throughput over the profile's grid, its config, the grid's crash share and size."""
    configs = grid_configs(load_profile(path))
    size = max(1, len(configs) // (8 * jobs))
    parts = pool.map(_scan_chunk, [(path, configs[i:i + size], seeds) for i in range(0, len(configs), size)])
    value, where, _ = max(parts, key=lambda p: p[0])
    return value, where, sum(p[2] for p in parts) / max(1, len(configs)), len(configs)


PACE = 0.0005        # wall seconds per modelled second of a trial, when trials run in parallel


def paced(evaluate: VirtualEvaluator) -> Any:
    """The virtual trial held for its modelled duration (scaled down): parallel trials end in the order and
    overlap a live study's would, so the sampler proposes with the others still in flight."""
    def run(n: int, params: dict[str, Any], role: str, prune: Any) -> Any:
        res = evaluate(n, params, role, prune)
        time.sleep((res.wall_s or 0.0) * PACE)
        return res

    return run


def one_run(job: tuple[str, str, int, int, float, bool, int]) -> dict[str, Any]:
    path, sampler, seed, trials, target, keep_try_first, parallel = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    p = load_profile(path)
    if not keep_try_first:
        p.search.try_first = []                 # the search on its own: no hand-listed start
    p.search.sampler = sampler  # type: ignore[assignment]
    p.search.finalists.top_k = 0
    p.search.pool = os.environ.get(NO_POOL) != "1"
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        url = f"memory:{path}:{sampler}:{seed}:{parallel}"        # the loop's storage calls, without SQLite's cost
        model, walls = VirtualEvaluator(p, seed), {}

        def evaluate(n: int, params: dict[str, Any], role: str, prune: Any) -> Any:
            res = model(n, params, role, prune)
            walls[n] = res.wall_s or 0.0          # modelled seconds: start, the levels run (a pruned ladder's part)
            return res

        run_search(p, trials=trials, root=root, evaluate=paced(evaluate) if parallel > 1 else evaluate, seed=seed,
                   storage_url=url, parallel=parallel)
        every = optuna.load_study(study_name=p.name, storage=open_storage(url)).trials
    ordered = [t for t in every if t.user_attrs.get("role") in ("search", "baseline")
               and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    feasible = [t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values()) for t in ordered]
    values = [t.values[0] if ok else 0.0 for t, ok in zip(ordered, feasible)]
    reach = next((i + 1 for i, v in enumerate(values) if v >= 0.95 * target), None)
    late = [t.user_attrs.get("crash_class") is not None for t in ordered[10:]]
    # GPU time until 95%: every trial run up to the one that reached it (crashes, prunes and retries included);
    # a seed that never reached it counts all its trials' time (a lower bound)
    upto = ordered[reach - 1].number if reach else max(walls, default=0)
    return {"reach": reach, "gpu_s": sum(w for n, w in walls.items() if n <= upto), "best": max(values, default=0.0), "waste": sum(late) / max(1, len(late)),
            "repairs": sum(t.user_attrs.get("proposed_by") == "repair" for t in ordered),
            "vetoed": sum("vetoed" in t.user_attrs for t in every), "cpu": time.monotonic() - started,
            "budget": budget(ordered[:reach], values)}


def budget(before: list[FrozenTrial], values: list[float]) -> collections.Counter[tuple[str, str]]:
    """Where the trials before 95% went: (who proposed it, what came of it) per trial. Who: the sampler, a local
    step, or a repair step with the evidence it answered (a crash signature or a log hint); what: `gain` (served,
    > 1% above the best so far), `served`, `crashed`, `pruned`."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    best = 0.0
    for t, v in zip(before, values):
        who = t.user_attrs.get("proposed_by") or ("sampler" if fin.role(t) == "search" else fin.role(t))
        if who == "repair":
            who = f"repair {t.user_attrs.get('repair_for', '')}"
        what = ("pruned" if t.state == TrialState.PRUNED else "crashed" if t.user_attrs.get("crash_class")
                else "gain" if v > 1.01 * best else "served")
        out[(who, what)] += 1
        best = max(best, v)
    return out


def summarize(runs: list[dict[str, Any]], trials: int) -> dict[str, Any]:
    reach = [r["reach"] or trials + 1 for r in runs]
    return {"median": statistics.median(reach), "gpu_h": statistics.median(r["gpu_s"] for r in runs) / 3600, "reached": sum(r["reach"] is not None for r in runs),
            "waste": statistics.mean(r["waste"] for r in runs), "best": statistics.mean(r["best"] for r in runs),
            "per_seed": reach, "repairs": sum(r["repairs"] for r in runs), "vetoed": sum(r["vetoed"] for r in runs),
            "cpu": sum(r["cpu"] for r in runs), "budget": sum((r["budget"] for r in runs), collections.Counter())}


def print_budget(rows: dict[str, dict[str, Any]]) -> None:
    for sampler, r in rows.items():
        print(f"  {sampler}: trials before 95% (all seeds), by proposer: gain / served / crashed / pruned")
        for who in sorted({w for w, _ in r["budget"]}):
            n = [r["budget"][(who, what)] for what in ("gain", "served", "crashed", "pruned")]
            print(f"    {who:44} {n[0]:>4} / {n[1]:>4} / {n[2]:>4} / {n[3]:>4}")


def print_card(name: str, target: float, rows: dict[str, dict[str, Any]], seeds: int, what: str = "tok/s") -> None:
    print(f"\n{name}: best stable {target:,.4g} {what}, 95% = {0.95 * target:,.4g}")
    head = (f"  {'sampler':8} {'median to 95%':>13} {'seeds reaching':>14} {'vs random':>9} {'crash waste':>11} "
            f"{'GPU h to 95%':>12} {'mean best':>9} {'repairs':>7} {'vetoed':>6} {'cpu':>5}  trials to 95% per seed")
    print(head + "\n  " + "-" * (len(head) - 2))
    rand = rows.get("random", {}).get("median")
    for sampler, r in rows.items():
        ratio = f"{rand / r['median']:.1f}x" if rand else "-"
        print(f"  {sampler:8} {r['median']:>13.1f} {r['reached']:>11}/{seeds:<2} {ratio:>9} {r['waste']:>11.0%} "
              f"{r['gpu_h']:>12.2f} {r['best']:>9,.0f} {r['repairs']:>7} {r['vetoed']:>6} {r['cpu']:>4.0f}s  "
              + " ".join(str(x) for x in r["per_seed"]))


def print_summary(results: dict[str, tuple[float, dict[str, dict[str, Any]]]], trials: int, wall: float) -> None:
    print(f"\n{'card':34} {'tpe median':>10} {'random':>7} {'ratio':>6} {'crash waste':>11}  targets")
    ok_all = True
    for name, (_, rows) in results.items():
        tpe, rand = rows.get("tpe"), rows.get("random")
        if tpe is None:
            continue
        ratio = f"{rand['median'] / tpe['median']:>5.1f}x" if rand else "-"
        missed = [what for what, bad in (
            (f"median {tpe['median']:g} > {MEDIAN_TARGET}", tpe["median"] > MEDIAN_TARGET),
            (f"{sum(x > trials for x in tpe['per_seed'])} seed(s) never at 95%", max(tpe["per_seed"]) > trials),
            ("< 2x random", rand is not None and rand["median"] < 2 * tpe["median"]),
            (f"crash waste {tpe['waste']:.0%}", tpe["waste"] > 0.10)) if bad]
        ok_all &= not missed
        verdict = ("met" if not missed else "NOT met: " + ", ".join(missed)) + (
            "" if rand else " (no random run: ratio not checked)")
        print(f"{name:34} {tpe['median']:>10.1f} {rand['median'] if rand else '-':>7} {ratio:>6} "
              f"{tpe['waste']:>11.0%}  {verdict}")
    print(f"\nmedian: trials until 95% of the best (not reached within {trials} counts as {trials + 1}); GPU h to 95%: "
          f"the modelled GPU time of the trials until then (median; a seed that never reached it counts all its "
          f"trials'); crash waste: "
          f"share of trials after trial 10 that crashed (mean over seeds)\ntargets: median <= {MEDIAN_TARGET}, every "
          f"seed at 95% within {trials}, >= 2x fewer than random, crash waste <= 10%, on every card: {'met' if ok_all else 'NOT met'}; wall {wall:.0f}s")


def targets(paths: list[str], args: argparse.Namespace, pool: Any) -> dict[str, float]:
    out = {}
    for path in paths:
        prof = load_profile(path)
        land = VirtualEvaluator(prof).card.landscape
        documented = land is not None and land.best_stable.profile is not None and \
            Path(land.best_stable.profile).name == Path(path).name
        if args.target or documented and not args.scan:
            out[path] = args.target or land.best_stable.output_throughput   # type: ignore[union-attr]
            continue
        t0 = time.monotonic()
        value, where, crash, size = card_best(path, pool, args.jobs)
        print(f"{Path(path).name}: {size} grid configs, {crash:.0%} crash at startup or under load; best stable "
              f"{value:,.4g} {unit(prof)} ({time.monotonic() - t0:.0f}s)\n  at {where}", flush=True)
        out[path] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default="all", help="comma-separated profile paths, or all: one sim-*.yaml per card")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--samplers", default="tpe,random")
    ap.add_argument("--target", type=float, default=None, help="the best stable throughput of the space")
    ap.add_argument("--scan", action="store_true", help="find the target by an exhaustive pass over each profile's "
                    "grid (default: the card's documented optimum for that profile)")
    ap.add_argument("--with-try-first", action="store_true",
                    help="keep the profiles' search.try_first configs (default: the search on its own)")
    ap.add_argument("--scan-only", action="store_true", help="print each profile's best stable config and stop")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--parallel", type=int, default=1, help="trials in flight at once (tunectl search --parallel): "
                    "the sequential run and this one side by side")
    ap.add_argument("--warm-start", metavar="VERSION", default=None,
                    help="warm vs cold start after moving the profile (default: sim-glm5) to this SGLang version "
                    "(bench/warm_start.py)")
    ap.add_argument("--old-trials", type=int, default=40, help="--warm-start: trials of the old study")
    ap.add_argument("--budget", action="store_true", help="per card, where the trials before 95%% went: by proposer "
                    "(sampler, local step, repair step and the crash or log hint it answered) and outcome")
    ap.add_argument("--landscape", metavar="FILE", default=None, help="judge the search on a measured landscape "
                    "(landscape.json, replayed: bench/landscape_judge.py) instead of the sim cards")
    ap.add_argument("--client", default=None, help="--landscape: whose readings to replay (default: builtin)")
    ap.add_argument("--readings", default="launches", choices=("launches", "none"), help="--landscape: readings "
                    "drawn from the measured launches (launches) or each level's mean, no noise (none)")
    ap.add_argument("--slo", action="append", default=None, metavar="KEY=MS", help="--landscape: the objective "
                    "under this SLO on the table's latencies (p99_ttft_ms, median_ttft_ms, median_tpot_ms; their "
                    "means over a config's launches decide its true value)")
    ap.add_argument("--truth", action="store_true", help="noise on, finalists raced: the declared winner's true "
                    "value against the card's best, and the winner's curse (bench/winner_truth.py)")
    ap.add_argument("--noise-launch", type=float, default=None, metavar="SD", help="--truth: every card's "
                    "launch-to-launch noise (log-normal sd) in place of the card's noise.launch")
    ap.add_argument("--noise-level", type=float, default=None, metavar="SD", help="--truth: every card's "
                    "within-launch noise in place of the card's noise.level")
    ap.add_argument("--machine", type=float, default=None, metavar="SD", help="--truth: every card's machine "
                    "changes state (a speed shared by the launches run while it lasts; sim/noise.py) with this sd")
    ap.add_argument("--machine-launches", type=float, default=None, metavar="N", help="--truth: launches a machine "
                    "state lasts on average (default: the card's noise.machine_launches)")
    ap.add_argument("--label-machines", action="store_true", help="--truth --machine: each machine state recorded "
                    "as a machine of its own (as GPUs of a resumed study are), so the race takes its level out")
    ap.add_argument("--budget-reruns", type=int, default=None, help="--truth: the race's rerun budget (default: "
                    "the profile's search.finalists.budget)")
    ap.add_argument("--no-pool", action="store_true", help="search.pool off: each config ranked on its own readings "
                    "(the walk's incumbent and the race; search/pooling.py)")
    args = ap.parse_args()
    if args.no_pool:
        os.environ[NO_POOL] = "1"               # before the worker processes fork: they inherit it
    if args.truth:
        from bench import winner_truth

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            return winner_truth.main(args, pool)
    if args.landscape:
        from bench import landscape_judge

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            return landscape_judge.main(args, pool)
    if args.warm_start:
        from bench import warm_start

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            return warm_start.main(args, pool)
    paths = one_per_card() if args.profiles == "all" else args.profiles.split(",")
    t0 = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        goal = targets(paths, args, pool)
        if args.scan_only:
            return
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        widths = sorted({1, args.parallel})
        jobs = [(p, s, seed, args.trials, goal[p], args.with_try_first, w)
                for p in paths for s in args.samplers.split(",") for seed in seeds for w in widths]
        runs = pool.map(one_run, jobs, chunksize=1)
    results: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}
    for path in paths:
        rows = {s + ("" if w == 1 else f" x{w}"): summarize([r for j, r in zip(jobs, runs) if j[0] == path and
                                                             j[1] == s and j[6] == w], args.trials)
                for s in args.samplers.split(",") for w in widths}
        results[load_profile(path).server.sim.card] = (goal[path], rows)
        print_card(Path(path).name, goal[path], rows, args.seeds, unit(load_profile(path)))
        if args.budget:
            print_budget(rows)
    print_summary(results, args.trials, time.monotonic() - t0)


if __name__ == "__main__":
    from tunectl.errors import TunectlError

    try:
        sys.exit(main())
    except TunectlError as e:            # a bad profile path or field: one line, as the CLI says it
        sys.exit(f"search_efficiency: {e}")
