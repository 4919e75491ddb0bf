"""The loop's own model of the study: a value regression and waste odds, fitted once per history.

- Value: Bayesian ridge regression of log throughput on the knob values of the configs that served fully. Ordered
  knobs (int, float, and categoricals whose choices are all numbers) enter as their position in the range (log
  scale where the range spans a factor of 8 or more) and its square, so the model can extrapolate along them and
  find an interior optimum; categorical knobs enter one-hot, a knob that is off as its own column. The knob that
  caps the running batch (max-running-requests) also enters as log(min(value, C) / C), C the most requests the
  ladder keeps in flight: below C the cap throttles every batch the top levels run, above it it does nothing, a
  hinge no quadratic draws (without it, a config capped at 74 running requests that served 38% of the best taught
  the model that its MoE runner was slow). Candidates are ranked by an upper bound (mean + EXPLORE standard
  deviations), so what the study knows least gets tried first.
- Waste odds: naive Bayes in log-odds over knob values (startup crashes from every trial; load crashes, pruning and
  KV-pool retractions from the trials that started), per-value rates shrunk toward the overall rate.
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tunectl.profile import ParamSpec, SearchSpec

History = list[tuple[dict[str, Any], str, float]]   # (params, outcome, stable value); outcome: ok, startup,
                                                    # explained (a startup crash with catalog repairs), load, pruned
Admission = tuple[str, float]                       # (the knob that caps the running batch, most requests in flight)
RIDGE = 1.0
EXPLORE = 2.0          # standard deviations of optimism in the local steps' ranking
NOISE_FLOOR = 0.01     # log-throughput variance assumed at least (about 10%)
PRIOR_WEIGHT = 2.0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ordered(spec: ParamSpec) -> bool:
    if spec.type == "bool":
        return False
    if spec.choices is not None:
        return all(_number(c) for c in spec.choices)
    return spec.type in ("int", "float")


def position(spec: ParamSpec, value: Any) -> float:
    """Where a value of an ordered knob lies in its range, 0..1 (log scale for wide positive ranges)."""
    lo = float(spec.low if spec.choices is None else min(spec.choices))   # type: ignore[arg-type]
    hi = float(spec.high if spec.choices is None else max(spec.choices))  # type: ignore[arg-type]
    if hi <= lo:
        return 0.0
    if (spec.log or lo > 0 and hi / lo >= 8) and lo > 0 and value > 0:
        return (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return (float(value) - lo) / (hi - lo)


def _key(value: Any) -> str:
    try:
        return _scalar_key(value)
    except TypeError:                                     # unhashable
        return json.dumps(value, default=str)


@functools.lru_cache(maxsize=4096, typed=True)            # a knob's few values, asked for every candidate
def _scalar_key(value: Any) -> str:
    return json.dumps(value, default=str)


class ValueModel:
    """Bayesian ridge on log throughput (knob effects multiply): predicts a mean and an uncertainty, and rates a
    candidate by the upper bound mean + EXPLORE x std, so columns the study has seen little of (a value never
    served, an ordered knob far from where it was tried) get tried before re-probing known ones. `known`: configs
    that ran without a value to fit (pruned on the ladder: clearly worse than the best, or unable to reach the
    incumbent): they narrow the uncertainty of their values, not the mean, so a value tried only in pruned configs
    (Triton attention, BF16 KV) is no longer rated as never tried, the most optimistic thing in the model."""

    def __init__(self, search: SearchSpec, rows: list[tuple[dict[str, Any], float]],
                 admission: Admission | None = None, known: Sequence[dict[str, Any]] = ()):
        self.search, self.admission = search, admission
        self.cols: dict[tuple[str, str], int] = {}
        self.ordered = {n for n, s in search.space.items() if ordered(s)}
        rows = [(p, v) for p, v in rows if v > 0]
        for p in [p for p, _ in rows] + list(known):
            for col, _ in self.row(p):
                self.cols.setdefault(col, len(self.cols))
        y = np.log(np.array([v for _, v in rows])) if rows else np.zeros(0)
        self.mean = float(y.mean()) if rows else 0.0
        x = np.zeros((len(rows), len(self.cols)))
        for i, (p, _) in enumerate(rows):
            for col, val in self.row(p):
                x[i, self.cols[col]] = val
        self.x, self.y = x, y
        self.fit_inv = np.linalg.inv(x.T @ x + RIDGE * np.eye(len(self.cols)))
        self.w = self.fit_inv @ x.T @ (y - self.mean)
        xk = np.zeros((len(known), len(self.cols)))
        for i, p in enumerate(known):
            for col, val in self.row(p):
                xk[i, self.cols[col]] = val
        self.a_inv = np.linalg.inv(x.T @ x + xk.T @ xk + RIDGE * np.eye(len(self.cols)))
        resid = (y - self.mean - x @ self.w) if rows else np.zeros(0)
        self.noise = max(float(np.mean(resid ** 2)) if rows else 0.0, NOISE_FLOOR)

    def _features(self, name: str, p: dict[str, Any]) -> list[tuple[tuple[str, str], float]]:
        if name not in p:
            return [((name, "off"), 1.0)]
        if name in self.ordered:
            z = position(self.search.space[name], p[name])
            out = [((name, "z"), z), ((name, "z2"), z * z)]
            if self.admission is not None and name == self.admission[0] and p[name] > 0:
                top = self.admission[1]
                out.append(((name, "cap"), math.log(min(float(p[name]), top) / top)))
            return out
        return [((name, _key(p[name])), 1.0)]

    def row(self, p: dict[str, Any]) -> list[tuple[tuple[str, str], float]]:
        return [f for name in self.search.space for f in self._features(name, p)]

    def _vec(self, p: dict[str, Any]) -> tuple[np.ndarray, int]:
        v, unseen = np.zeros(len(self.cols)), 0
        for col, val in self.row(p):
            i = self.cols.get(col)
            if i is None:
                unseen += 1
            else:
                v[i] = val
        return v, unseen

    def predict(self, p: dict[str, Any]) -> float:
        """Expected throughput."""
        v, _ = self._vec(p)
        return math.exp(self.mean + float(v @ self.w))

    def leverage(self, p: dict[str, Any]) -> float:
        """How little the fit pins this config down: x' (X'X + ridge)^-1 x (an unseen column counts 1 / ridge); the
        prediction's variance is this times the readings' variance."""
        v, unseen = self._vec(p)
        return float(v @ self.a_inv @ v) + unseen / RIDGE

    def upper(self, p: dict[str, Any]) -> float:
        """Optimistic throughput: the mean plus EXPLORE standard deviations."""
        v, unseen = self._vec(p)
        var = self.noise * (float(v @ self.a_inv @ v) + unseen / RIDGE)
        return math.exp(self.mean + float(v @ self.w) + EXPLORE * math.sqrt(var))


class Odds:
    """Naive-Bayes odds that a config lands in the positive rows."""

    def __init__(self, rows: list[tuple[dict[str, Any], bool]]):
        self.base = (sum(y for _, y in rows) + 0.5) / (len(rows) + 1.0)
        self.prior = math.log(self.base / (1.0 - self.base))
        self.counts: dict[tuple[str, str], list[int]] = {}
        for p, y in rows:
            for name, value in p.items():
                c = self.counts.setdefault((name, _key(value)), [0, 0])
                c[0] += 1
                c[1] += int(y)

    def __call__(self, params: dict[str, Any]) -> float:
        logit = self.prior
        for name, value in params.items():
            n, pos = self.counts.get((name, _key(value)), (0, 0))
            rate = (pos + PRIOR_WEIGHT * self.base) / (n + PRIOR_WEIGHT)
            logit += math.log(rate / (1.0 - rate)) - self.prior
        return 1.0 / (1.0 + math.exp(-logit))

    def always(self, params: dict[str, Any]) -> bool:
        """One of the config's values was seen at least twice and was positive every time."""
        return any(n >= 2 and pos == n for n, pos in (self.counts.get((k, _key(v)), (0, 0))
                                                      for k, v in params.items()))


class Surrogate:
    """Value x not-wasted for candidate configs, from one history."""

    def __init__(self, search: SearchSpec, history: History, admission: Admission | None = None):
        self.value = ValueModel(search, [(p, v) for p, out, v in history if out == "ok"], admission,
                                [p for p, out, _ in history if out == "pruned"])
        self.startup = Odds([(p, out == "startup") for p, out, _ in history if out != "explained"])
        self.load = Odds([(p, out in ("load", "pruned")) for p, out, _ in history
                          if out not in ("startup", "explained")])

    def startup_risk(self, params: dict[str, Any]) -> float:
        return 1.0 if self.startup.always(params) else self.startup(params)

    def waste(self, params: dict[str, Any]) -> float:
        return 1.0 - (1.0 - self.startup_risk(params)) * (1.0 - self.load(params))

    def score(self, params: dict[str, Any]) -> float:
        return self.value.upper(params) * (1.0 - self.waste(params))


def startup_risk(params: dict[str, Any], history: History) -> float:
    """Startup-crash odds; 1.0 when one of the config's knob values crashed at startup every time (at least
    twice), e.g. a backend the hardware does not support."""
    odds = Odds([(p, out == "startup") for p, out, _ in history if out != "explained"])
    return 1.0 if odds.always(params) else odds(params)
