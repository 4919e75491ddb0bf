"""What a search maximizes (`objective:` in a profile): the metric, SLO limits, goodput mode with its capacity
search, weights over several workloads; and a reported result to compare against (`reference:`). `score` reads a
trial's value by these rules: the search tells it to the sampler, the report ranks trials by it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from tunectl.goodput import capacity_of, level_load
from tunectl.models import LevelResult, TrialResult

from tunectl.yamlmodel import Strict

if TYPE_CHECKING:                        # profile.py imports this module
    from tunectl.profile import Profile


class Capacity(Strict):
    """The bracketing search: start, double until the SLO fails, then bisect until hi/lo - 1 <= tolerance."""

    by: Literal["rate", "concurrency"] = "rate"   # open-loop request rates, or closed-loop concurrency
    start: float = Field(1.0, gt=0)               # the first rate (req/s) or concurrency tried
    tolerance: float = Field(0.1, gt=0, lt=1)
    max_probes: int = Field(16, ge=2)


class Objective(Strict):
    metric: Literal["output_throughput", "total_throughput", "request_throughput"] = "output_throughput"
    slo: dict[Literal["p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2e_latency_ms",
                      "median_ttft_ms", "median_tpot_ms"], float] = Field(default_factory=dict)
    multi_objective: bool = False                 # throughput vs p99 TTFT (Pareto)
    # goodput: the value is the capacity, the highest request rate at which >= slo_attainment of the requests
    # meet every `slo` limit (docs/load.md), found by a bracketing search on one launch
    # tokens_per_joule / tokens_per_dollar: the level meeting the SLO with the most output tokens per joule (GPU
    # power sampled on the host) or per dollar (the profile's `cost:`) (docs/energy.md)
    mode: Literal["throughput", "goodput", "tokens_per_joule", "tokens_per_dollar"] = "throughput"
    slo_attainment: float = Field(0.99, gt=0, le=1)
    capacity: Capacity = Field(default_factory=lambda: Capacity())
    # several workloads: the objective is sum(weight x the workload's best level), by workload label; the SLO
    # must hold on each. Empty: the first workload's best level.
    weights: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.mode == "goodput" and not self.slo:
            raise ValueError("mode 'goodput' needs slo limits, e.g. slo: {p99_ttft_ms: 2000}")
        bad = {k: v for k, v in self.weights.items() if not v > 0}
        if bad:
            raise ValueError(f"weights: {bad}: each weight must be > 0 (leave a workload out to ignore it)")
        late = {k: v for k, v in self.slo.items() if not v > 0}
        if late:
            raise ValueError(f"objective.slo: {late}: each limit is a latency in ms, > 0 (leave a metric out to "
                             "not limit it)")
        return self


class Reference(Strict):
    """A reported result to compare against (e.g. the K2-Thinking reference run)."""

    output_throughput: float
    concurrency: int | None = None
    note: str = ""


# ------------------------------------------------------------------------------------------ a trial's value

def workload_levels(result: TrialResult, label: str) -> list[LevelResult]:
    return [lv for lv in result.stable_levels if lv.workload == label]


def primary_levels(result: TrialResult, prof: Profile) -> list[LevelResult]:
    """Stable levels of the first workload (the one the objective is about when it has no weights)."""
    label = prof.bench.workloads[0].label if prof.bench.workloads else None
    ok = result.stable_levels
    return [lv for lv in ok if lv.workload == label] or ok


def slo_violation(lv: LevelResult, slo: dict[str, float]) -> float:
    """Largest relative excess over an SLO limit at this level (<= 0 when all limits hold)."""
    if not slo:
        return 0.0
    worst = -1.0
    for key, limit in slo.items():
        got = lv.metrics.get(key)
        excess = 1.0 if got is None else (float(got) - limit) / max(limit, 1e-9)
        worst = max(worst, excess)
    return worst


def _best_of(levels: list[LevelResult], prof: Profile) -> tuple[LevelResult | None, float]:
    if not levels:
        return None, 1.0 if prof.objective.slo else 0.0
    if prof.objective.mode == "goodput":     # the capacity: the highest load meeting the SLO for its share
        found = capacity_of(levels, prof.objective.slo_attainment, prof.objective.capacity.by)
        return found, 0.0 if found is not None else 1.0
    slo = dict(prof.objective.slo)
    meeting = [lv for lv in levels if slo_violation(lv, slo) <= 0]
    if meeting:
        return max(meeting, key=lambda lv: lv.value(prof.objective.metric)), min(
            slo_violation(lv, slo) for lv in meeting)
    least = min(levels, key=lambda lv: slo_violation(lv, slo))
    return least, slo_violation(least, slo)


def best_level(result: TrialResult, prof: Profile) -> tuple[LevelResult | None, float]:
    """The level the objective reads (highest throughput meeting the SLO) and the SLO constraint value; with
    `objective.weights`, the first weighted workload's level and the worst SLO constraint over them."""
    if not prof.objective.weights:
        return _best_of(primary_levels(result, prof), prof)
    per = {w: _best_of(workload_levels(result, w), prof) for w in prof.objective.weights}
    first = per[next(iter(per))][0]
    return first, max(c for _, c in per.values())


@dataclass
class Score:
    value: float
    slo: float                                    # <= 0: the SLO holds (for every weighted workload)
    level: LevelResult | None                     # the level the value (or the first weighted workload's) came from
    ci95: list[float] | None = None
    per_workload: dict[str, float] = field(default_factory=dict)


def score(result: TrialResult, prof: Profile) -> Score:
    """The objective: the best level's metric, or `objective.weights`' sum of each workload's best level (a
    workload without a stable level adds 0); its 95% interval is the weighted sum of theirs."""
    metric = value_metric(prof)
    if not prof.objective.weights:
        lv, slo_c = best_level(result, prof)
        ci = lv.output_throughput_ci95 if lv is not None and metric == "output_throughput" else None
        return Score(objective_value(lv, prof), slo_c, lv, ci)
    out = Score(0.0, -1.0, None, [0.0, 0.0] if metric == "output_throughput" else None)
    for label, weight in prof.objective.weights.items():
        lv, slo_c = _best_of(workload_levels(result, label), prof)
        got = objective_value(lv, prof)
        out.per_workload[label] = got
        out.value += weight * got
        out.slo = max(out.slo, slo_c)
        out.level = out.level or lv
        ci = (lv.output_throughput_ci95 if lv else None) or [got, got]
        if out.ci95 is not None:
            out.ci95 = [out.ci95[0] + weight * ci[0], out.ci95[1] + weight * ci[1]]
    return out


def objective_value(lv: LevelResult | None, prof: Profile) -> float:
    """The level's objective: its metric, or in goodput mode its load (the capacity: req/s or concurrency)."""
    if lv is None:
        return 0.0
    if prof.objective.mode == "goodput":
        return level_load(lv, prof.objective.capacity.by)
    return lv.value(value_metric(prof))


PER_TOKEN = {"tokens_per_joule": "output_tokens_per_joule", "tokens_per_dollar": "output_tokens_per_dollar"}


def value_metric(prof: Profile) -> str:
    """The level metric a mode maximizes: `objective.metric`, or tokens per joule / per dollar (tunectl/energy.py)."""
    return PER_TOKEN.get(prof.objective.mode, prof.objective.metric)
