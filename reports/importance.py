"""Parameter importance on pooled values: every config counts once with the mean objective over its fresh
launches (the search run and the finalists' reruns), and a knob is ranked only where its effect stands out of the
launch-to-launch noise; where none does, the report says the noise swamps the effect instead of ranking. (Optuna's
evaluators read each trial's single reading: one lucky launch could rank a knob first.)"""
from __future__ import annotations

import statistics
from typing import Any

from tunectl.models import TrialResult

Z = 3.0                 # standard errors an effect must clear: the highest and lowest of several groups are compared
PRIOR_NOISE = 0.05      # launch-to-launch sd assumed without the race's own measure (real GPUs, docs/real-gpu.md)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def importance(trials: list[TrialResult], prof: Any = None, noise: float | None = None) -> dict[str, Any]:
    """Per knob, how much the objective moves across its values, on pooled values (every config once, the mean
    over its fresh launches: a lucky single reading weighs what one launch weighs), ranked only where the effect
    stands out of the noise; where no knob's does, no ranking and `note` says so. `noise`: the relative
    launch-to-launch sd (the race's, best.json), else measured from the configs launched twice or more."""
    rows = pooled_configs(trials, prof)
    if len(rows) < 3 or not any(p for p, _, _ in rows):
        return {"method": "none", "values": {}, "note": ""}
    sd = noise if noise is not None else PRIOR_NOISE
    effects = {k: effect(rows, k, sd) for k in sorted({k for p, _, _ in rows for k in p})}
    shown = {k: e for k, (e, ok) in effects.items() if ok and e > 0}
    swamped = sorted(k for k, (e, ok) in effects.items() if not ok)
    total = sum(shown.values())
    values = {k: v / total for k, v in sorted(shown.items(), key=lambda kv: -kv[1])} if total > 0 else {}
    note = (f"noise swamps the effect: no knob moves the objective beyond the launch-to-launch noise (~{sd:.0%} "
            f"per launch) over {len(rows)} configs; no ranking" if not values else
            f"within the noise (not ranked): {', '.join(swamped)}" if swamped else "")
    return {"method": f"pooled spread over {len(rows)} configs", "values": values, "note": note,
            "swamped": swamped, "noise": sd}


def pooled_configs(trials: list[TrialResult], prof: Any = None) -> list[tuple[dict[str, Any], float, int]]:
    """(params, mean objective over its finished launches, launches) per config; crashed and pruned launches
    count with the value of their stable levels, as the search was told."""
    from tunectl.reports.data import objective

    groups: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for t in trials:
        if t.status in ("ok", "crashed", "pruned") and t.params:
            value = objective(t, prof).value if t.stable_levels else 0.0
            groups.setdefault(repr(sorted(t.params.items())), (dict(t.params), []))[1].append(value)
    return [(p, statistics.fmean(v), len(v)) for p, v in groups.values()]


def effect(rows: list[tuple[dict[str, Any], float, int]], knob: str, sd: float) -> tuple[float, bool]:
    """(max - min of the group means across the knob's values, whether it stands out of the noise): the two
    groups' means differ by more than Z times their combined standard error (config-to-config spread within a group,
    never below the launch noise over the group's launches)."""
    having = [(p[knob], v, n) for p, v, n in rows if knob in p]
    nums = [x for x, _, _ in having if _is_num(x)]
    cut = statistics.median(nums) if len(nums) == len(having) and len(set(nums)) > 2 else None
    groups: dict[str, list[tuple[float, int]]] = {}
    for x, v, n in having:
        key = ("low" if x <= cut else "high") if cut is not None else repr(x)
        groups.setdefault(key, []).append((v, n))
    if len(groups) < 2:
        return 0.0, False
    stats = [_group(g, sd) for g in groups.values()]
    hi, lo = max(stats), min(stats)
    return hi[0] - lo[0], hi[0] - lo[0] > Z * (hi[1] ** 2 + lo[1] ** 2) ** 0.5


def _group(g: list[tuple[float, int]], sd: float) -> tuple[float, float]:
    """(mean, standard error) of a group of configs' pooled values."""
    m = statistics.fmean(v for v, _ in g)
    between = statistics.stdev(v for v, _ in g) / len(g) ** 0.5 if len(g) > 1 else m
    floor = sd * m / sum(n for _, n in g) ** 0.5
    return m, max(between, floor)
