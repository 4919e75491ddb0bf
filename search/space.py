"""The profile's search space as Optuna distributions: knobs, conditions (`when`), the baseline, the grid.

A knob is sampled only while its `when` conditions hold (e.g. `cuda-graph-max-bs` only with graphs on), so the
params of a trial are exactly the knobs that were in effect; the baseline leaves the knobs the profile gives no base
value to the server (`UNSET_ATTR`). Which flag, patch or env variable a knob drives is
the trial engine's business: this module deals in knob names and values only.
"""
from __future__ import annotations

import json
import math
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from tunectl import knobs
from tunectl.profile import ParamSpec, Profile, SearchSpec


# a queued trial's user attribute: knobs it leaves to the server (no flag passed), not drawn
UNSET_ATTR = "unset"


def distribution(spec: ParamSpec) -> BaseDistribution:
    if spec.type == "bool":
        return CategoricalDistribution([False, True])
    if spec.type == "categorical" or spec.choices is not None:
        return CategoricalDistribution(list(spec.choices or []))
    assert spec.low is not None and spec.high is not None
    if spec.type == "int":
        step = int(spec.step or 1)
        return IntDistribution(int(spec.low), int(spec.high), log=spec.log and step == 1, step=step)
    step_f = None if spec.log else spec.step
    return FloatDistribution(float(spec.low), float(spec.high), log=spec.log, step=step_f)


def knob_order(space: dict[str, ParamSpec]) -> list[str]:
    """Knobs in declaration order, each after the knobs its conditions (`when`, or implied) refer to."""
    done: list[str] = []

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in stack:
            raise ValueError(f"search.space.{name}.when: circular condition via {' -> '.join(stack)}")
        for other in space[name].conditions:
            visit(other, (*stack, name))
        done.append(name)

    for knob in space:
        visit(knob, ())
    return done


def _matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, list):
        return value in wanted
    return bool(value == wanted)


def is_active(spec: ParamSpec, params: dict[str, Any]) -> bool:
    return all(other in params and _matches(params[other], want) for other, want in spec.conditions.items())


def suggest(trial: optuna.trial.BaseTrial, search: SearchSpec) -> dict[str, Any]:
    """Sample the active knobs of one trial (ask-and-tell). The knobs a trial was queued with as `UNSET_ATTR` (the
    baseline's knobs with no base value) are left out: their flags are not passed and the server picks its own."""
    params: dict[str, Any] = {}
    unset = set(getattr(trial, "user_attrs", {}).get(UNSET_ATTR) or ())
    for name in knob_order(search.space):
        spec = search.space[name]
        if name not in unset and is_active(spec, params):
            params[name] = _suggest_one(trial, name, distribution(spec))
    return params


def _suggest_one(trial: optuna.trial.BaseTrial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    assert isinstance(dist, FloatDistribution)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def baseline_params(prof: Profile) -> dict[str, Any]:
    """Trial 0: the profile's base values (ParamSpec.default, else the base flag/patch/env). Knobs whose base
    value is unknown are left out: the baseline leaves them to the server (`unset_in_baseline`)."""
    params: dict[str, Any] = {}
    for name in knob_order(prof.search.space):
        spec = prof.search.space[name]
        if not is_active(spec, params):
            continue
        value = knobs.base_value(name, spec, prof)
        if value is not None:
            params[name] = value
    return params


def unset_in_baseline(prof: Profile) -> list[str]:
    """The knobs active in the baseline that have no base value (no `default:`, no base flag, patch or env): the
    baseline leaves them to the server (`UNSET_ATTR`: SGLang picks its own value for the model and GPU), so that
    trial 0 is the server as the profile configures it, not a draw of the sampler's."""
    space, params = prof.search.space, baseline_params(prof)
    return [n for n in knob_order(space) if is_active(space[n], params) and n not in params]


def base_values(prof: Profile) -> dict[str, Any]:
    """Every knob's base value (ParamSpec.default, else the base flag/patch/env), active in the baseline or not:
    what a knob takes when a move makes it active (graphs switched on, a runner FlashInfer autotunes)."""
    values = {name: knobs.base_value(name, spec, prof) for name, spec in prof.search.space.items()}
    return {**{k: v for k, v in values.items() if v is not None}, **baseline_params(prof)}


def try_first_params(prof: Profile) -> list[dict[str, Any]]:
    """The profile's `search.try_first` configs, each completed from the base values; inactive knobs dropped."""
    out = []
    for cfg in prof.search.try_first:
        merged = {**base_values(prof), **cfg}
        params: dict[str, Any] = {}
        for name in knob_order(prof.search.space):
            if name in merged and is_active(prof.search.space[name], params):
                params[name] = merged[name]
        out.append(params)
    return out


def config_key(params: dict[str, Any]) -> str:
    """One string per configuration: the duplicate check compares these."""
    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True, default=str)


def _numeric_points(spec: ParamSpec, points: int) -> list[Any]:
    assert spec.low is not None and spec.high is not None
    lo, hi = spec.low, spec.high
    if spec.step and not spec.log:
        count = round((hi - lo) / spec.step) + 1
        if count <= 2 * points:
            return [type(lo)(round(lo + i * spec.step, 6)) if spec.type == "float" else int(lo + i * spec.step)
                    for i in range(count)]
    if spec.log:
        raw = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    else:
        raw = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    if spec.type == "int":
        step = int(spec.step or 1)
        return sorted({int(lo) + step * round((v - lo) / step) for v in raw})
    if spec.step and not spec.log:                   # on the knob's own step grid, as the sampler draws
        return sorted({round(lo + spec.step * round((v - lo) / spec.step), 6) for v in raw})
    return [round(v, 6) for v in raw]


# The grid the loop's own steps move on and the sampler's proposals are put on (search/sampler.py `snap`): this
# many points per numeric range, log-spaced where the knob is log.
GRID_POINTS = 6


def grid_space(search: SearchSpec, points: int = 4) -> dict[str, list[Any]]:
    """A finite grid for GridSampler: choices as they are, numeric ranges at `points` values (log-spaced where
    the knob is log)."""
    grid: dict[str, list[Any]] = {}
    for name, spec in search.space.items():
        if spec.type == "bool":
            grid[name] = [False, True]
        elif spec.choices is not None:
            grid[name] = list(spec.choices)
        else:
            grid[name] = _numeric_points(spec, max(2, points))
    return grid


def grid_size(grid: dict[str, list[Any]]) -> int:
    return math.prod(len(v) for v in grid.values()) if grid else 1
