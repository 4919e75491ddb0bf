"""A baseline's knobs as the server ran them: the knobs it left to SGLang (`space.UNSET_ATTR`: no `default:` in the
profile, no base flag) at the value SGLang chose, read from its log (tunectl/sglang/memory.py `resolved`), moved
onto the knob's range or nearest choice.

The local steps, the repairs and the vetoes walk from configs whose every active knob has a value; a baseline with
knobs left to SGLang has none for them, so a step from it would leave them for the sampler to draw (a one-knob step
turned into a random several-knob move). The rules read the history through `effective`; the race and the records
keep the trials' own params (what was passed to the server).
"""
from __future__ import annotations

import copy
import math
from typing import Any

from optuna.trial import FrozenTrial
from tunectl.search.repair import drives, numeric
from tunectl.search.space import UNSET_ATTR, distribution
from tunectl.search.trials import facts

from tunectl.profile import ParamSpec, SearchSpec
from tunectl.sglang.memory import resolved


def nearest(spec: ParamSpec, value: float) -> Any:
    """`value` as the knob can take it: the nearest numeric choice (by ratio), or clamped into the range; None for
    a knob that takes no number."""
    if spec.choices is not None:
        nums = [c for c in spec.choices if numeric([c])]
        return min(nums, key=lambda c: abs(math.log(max(c, 1e-9) / max(value, 1e-9)))) if nums else None
    if spec.type not in ("int", "float") or spec.low is None or spec.high is None:
        return None
    v = min(max(value, spec.low), spec.high)
    return int(round(v)) if spec.type == "int" else float(v)


def chosen(search: SearchSpec, unset: list[str], server_facts: dict[str, float]) -> dict[str, tuple[int, Any]]:
    """For each knob left to the server whose value its log tells: (the value SGLang chose, the value the walk starts
    from: the same when the space has it, else the nearest it has)."""
    chose = resolved(server_facts)
    out: dict[str, tuple[int, Any]] = {}
    for name in unset:
        spec = search.space.get(name)
        raw = next((v for flag, v in chose.items() if spec is not None and drives(name, spec, flag)), None)
        if spec is not None and raw is not None:
            near = nearest(spec, raw)
            if near is not None:
                out[name] = (raw, near)
    return out


def effective_params(search: SearchSpec, t: FrozenTrial) -> dict[str, Any]:
    """The trial's params, with each knob it left to the server at the value the server's log says it chose."""
    unset = t.user_attrs.get(UNSET_ATTR)
    if not unset:
        return t.params
    return {**t.params, **{name: near for name, (_, near) in chosen(search, unset, facts(t)).items()}}


def effective(search: SearchSpec, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The history as the rules read it: trials that left knobs to the server carry the values it chose (copies;
    the study's trials are not changed)."""
    out = []
    for t in trials:
        params = effective_params(search, t)
        if params is t.params:
            out.append(t)
            continue
        c = copy.copy(t)
        c.params = params
        c.distributions = {**t.distributions, **{k: distribution(search.space[k]) for k in params
                                                   if k not in t.distributions}}
        out.append(c)
    return out
