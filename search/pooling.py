"""Evidence pooled across configs: each config's own launches, shrunk toward what the value model predicts for it
from every OTHER config's readings (empirical Bayes).

Why: under launch-to-launch noise (~5% on real GPUs) a config's few launches cannot tell apart configs 1-2% apart,
and the best single reading of many is the luckiest (the winner's curse). Configs that share knob values inform each
other: when the study's readings follow the value model (search/surrogate.py) closely, a config that read far above
what its knob values predict is more likely lucky than great. How far to trust the model is measured, not assumed:

- `loo`: for each config, the model fitted on every launch of every other config (leave one config out), so a config
  never predicts itself;
- the model's misfit `tau` (log scale): the spread of configs' own means around their leave-one-out predictions,
  less the part their launch noise explains (never below TAU_FLOOR). A landscape the additive model draws badly (knob
  interactions) gives a large misfit, and the estimates stay each config's own mean;
- each config's estimate weighs its own mean (precision n / noise^2) and the prediction (precision 1 / tau^2); its
  95% interval is the posterior's. A config with more launches leans on its own readings.

Below MIN_CONFIGS configs with a value there is no model worth the name: no pooling (each config's own launches).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from statistics import fmean, stdev
from typing import Any

from tunectl.profile import SearchSpec
from tunectl.search.surrogate import Admission, ValueModel

MIN_CONFIGS = 8         # configs with a value before the model is trusted at all
TAU_FLOOR = 0.01        # the model is never trusted beyond 1% (log scale) for a config it did not see

Launches = list[tuple[dict[str, Any], list[float]]]     # per config: its params and its launches' values
Prediction = tuple[float, float]                         # (log value, leverage) from the other configs


def loo(search: SearchSpec, admission: Admission | None, configs: Launches) -> list[Prediction | None]:
    """Each config's log value as the model fitted on the other configs' launches predicts it, with its leverage
    (the prediction's variance in units of the readings' variance). One fit: leaving out a config's k identical
    rows (x, leverage h = x'(X'X + ridge)^-1 x) moves its prediction to mean(y) - mean(residual) / (1 - k h) and its
    leverage to h / (1 - k h) (the ridge's intercept kept, a fraction of a percent)."""
    rows = [(p, v) for p, vals in configs for v in vals if v > 0]
    with_values = sum(1 for _, vals in configs if vals and min(vals) > 0)
    if with_values < MIN_CONFIGS:
        return [None] * len(configs)
    model = ValueModel(search, rows, admission)
    out: list[Prediction | None] = []
    i = 0
    for p, vals in configs:
        k = sum(1 for v in vals if v > 0)
        if k == 0:
            out.append(None)
            continue
        x, y = model.x[i], model.y[i:i + k]
        i += k
        h = float(x @ model.fit_inv @ x)
        resid = float((y - model.mean - x @ model.w).mean())
        out.append((float(y.mean()) - resid / (1 - k * h), h / (1 - k * h)))
    return out


def misfit(configs: Launches, preds: list[Prediction | None], noise: float) -> float:
    """The model's own error (log sd) for a config it did not see: from each config's distance to its leave-one-out
    prediction, less what its launch noise and the fit's uncertainty explain; the mean plus one standard error (the
    model is trusted only as far as the study shows it), at least TAU_FLOOR."""
    each = []
    for (_, vals), pred in zip(configs, preds):
        if pred is None or not vals or min(vals) <= 0:
            continue
        r, h = math.log(fmean(vals)) - pred[0], pred[1]
        each.append((r * r - noise ** 2 * (1 / len(vals) + h)) / (1 + h))
    if len(each) < 2:
        return math.inf
    tau2 = fmean(each) + stdev(each) / math.sqrt(len(each))
    return max(math.sqrt(max(tau2, 0.0)), TAU_FLOOR)


def estimates(search: SearchSpec, admission: Admission | None, configs: Launches,
              noise: float) -> tuple[list[tuple[float, float] | None], float]:
    """Per config (log estimate, log sd) pooled with the model, None where no value or no model; and the misfit."""
    with_values = [c for c in configs if c[1] and min(c[1]) > 0]
    if len(with_values) < MIN_CONFIGS:
        return [None] * len(configs), math.inf
    preds = loo(search, admission, configs)
    tau = misfit(configs, preds, noise)
    out: list[tuple[float, float] | None] = []
    for (_, vals), pred in zip(configs, preds):
        if not vals or min(vals) <= 0 or pred is None or not math.isfinite(tau):
            out.append(None)
            continue
        own = len(vals) / noise ** 2
        prior = 1.0 / (tau ** 2 * (1 + pred[1]) + noise ** 2 * pred[1])
        out.append(((own * math.log(fmean(vals)) + prior * pred[0]) / (own + prior), 1.0 / math.sqrt(own + prior)))
    return out, tau


Pool = Callable[[Launches, float], tuple[list[tuple[float, float] | None], float]]


def pool_for(search: SearchSpec, admission: Admission | None) -> Pool:
    return lambda configs, noise: estimates(search, admission, configs, noise)
