"""Samplers: multivariate TPE with constraints (default), random, grid. All seeded.

Constraints reach TPE through `trial.set_constraint` (Optuna >= 5): infeasible trials fall in the "bad" group,
ordered by how much they violate, so crashing regions lose density as the study goes on.
"""
from __future__ import annotations

import random
from typing import Any

import optuna

from tunectl.profile import SearchSpec
from tunectl.search.space import distribution, grid_space, is_active, knob_order

# Random trials before TPE models the space. Optuna's default is 10; a smaller start pays off on 40-trial budgets
# (measured by bench/search_efficiency.py).
TPE_STARTUP = 6


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
