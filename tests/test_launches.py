"""Several fresh launches of one config, pooled per level (`tunectl sweep --launches`)."""
from __future__ import annotations

import pytest

from tunectl.launches import summarize
from tunectl.models import CrashInfo, LevelResult, TrialResult


def level(c: int, value: float, ci: tuple[float, float] | None = None, status: str = "ok") -> LevelResult:
    metrics = {"output_throughput": value * 0.9}
    if ci:
        metrics["steady_output_throughput"] = value
    return LevelResult(c, status, metrics=metrics, output_throughput_ci95=list(ci) if ci else None, batches=10)


def trial(n: int, levels: list[LevelResult], status: str = "ok", crash: CrashInfo | None = None) -> TrialResult:
    return TrialResult(trial=n, params={}, status=status, levels=levels, crash=crash)


def test_a_crashed_launch_is_listed_not_pooled():
    crash = CrashInfo(cls="load_crash", signature="page_table_1_flattened", phase="load", level=512)
    rows = summarize([trial(0, [level(64, 1000, (980, 1020)), level(512, 2000, (1950, 2050))]),
                      trial(1, [level(64, 1100, (1080, 1120)), level(512, 0, status="crashed")], "crashed", crash),
                      trial(2, [level(64, 1050, (1030, 1070))], "crashed", crash)])
    at64, at512 = rows
    assert at64.statuses == ["ok", "ok", "ok"] and at64.pooled.value == pytest.approx(1050)
    assert at64.spread == pytest.approx(100 / 1050) and at64.held == 3
    assert at512.statuses == ["ok", "crashed", "crashed"]             # the third never reached 512
    assert at512.pooled.value == 2000 and at512.spread is None        # one launch: its own interval, no spread
    assert (at512.pooled.low, at512.pooled.high) == (1950, 2050)


def test_whole_run_readings_get_an_interval_only_from_launches():
    rows = summarize([trial(i, [level(16, v)]) for i, v in enumerate((900.0, 1000.0, 1100.0))])
    p = rows[0].pooled
    assert rows[0].readings[0].low == rows[0].readings[0].high == 810.0      # bench_serving: a point per launch
    assert p.value == pytest.approx(900.0) and p.low < 810.0 < 990.0 < p.high and p.n == 3
