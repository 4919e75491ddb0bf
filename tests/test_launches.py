"""Several fresh launches of one config, pooled per level (`tunectl sweep --launches`)."""
from __future__ import annotations

import pytest

from tunectl.launches import summarize
from tunectl.models import CrashInfo, LevelResult, TrialResult
from tunectl.stats import Interval


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


def test_a_paired_gain_separates_what_a_shared_drift_hides_from_the_pooled_one():
    """The machine steps by 12% between pairs (as a real H200 did within one lease); within each pair the winner
    reads 2% below the default. Pooled side by side the two are a tie; paired, the 2% is resolved and the
    interval holds it. Equal readings give 1; one pair is a point with no spread to judge by."""
    from tunectl.stats import compare, gain, paired_gain, pooled

    machine = [1.0, 0.97, 1.12, 1.11, 1.13]
    wiggle = [1.004, 0.997, 1.002, 0.998, 1.0]
    default = [10_000 * m for m in machine]
    winner = [d * 0.98 * w for d, w in zip(default, wiggle)]
    pw, pd = pooled([Interval.of(v, None) for v in winner]), pooled([Interval.of(v, None) for v in default])
    assert compare(pw, pd) == "tie" and gain(pw, pd).low < 0.9 < 1.05 < gain(pw, pd).high
    p = paired_gain(list(zip(winner, default)))
    assert p.n == 5 and p.low < 0.98 < p.high < 1.0 and p.high - p.low < 0.01
    assert paired_gain([(5.0, 5.0), (7.0, 7.0)]).value == pytest.approx(1.0)
    one = paired_gain([(98.0, 100.0)])
    assert one.n == 1 and one.low == one.high == pytest.approx(0.98)
    with pytest.raises(ValueError):
        paired_gain([(0.0, 1.0)])


def test_pairs_tell_a_fresh_launchs_spread_from_the_machines_drift():
    """The same launches as above: the pairs' ratios carry only what a fresh launch adds (the wiggle), their
    means the machine's steps; with no drift the machine's part is 0, below 3 pairs nothing is told."""
    from tunectl.stats import pair_noise

    machine = [1.0, 0.97, 1.12, 1.11, 1.13]
    wiggle = [1.004, 0.997, 1.002, 0.998, 1.0]
    default = [10_000 * m for m in machine]
    winner = [d * 0.98 * w for d, w in zip(default, wiggle)]
    launch, drift = pair_noise(list(zip(winner, default)))
    assert launch < 0.005 and 0.05 < drift < 0.08
    steady = [(980.0 * w, 1000.0 / w) for w in wiggle]
    launch, drift = pair_noise(steady)
    assert 0.002 < launch < 0.01 and drift == 0.0
    assert pair_noise(steady[:2]) is None
