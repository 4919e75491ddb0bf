"""Speculative decoding found per objective: a search on the low-concurrency profile must pick it, one on the
high-concurrency profile must leave it off (docs/search.md "Speculative decoding").

For each profile: the card's best over the profile's grid (noise-free, exhaustive: bench/search_efficiency.py's
scan), the best without speculative decoding and the best with it; then `--seeds` full searches (`run_search` on the
virtual model, the card's noise on, the finalists' race as configured), each winner's true (noise-free) value
against the card's best, and whether the winner speculates.

    python bench/spec_crossover.py [--seeds 5] [--trials 40] [--jobs 2]
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from search_efficiency import _scan_chunk, grid_configs  # noqa: E402

from tunectl.profile import load_profile  # noqa: E402
from tunectl.wiring.study import run_search  # noqa: E402
from tunectl.wiring.virtual import VirtualEvaluator  # noqa: E402

PROFILES = ("profiles/sim-llama8b-spec.yaml", "profiles/sim-llama8b-spec-high.yaml")


def speculates(params: dict[str, Any]) -> bool:
    return params.get("speculative-algorithm", "none") != "none"


def scan(path: str, pool: Any, jobs: int) -> dict[str, tuple[float, dict[str, Any]]]:
    """The grid's best overall, without and with speculative decoding (noise-free, stable on 2 seeds)."""
    configs = grid_configs(load_profile(path))
    out = {}
    for label, part in (("off", [c for c in configs if not speculates(c)]),
                        ("on", [c for c in configs if speculates(c)])):
        size = max(1, len(part) // (4 * jobs))
        best = max(pool.map(_scan_chunk, [(path, part[i:i + size], 2) for i in range(0, len(part), size)]),
                   key=lambda r: r[0])
        out[label] = (best[0], best[1])
    out["all"] = max(out.values(), key=lambda r: r[0])
    return out


def search(job: tuple[str, int, int]) -> dict[str, Any]:
    path, seed, trials = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    prof = load_profile(path)
    with tempfile.TemporaryDirectory() as root:
        res = run_search(prof, trials=trials, root=root, evaluate=VirtualEvaluator(prof, seed), seed=seed,
                         storage_url=f"memory:{path}:{seed}")
    params = dict(res.best["params"]) if res.best else {}
    true = VirtualEvaluator(prof, 0, noise=0.0)(0, params, "search").best_output_throughput if params else 0.0
    return {"seed": seed, "params": params, "true": true}


def short(params: dict[str, Any]) -> str:
    if not speculates(params):
        return "off"
    keys = ("speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk",
            "speculative-num-draft-tokens")
    text = " ".join(str(params[k]) for k in keys if k in params)     # algorithm, steps, topk, draft tokens
    draft = params.get("speculative-draft-model-path")
    return text + (f" ({draft.split('/')[-1].split('-')[0]} draft)" if draft else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with multiprocessing.Pool(args.jobs) as pool:
        for path in PROFILES:
            best = scan(path, pool, args.jobs)
            top = best["all"][0]
            print(f"\n{path}: card's best {top:,.0f} tok/s ({short(best['all'][1])}); best without speculative "
                  f"decoding {best['off'][0]:,.0f}, with {best['on'][0]:,.0f} ({short(best['on'][1])})")
            runs = pool.map(search, [(path, s, args.trials) for s in range(args.seeds)])
            print("| seed | winner's speculative config | winner's true tok/s | of the card's best |")
            print("|---|---|---|---|")
            for r in runs:
                print(f"| {r['seed']} | {short(r['params'])} | {r['true']:,.0f} | {r['true'] / top:.1%} |")


if __name__ == "__main__":
    main()
