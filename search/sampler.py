"""Samplers: multivariate TPE with constraints (default), random, grid. All seeded.

Constraints reach TPE through `trial.set_constraint` (Optuna >= 5): infeasible trials fall in the "bad" group,
ordered by how much they violate, so crashing regions lose density as the study goes on.
"""
from __future__ import annotations

import random
from typing import Any

import optuna
from tunectl.search.space import distribution, grid_space, is_active, knob_order

from tunectl.profile import SearchSpec

# Random trials before TPE models the space. Optuna's default is 10; a smaller start pays off on 40-trial budgets
# (measured by bench/search_efficiency.py).
TPE_STARTUP = 6
# After the start, every LOCAL_EVERY-th trial is a step around the incumbent (best feasible config so far): one or
# two knobs changed, the least crash-prone first. TPE alone is weak on small budgets in spaces where the best
# needs several knobs right at once (bench/search_efficiency.py shows the difference).
LOCAL_EVERY = 2


def make_sampler(search: SearchSpec, seed: int | None, multi_objective: bool = False,
                 kind: str | None = None) -> optuna.samplers.BaseSampler:
    kind = kind or search.sampler
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return optuna.samplers.GridSampler(grid_space(search), seed=seed)
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=TPE_STARTUP)


def random_params(search: SearchSpec, rng: random.Random) -> dict[str, Any]:
    """One uniformly drawn configuration (used to step off a sampler stuck on configs already run)."""
    params: dict[str, Any] = {}
    for name in knob_order(search.space):
        spec = search.space[name]
        if not is_active(spec, params):
            continue
        dist = distribution(spec)
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            params[name] = rng.choice(list(dist.choices))
        elif isinstance(dist, optuna.distributions.IntDistribution):
            params[name] = rng.randrange(dist.low, dist.high + 1, dist.step)
        else:
            assert isinstance(dist, optuna.distributions.FloatDistribution)
            params[name] = rng.uniform(dist.low, dist.high)
    return params


def _alternatives(search: SearchSpec, name: str, value: Any, grid: dict[str, list[Any]]) -> list[Any]:
    """Values one step away: other choices of a categorical knob, the grid neighbours of a numeric one."""
    spec = search.space[name]
    values = grid[name]
    if spec.type in ("bool", "categorical") or spec.choices is not None:
        return [v for v in values if v != value]
    ordered = sorted(values)
    below = [v for v in ordered if v < value]
    above = [v for v in ordered if v > value]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _complete(search: SearchSpec, params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Drop knobs whose condition no longer holds, draw those that became active."""
    out: dict[str, Any] = {}
    drawn = random_params(search, rng)
    for name in knob_order(search.space):
        if is_active(search.space[name], out):
            out[name] = params[name] if name in params else drawn.get(name)
    return {k: v for k, v in out.items() if v is not None}


History = list[tuple[dict[str, Any], bool, float]]   # (params, crashed, stable value)


def crash_risk(params: dict[str, Any], history: History) -> float:
    """Crash odds of a config from the crash rate of each of its knob values in the history (Laplace-smoothed);
    the riskiest knob value decides. (Weighting the configs near the candidate instead measured worse in
    bench/search_efficiency.py: 3/10 vs 5/10 seeds reaching 95% within 40 trials.)"""
    risk = 0.0
    for name, value in params.items():
        same = [crashed for p, crashed, _ in history if p.get(name) == value]
        risk = max(risk, (sum(same) + 0.5) / (len(same) + 1.0))
    return risk



UNSEEN_BONUS = 0.02


def predicted_value(params: dict[str, Any], history: History) -> float:
    """An additive main-effects guess of a config's value from the feasible history (shrunk to the mean; values
    never tried get a small bonus so the walk explores them), discounted by its crash odds."""
    ok = [v for _, crashed, v in history if not crashed]
    if not ok:
        return 0.0
    overall = sum(ok) / len(ok)
    score = overall
    for name, value in params.items():
        vals = [v for p, crashed, v in history if not crashed and p.get(name) == value]
        score += (sum(vals) + overall) / (len(vals) + 1) - overall if vals else UNSEEN_BONUS * overall
    return score * (1.0 - crash_risk(params, history))


def neighbours(search: SearchSpec, incumbent: dict[str, Any], seen: set[str], rng: random.Random,
               history: History) -> list[dict[str, Any]]:
    """Unseen configs one or two knobs away from the incumbent, the most promising (value x survival) first."""
    from tunectl.search.space import config_key

    grid = grid_space(search, points=6)
    singles = [(name, alt) for name in incumbent for alt in _alternatives(search, name, incumbent[name], grid)]
    inactive = [(n, v) for n in search.space if n not in incumbent for v in grid[n]]
    moves: list[list[tuple[str, Any]]] = [[m] for m in singles]
    moves += [[a, b] for i, a in enumerate(singles + inactive) for b in (singles + inactive)[i + 1:] if a[0] != b[0]]
    out, keys = [], set(seen)
    for move in moves:
        cand = _complete(search, {**incumbent, **dict(move)}, rng)
        key = config_key(cand)
        if key not in keys:
            keys.add(key)
            out.append((-predicted_value(cand, history), len(move), rng.random(), cand))
    return [c for *_, c in sorted(out, key=lambda x: x[:3])]

