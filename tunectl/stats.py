"""Intervals for measured throughput: 95% confidence intervals, fresh launches pooled, ties called ties.

- `Interval(value, low, high, n)`: a measured value with its 95% confidence interval and how many samples
  (batches of requests, or launches) it rests on. `half_rel` is the half-width as a share of the value.
- `mean_interval(values)`: Student-t interval of the mean of independent samples (batch means, launches).
- `pooled(intervals)`: one config measured on several fresh launches: the mean of the launches, with an interval
  from the launch-to-launch spread, never narrower than the launches' own intervals allow.
- `compare(a, b)`: "above" / "below" only when the intervals do not overlap; otherwise "tie".
- `gain(a, base)`: a / base with the conservative interval (a.low / base.high, a.high / base.low).
- `paired_gain(pairs)`: a / b over launches run back to back, one pair at a time: the geometric mean of the pairs'
  ratios with the Student-t interval of their logs. A drift of the machine that both launches of a pair share
  cancels (real GPUs step by 10% or more within a lease, docs/real-gpu.md), so it separates what `gain` cannot.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import mean, stdev
from typing import Any, Literal

# Two-sided 95% Student-t quantiles by degrees of freedom (1.96 beyond the table).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}

Verdict = Literal["above", "below", "tie"]


def t95(df: int) -> float:
    if df < 1:
        return math.inf
    for k in sorted(_T95):
        if df <= k:
            return _T95[k]
    return 1.96


@dataclass
class Interval:
    value: float
    low: float
    high: float
    n: int = 1

    @property
    def half_rel(self) -> float:
        return (self.high - self.low) / 2 / self.value if self.value > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, value: float, ci: list[float] | tuple[float, float] | None, n: int = 1) -> Interval:
        """A value with its [low, high] (a point when none was measured)."""
        lo, hi = (ci[0], ci[1]) if ci else (value, value)
        return cls(float(value), float(lo), float(hi), n)

    def text(self, fmt: str = ",.0f") -> str:
        return f"{self.value:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"


def mean_interval(values: list[float]) -> Interval:
    m = mean(values)
    if len(values) < 2:
        return Interval(m, m, m, len(values))
    h = t95(len(values) - 1) * stdev(values) / math.sqrt(len(values))
    return Interval(m, m - h, m + h, len(values))


def pooled(intervals: list[Interval]) -> Interval:
    """Fresh launches of one config: mean of their values; half-width from the launch-to-launch spread (t with
    n-1 degrees of freedom) or from the launches' own half-widths over sqrt(n), whichever is wider."""
    if not intervals:
        raise ValueError("pooled() needs at least one interval")
    if len(intervals) == 1:
        return intervals[0]
    between = mean_interval([i.value for i in intervals])
    within = math.sqrt(sum(((i.high - i.low) / 2) ** 2 for i in intervals)) / len(intervals)
    h = max((between.high - between.low) / 2, within)
    return Interval(between.value, between.value - h, between.value + h, len(intervals))


def spread(values: list[float]) -> float:
    """Launch-to-launch spread: (max - min) / mean."""
    return (max(values) - min(values)) / mean(values) if values and mean(values) > 0 else 0.0


def compare(a: Interval, b: Interval) -> Verdict:
    if a.low > b.high:
        return "above"
    if a.high < b.low:
        return "below"
    return "tie"


def gain(a: Interval, base: Interval) -> Interval:
    if base.value <= 0 or base.low <= 0:
        return Interval(math.inf, math.inf, math.inf, min(a.n, base.n))
    return Interval(a.value / base.value, a.low / base.high, a.high / base.low, min(a.n, base.n))


def pair_noise(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    """What pairs of launches run back to back tell apart (relative log sds; None below 3 pairs): `launch`, what a
    fresh launch adds (the sd of the pairs' log ratios / sqrt 2: a drift of the machine cancels within a pair), and
    `machine`, the machine's drift over the run (the sd of the pairs' log means, less the half of the launch spread
    that is in it; 0 where the launches explain it all)."""
    logs = [(math.log(a), math.log(b)) for a, b in pairs if a > 0 and b > 0]
    if len(logs) < 3:
        return None
    launch = stdev([a - b for a, b in logs]) / math.sqrt(2)
    machine = math.sqrt(max(0.0, stdev([(a + b) / 2 for a, b in logs]) ** 2 - launch ** 2 / 2))
    return launch, machine


def paired_gain(pairs: list[tuple[float, float]]) -> Interval:
    """(a, b) readings of launches run back to back: a / b as the geometric mean of the pairs' ratios, with the
    95% Student-t interval of the mean log ratio (n - 1 degrees of freedom; a single pair is a point)."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    if not logs:
        raise ValueError("paired_gain() needs at least one pair of positive readings")
    m = mean_interval(logs)
    return Interval(math.exp(m.value), math.exp(m.low), math.exp(m.high), m.n)


def machine_words(levels: dict[str, float]) -> str:
    """Machine levels (log, the reference 0) in words: "gpu-86d1d4a7 -10.6% against not recorded"."""
    ref = next(m for m, v in levels.items() if v == 0.0)
    terms = ", ".join(f"{machine_short(m)} {math.exp(v) - 1:+.1%}" for m, v in levels.items() if m != ref)
    return f"{terms} against {machine_short(ref)}"


def machine_short(machine: str) -> str:
    """A machine's name in the rule: its last part (the GPU's id), or 'not recorded'."""
    return machine.rsplit(", ", 1)[-1] if machine else "not recorded"
