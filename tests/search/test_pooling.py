"""Evidence pooled across configs (search/pooling.py): a config's readings weighed against what the value model
predicts for it from the OTHER configs. Where the landscape follows the model, a lucky reading is shrunk toward its
knob values' worth and the config the race ranks first is the truly better one; where it does not (interactions the
additive model cannot draw), the misfit is measured large and each config keeps its own mean."""
from __future__ import annotations

import itertools
import math
import random

import optuna

from tests.search.test_finalists import _tell
from tunectl.profile import SearchSpec
from tunectl.search import finalists as fin
from tunectl.search import pooling

A, B = "attention-backend", "chunked-prefill-size"
SPACE = SearchSpec.model_validate({"space": {
    A: {"type": "categorical", "choices": ["fa3", "flashinfer", "triton"], "default": "triton"},
    B: {"type": "categorical", "choices": [1024, 2048, 4096, 8192], "default": 1024},
    "x": {"type": "categorical", "choices": [0, 1, 2, 3], "default": 0}}})
ATTN = {"fa3": 1.10, "flashinfer": 1.0, "triton": 0.80}
CHUNK = {1024: 0.90, 2048: 1.0, 4096: 1.06, 8192: 1.04}
XS = {0: 1.0, 1: 1.02, 2: 0.97, 3: 1.01}


def additive(p: dict) -> float:
    """Knob effects multiply (the value model's own shape): fa3 + 4096 + x=1 is the best config."""
    return 1000.0 * ATTN[p[A]] * CHUNK[p[B]] * XS[p["x"]]


def _configs(n: int, seed: int) -> list[dict]:
    grid = [dict(zip((A, B, "x"), v)) for v in itertools.product(ATTN, CHUNK, XS)]
    return random.Random(seed).sample(grid, n)


def _study(configs: list[dict], value, lucky: dict, luck: float, noise: float, seed: int) -> optuna.Study:
    """Each config read once with `noise` (log sd); `lucky` read `luck` above its value; the best two configs (by
    value) and the lucky one re-run twice, as a race would have."""
    rng = random.Random(seed)
    study = optuna.create_study(direction="maximize")
    space_choices = {k: list(s.choices) for k, s in SPACE.space.items()}
    top = sorted(configs, key=lambda p: -value(p))[:2]
    for i, p in enumerate(configs):
        reads = 3 if p in top or p == lucky else 1
        vals = [value(p) * math.exp(rng.gauss(0, noise)) for _ in range(reads)]
        if p == lucky:
            vals[0] = value(p) * luck
        n = _tell_config(study, p, vals[0], space_choices, role="baseline" if i == 0 else "search")
        for j, v in enumerate(vals[1:]):
            _tell_config(study, p, v, space_choices, role="finalist", finalist_of=n, rerun=j + 1)
    return study


def _tell_config(study: optuna.Study, params: dict, value: float, choices: dict, **attrs) -> int:
    study.enqueue_trial(params)
    t = study.ask()
    for k in params:
        t.suggest_categorical(k, choices[k])
    for k, v in attrs.items():
        t.set_user_attr(k, v)
    t.set_user_attr("objective_ci95", [value * 0.99, value * 1.01])
    t.set_constraint("crash", 0.0)
    study.tell(t, value)
    return t.number


def _ranked_first(study: optuna.Study, pooled: bool) -> fin.FinalistVerdict:
    pool = pooling.pool_for(SPACE, None) if pooled else None
    win = fin.winner(fin.verdicts(fin.standings(study.get_trials(), 0.05, pool)))
    assert win is not None
    return win


def test_a_lucky_reading_is_weighed_against_what_its_knob_values_are_worth() -> None:
    # 24 configs of an additive landscape read once with 5% noise; a config worth at most 93% of the best reads
    # 35% above the best on its search run and about its value on two reruns: its mean rivals the best configs',
    # its pooled estimate does not. A miss: the config ranked first is worth less than 97% of the best.
    misses = {True: 0, False: 0}
    for seed in range(8):
        configs = _configs(24, seed)
        best = max(map(additive, configs))
        lucky = next(p for p in configs if additive(p) < 0.93 * best)
        study = _study(configs, additive, lucky, luck=1.35 * best / additive(lucky), noise=0.05, seed=seed)
        for pooled in (True, False):
            misses[pooled] += additive(_ranked_first(study, pooled).params) < 0.97 * best
    assert misses[False] >= 3                   # the lucky config's mean wins on its own readings
    assert misses[True] == 0


def test_the_estimate_shrinks_a_lucky_reading_toward_the_prediction_and_keeps_a_consistent_one() -> None:
    configs = _configs(24, 1)
    best = max(configs, key=additive)
    lucky = min(configs, key=additive)
    launches = [(p, [additive(p) * (1.35 if p == lucky else 1.0)]) for p in configs]
    est, tau = pooling.estimates(SPACE, None, launches, 0.05)
    by = {json_key(p): e for (p, _), e in zip(launches, est)}
    assert tau < 0.1                                         # the model draws this landscape: it is trusted
    lucky_est = math.exp(by[json_key(lucky)][0])
    assert additive(lucky) < lucky_est < 0.8 * 1.35 * additive(lucky) + 0.2 * additive(lucky)   # a fifth taken back
    assert abs(math.exp(by[json_key(best)][0]) / additive(best) - 1) < 0.03   # a reading the model agrees with


def test_a_landscape_the_model_cannot_draw_leaves_each_config_its_own_mean() -> None:
    # every config's value drawn at random (+-30%): no knob explains anything, the misfit is measured large and
    # each estimate stays within a few percent of the config's own readings
    rng = random.Random(7)
    configs = _configs(24, 2)
    value = {json_key(p): 1000.0 * math.exp(rng.gauss(0, 0.3)) for p in configs}
    launches = [(p, [value[json_key(p)]]) for p in configs]
    est, tau = pooling.estimates(SPACE, None, launches, 0.05)
    assert tau > 0.15
    for (p, vals), e in zip(launches, est):
        assert e is not None and abs(math.exp(e[0]) / vals[0] - 1) < 0.06


def test_too_few_configs_are_not_pooled() -> None:
    launches = [(p, [additive(p)]) for p in _configs(pooling.MIN_CONFIGS - 1, 3)]
    est, tau = pooling.estimates(SPACE, None, launches, 0.05)
    assert est == [None] * len(launches) and tau == math.inf


def test_pool_off_ranks_by_each_configs_own_mean() -> None:
    configs = _configs(24, 4)
    best = max(map(additive, configs))
    lucky = min((p for p in configs if additive(p) < 0.93 * best), key=lambda p: -additive(p))
    study = _study(configs, additive, lucky, luck=1.35 * best / additive(lucky), noise=0.02, seed=4)
    # three readings of the lucky config: 1.35x the best, then about its value twice: its mean tops the table
    off = fin.verdicts(fin.standings(study.get_trials(), 0.05, None))
    assert all(v.estimate == v.score for v in off)
    assert _ranked_first(study, pooled=False).params == lucky
    assert additive(_ranked_first(study, pooled=True).params) >= 0.97 * best


def json_key(p: dict) -> tuple:
    return tuple(sorted(p.items()))


assert _tell  # the finalists tests' helper: same study shape
