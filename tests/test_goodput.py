"""Open-loop arrivals (Poisson and gamma, as bench_serving / vLLM send them), per-request SLO attainment and the
bracketing capacity search, on their own (the live and virtual paths both use these)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tunectl.goodput import Probe, arrival_times, bracket, meets

N = 4001          # 4,000 gaps per level


@pytest.mark.parametrize("rate", [0.5, 4.0, 64.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_poisson_realised_rate_matches_the_requested_rate(rate: float, seed: int) -> None:
    t = arrival_times(N, rate, 1.0, seed)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    # the span is a sum of n exponential gaps of mean 1/rate: its relative sd is 1/sqrt(n); 4 sd is a 6e-5 miss
    realised = (N - 1) / t[-1]
    assert abs(t[-1] * rate / (N - 1) - 1) <= 4 / math.sqrt(N - 1), realised


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_burstiness_sets_the_gap_cv_as_gamma_predicts(burstiness: float) -> None:
    gaps = np.diff(arrival_times(20001, 8.0, burstiness, seed=7))
    cv = gaps.std() / gaps.mean()
    # gamma(shape k): mean 1/rate whatever k, CV 1/sqrt(k); 20,000 gaps pin the CV within a few percent
    assert gaps.mean() * 8.0 == pytest.approx(1.0, rel=0.05)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_arrivals_are_seeded_and_the_seed_matters() -> None:
    assert arrival_times(50, 3.0, 1.0, 5) == arrival_times(50, 3.0, 1.0, 5)
    assert arrival_times(50, 3.0, 1.0, 5) != arrival_times(50, 3.0, 1.0, 6)
    assert arrival_times(5, math.inf) == [0.0] * 5


def test_a_request_meets_the_slo_only_within_every_limit() -> None:
    slo = {"p99_ttft_ms": 500.0, "p99_tpot_ms": 50.0}
    assert meets(400, 40, 9000, 80, slo)
    assert not meets(501, 40, 9000, 80, slo)
    assert not meets(400, 51, 9000, 80, slo)
    assert meets(400, 40, 9000, 80, {"p99_e2e_latency_ms": 9000.0})
    assert not meets(400, 40, 9000, 80, {"p99_itl_ms": 60.0})


def _threshold(cap: float, seen: list[float]):
    def probe(load: float) -> Probe:
        seen.append(load)
        return Probe(load, load <= cap, 1.0 if load <= cap else 0.5)
    return probe


@pytest.mark.parametrize("cap", [0.3, 1.0, 5.5, 12.4, 100.0])
def test_bracket_ends_within_the_tolerance_of_the_threshold(cap: float) -> None:
    seen: list[float] = []
    br = bracket(_threshold(cap, seen), start=1.0, tolerance=0.1, max_probes=30)
    assert br.capacity is not None and br.high is not None and not br.stopped
    assert br.low <= cap < br.high and br.high / br.low - 1 <= 0.1
    assert br.capacity == max(p.load for p in br.probes if p.passed)
    # double until it fails (or halve until one passes), then only loads inside the bracket
    first_fail = next(i for i, p in enumerate(br.probes) if not p.passed) if cap >= 1 else 0
    assert seen[:first_fail + 1] == [2.0 ** i for i in range(first_fail + 1)]


def test_bracket_by_concurrency_bisects_integers() -> None:
    seen: list[float] = []
    br = bracket(_threshold(37, seen), start=1, tolerance=0.01, max_probes=30, integer=True)
    assert br.capacity == 37 and br.high == 38 and all(x == int(x) for x in seen)


def test_a_crash_or_the_probe_budget_stops_the_bracket() -> None:
    calls: list[float] = []

    def crashes_at_8(load: float) -> Probe:
        calls.append(load)
        return Probe(load, False, 0.0, stop="crash") if load >= 8 else Probe(load, True, 1.0)
    br = bracket(crashes_at_8, 1.0, 0.1, 20)
    assert br.stopped == "crash" and br.capacity == 4.0 and br.high is None
    br = bracket(_threshold(1e9, []), 1.0, 0.1, 5)
    assert br.stopped == "max_probes" and br.capacity == 16.0


def test_one_stalled_probe_does_not_close_the_bracket_under_the_capacity() -> None:
    """A probe failed once by a stall of the host (here: the first run at 2.0) is probed again before the bracket
    closes on it; passing then, the search goes on upwards and still ends within the tolerance of the truth."""
    seen: list[float] = []
    truth = _threshold(12.4, seen)

    def stalls_once_at_2(load: float) -> Probe:
        if load == 2.0 and 2.0 not in seen:
            seen.append(load)
            return Probe(load, False, 0.9)
        return truth(load)
    br = bracket(stalls_once_at_2, start=1.0, tolerance=0.1, max_probes=30)
    assert br.low is not None and br.high is not None and br.low <= 12.4 < br.high
    assert seen.count(2.0) == 2 and br.high / br.low - 1 <= 0.1 and not br.stopped


def test_a_marginal_failure_under_a_clear_one_is_not_probed_again() -> None:
    """16 fails, then 13.4 fails marginally: two loads failed, so 13.4 is the answer's end as read (a second run
    would only move the border up by luck), each load probed once."""
    seen: list[float] = []
    truth = _threshold(13.0, seen)
    br = bracket(truth, start=1.0, tolerance=0.1, max_probes=30)
    assert br.low is not None and br.high is not None and br.low <= 13.0 < br.high and not br.stopped
    assert len(seen) == len(set(seen))
