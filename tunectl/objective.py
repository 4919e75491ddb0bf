"""What a search maximizes (`objective:` in a profile): the metric, SLO limits, goodput mode with its capacity
search, weights over several workloads; and a reported result to compare against (`reference:`)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tunectl.yamlmodel import Strict


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
    mode: Literal["throughput", "goodput"] = "throughput"
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
        return self


class Reference(Strict):
    """A reported result to compare against (e.g. the K2-Thinking reference run)."""

    output_throughput: float
    concurrency: int | None = None
    note: str = ""
