"""One configuration on several fresh launches (`tunectl sweep --launches N`): per level, the launches' readings,
their pooled 95% interval and the launch-to-launch spread.

A level's reading is its steady-window throughput with its own interval where the client measured one (the
built-in client), else the whole-run throughput as a point (`sglang.bench_serving`): across launches both get an
interval from the launch-to-launch spread (`tunectl.stats.pooled`). A launch whose level did not finish `ok`
(crash, failed requests) is listed but not pooled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunectl.models import LevelResult, TrialResult
from tunectl.stats import Interval, pooled, spread


@dataclass
class LaunchLevel:
    workload: str
    concurrency: int
    readings: list[Interval | None] = field(default_factory=list)   # one per launch; None: not ok there
    statuses: list[str] = field(default_factory=list)
    load: str = ""                        # the level's name (LevelResult.load): c64, r4 (a rate), x1 (a trace)

    @property
    def ok(self) -> list[Interval]:
        return [r for r in self.readings if r is not None]

    @property
    def pooled(self) -> Interval | None:
        return pooled(self.ok) if self.ok else None

    @property
    def spread(self) -> float | None:
        return spread([r.value for r in self.ok]) if len(self.ok) > 1 else None

    @property
    def held(self) -> int:
        """How many launches' readings lie inside the pooled interval."""
        p = self.pooled
        return sum(1 for r in self.ok if p is not None and p.low <= r.value <= p.high)

    def to_dict(self) -> dict[str, Any]:
        p = self.pooled
        return {"workload": self.workload, "concurrency": self.concurrency, "load": self.load,
                "statuses": self.statuses,
                "readings": [r.to_dict() if r else None for r in self.readings],
                "pooled": p.to_dict() if p else None, "launch_spread": self.spread, "within_pooled": self.held}


def reading(lv: LevelResult) -> Interval | None:
    if lv.status != "ok":
        return None
    if "steady_output_throughput" in lv.metrics:
        return Interval.of(lv.metrics["steady_output_throughput"], lv.output_throughput_ci95, max(lv.batches, 1))
    return Interval.of(lv.metrics.get("output_throughput", 0.0), None)


def summarize(results: list[TrialResult]) -> list[LaunchLevel]:
    """Per (workload, level: a concurrency, a request rate or a trace), in the order the first launch measured
    them."""
    rows: dict[tuple[str, str], LaunchLevel] = {}
    for lv in (lv for r in results for lv in r.levels):
        rows.setdefault((lv.workload, lv.load), LaunchLevel(lv.workload, lv.concurrency, load=lv.load))
    for r in results:
        by_key = {(lv.workload, lv.load): lv for lv in r.levels}
        for key, row in rows.items():
            lv = by_key.get(key)
            row.readings.append(reading(lv) if lv else None)
            row.statuses.append(lv.status if lv else (r.status if r.crash else "not run"))
    return list(rows.values())
