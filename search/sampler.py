"""Samplers: multivariate TPE with constraints (default), random, grid. All seeded.

Constraints reach TPE through `trial.set_constraint` (Optuna >= 5): infeasible trials fall in the "bad" group,
ordered by how much they violate, so crashing regions lose density as the study goes on.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import optuna
from tunectl.search.space import GRID_POINTS, distribution, grid_space, is_active, knob_order
from tunectl.search.surrogate import Admission, History, Surrogate, ordered, position

from tunectl.profile import SearchSpec

# Random trials before TPE models the space. Optuna's default is 10; a smaller start pays off on 40-trial budgets
# (measured by bench/search_efficiency.py).
TPE_STARTUP = 6
# Once LOCAL_AFTER trials are done, every trial is a repair or a step from the incumbent (the best feasible config):
# one or two knobs changed, ranked by a ridge regression of the value on the knob values times the odds of not being
# wasted; the sampler proposes only when the loop has none (no served config yet, or every neighbour run or vetoed).
# Evidence (bench/search_efficiency.py, every card; the history in docs/search.md, "The search's rounds"): TPE's own
# proposals lost to the steps on every card, and steps from the first trial on, with no random start, took the
# fewest trials to 95%.
LOCAL_AFTER = 1
# A sampler proposal whose startup-crash odds reach VETO_RISK is dropped unrun; after MAX_VETOES in a row the loop
# queues an unseen random config the vetoes allow instead (none left: the search is exhausted).
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
    """Values one step away: other choices of a categorical knob; for an ordered knob (numbers) the grid
    neighbours on each side and the ones after them."""
    spec = search.space[name]
    values = grid[name]
    if not ordered(spec):
        return [v for v in values if v != value]
    ordered_values = sorted(values)
    below = [v for v in ordered_values if v < value]
    above = [v for v in ordered_values if v > value]
    return below[-2:][::-1] + above[:2]


def snap(search: SearchSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The config with each value of a ranged int or float knob moved to its nearest grid point (by position in
    the range, so log scale where the knob's range is wide); choices and bools as they are. Ordered knobs are
    proposed on the grid the local steps and repairs move on: at a 40-trial budget a value a few percent off a
    grid point (max-running 1020 next to 1024) costs a whole trial for little new information."""
    grid = grid_space(search, points=GRID_POINTS)
    out = {}
    for name, value in params.items():
        spec = search.space[name]
        if spec.choices is None and ordered(spec) and value not in grid[name]:
            here = position(spec, value)
            value = min(grid[name], key=lambda g: abs(position(spec, g) - here))
        out[name] = value
    return out


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


def neighbours(search: SearchSpec, incumbent: dict[str, Any], seen: set[str], rng: random.Random,
               fill: dict[str, Any], history: History,
               excluded: Callable[[dict[str, Any]], frozenset[int]],
               flat: set[str] | frozenset[str] = frozenset(),
               admission: Admission | None = None) -> list[dict[str, Any]]:
    """Unseen configs one or two knobs away from the incumbent, the most promising (value x not wasted) first.
    Knobs that become active take their value in `fill`; `excluded(cand)`: the history rows that say nothing
    about that candidate (crashes it repairs); `flat`: knobs already moved alone with no effect (moved only
    together with another); `admission`: the value model's batch cap (search/surrogate.py). One surrogate is
    fitted per distinct exclusion."""
    from tunectl.search.space import config_key

    grid = grid_space(search, points=GRID_POINTS)
    singles = [(name, alt) for name in incumbent for alt in _alternatives(search, name, incumbent[name], grid)]
    inactive = [(n, v) for n in search.space if n not in incumbent for v in grid[n]]
    moves: list[list[tuple[str, Any]]] = [[m] for m in singles if m[0] not in flat]
    moves += [[a, b] for i, a in enumerate(singles + inactive) for b in (singles + inactive)[i + 1:] if a[0] != b[0]]
    models: dict[frozenset[int], Surrogate] = {}
    out, keys = [], set(seen)
    for move in moves:
        cand = complete(search, {**incumbent, **dict(move)}, rng, fill)
        key = config_key(cand)
        if key in keys:
            continue
        keys.add(key)
        gone = excluded(cand)
        if gone not in models:
            models[gone] = Surrogate(search, [r for i, r in enumerate(history) if i not in gone], admission)
        out.append((-models[gone].score(cand), len(move), rng.random(), cand))
    return [c for *_, c in sorted(out, key=lambda x: x[:3])]
