"""Samplers: multivariate TPE with constraints (default), random, grid. All seeded.

Constraints reach TPE through `trial.set_constraint` (Optuna >= 5): infeasible trials fall in the "bad" group,
ordered by how much they violate, so crashing regions lose density as the study goes on.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
from tunectl.search.space import distribution, grid_space, is_active, knob_order

from tunectl.profile import SearchSpec

# Random trials before TPE models the space. Optuna's default is 10; a smaller start pays off on 40-trial budgets
# (measured by bench/search_efficiency.py).
TPE_STARTUP = 6
# Once LOCAL_AFTER trials are done, every LOCAL_EVERY-th trial is a step from the incumbent (the best feasible
# config): one or two knobs changed, ranked by a ridge regression of the value on the knob values times the odds of
# not being wasted. TPE alone is weak on 40-trial budgets where the best needs several knobs right at once; local
# steps alone get stuck (bench/search_efficiency.py measured both).
LOCAL_EVERY = 2
LOCAL_AFTER = 2
# A sampler proposal whose startup-crash odds reach VETO_RISK is dropped unrun, at most MAX_VETOES times in a row.
VETO_RISK = 0.6
MAX_VETOES = 10


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


def complete(search: SearchSpec, params: dict[str, Any], rng: random.Random,
             fill: dict[str, Any] | None = None) -> dict[str, Any]:
    """Drop knobs whose condition no longer holds; those that became active take their value in `fill` (the
    baseline: a value known to start), else a random one."""
    out: dict[str, Any] = {}
    drawn = {**random_params(search, rng), **(fill or {})}
    for name in knob_order(search.space):
        if is_active(search.space[name], out):
            out[name] = params[name] if name in params else drawn.get(name)
    return {k: v for k, v in out.items() if v is not None}


History = list[tuple[dict[str, Any], str, float]]   # (params, outcome: ok|startup|load|pruned, stable value)


def _odds(params: dict[str, Any], rows: list[tuple[dict[str, Any], bool]]) -> float:
    """Naive Bayes in log-odds: the rows' rate, moved by each knob value of the config (a value seen mostly in
    positive rows raises the odds, one seen in negative rows lowers them; per-value rates are shrunk toward the
    overall rate so a value seen once does not decide alone)."""
    base = (sum(y for _, y in rows) + 0.5) / (len(rows) + 1.0)
    prior = math.log(base / (1.0 - base))
    logit = prior
    for name, value in params.items():
        same = [y for p, y in rows if p.get(name) == value]
        rate = (sum(same) + PRIOR_WEIGHT * base) / (len(same) + PRIOR_WEIGHT)
        logit += math.log(rate / (1.0 - rate)) - prior
    return 1.0 / (1.0 + math.exp(-logit))


def startup_risk(params: dict[str, Any], history: History) -> float:
    """Startup-crash odds; 1.0 when one of the config's knob values crashed at startup every time (at least
    twice), e.g. a backend the hardware does not support."""
    for name, value in params.items():
        same = [out for p, out, _ in history if p.get(name) == value]
        if len(same) >= 2 and all(out == "startup" for out in same):
            return 1.0
    return _odds(params, [(p, out == "startup") for p, out, _ in history])


def crash_risk(params: dict[str, Any], history: History) -> float:
    """Odds that a config is wasted: startup crashes learned from every trial; load crashes and pruning (clearly
    slow) from the trials that started (a config that never served says nothing about its behaviour under load)."""
    startup = startup_risk(params, history)
    load = _odds(params, [(p, out in ("load", "pruned")) for p, out, _ in history if out != "startup"])
    return 1.0 - (1.0 - startup) * (1.0 - load)


PRIOR_WEIGHT = 2.0
RIDGE = 1.0
UNSEEN_BONUS = 0.02


def predicted_value(params: dict[str, Any], history: History) -> float:
    """A ridge regression of the value on the knob values (one-hot, additive) over the configs that served
    fully; values never served get a small bonus so the walk explores them; discounted by the waste odds."""
    ok = [(p, v) for p, out, v in history if out == "ok"]
    if not ok:
        return 0.0
    features = sorted({(k, json.dumps(v, default=str)) for p, _ in ok for k, v in p.items()})
    col = {f: i for i, f in enumerate(features)}
    x = np.zeros((len(ok), len(features)))
    for i, (p, _) in enumerate(ok):
        for k, v in p.items():
            x[i, col[(k, json.dumps(v, default=str))]] = 1.0
    y = np.array([v for _, v in ok])
    mean = float(y.mean())
    w = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(features)), x.T @ (y - mean))
    score = mean
    for k, v in params.items():
        i = col.get((k, json.dumps(v, default=str)))
        score += float(w[i]) if i is not None else UNSEEN_BONUS * mean
    return score * (1.0 - crash_risk(params, history))


def neighbours(search: SearchSpec, incumbent: dict[str, Any], seen: set[str], rng: random.Random,
               fill: dict[str, Any], explain: Callable[[dict[str, Any]], History]) -> list[dict[str, Any]]:
    """Unseen configs one or two knobs away from the incumbent, the most promising (value x not wasted) first.
    Knobs that become active take their value in `fill`; `explain(cand)`: the history as it bears on that
    candidate (crashes it repairs left out)."""
    from tunectl.search.space import config_key

    grid = grid_space(search, points=6)
    singles = [(name, alt) for name in incumbent for alt in _alternatives(search, name, incumbent[name], grid)]
    inactive = [(n, v) for n in search.space if n not in incumbent for v in grid[n]]
    moves: list[list[tuple[str, Any]]] = [[m] for m in singles]
    moves += [[a, b] for i, a in enumerate(singles + inactive) for b in (singles + inactive)[i + 1:] if a[0] != b[0]]
    out, keys = [], set(seen)
    for move in moves:
        cand = complete(search, {**incumbent, **dict(move)}, rng, fill)
        key = config_key(cand)
        if key not in keys:
            keys.add(key)
            out.append((-predicted_value(cand, explain(cand)), len(move), rng.random(), cand))
    return [c for *_, c in sorted(out, key=lambda x: x[:3])]

