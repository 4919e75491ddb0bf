"""Open-loop levels and trace replay on the real stand-in. What is checked is what the client recorded about
itself (each request's due and send times), never how fast this host happens to be: a request sent late is
counted and reported, one on time is within 1% of its offset or 5 ms."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.runners.test_lifecycle import sim_profile, start
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.base import OpenLoad
from tunectl.runners.clients.builtin import LAG_BOUND_MS
from tunectl.runners.clients.openloop import LATE_FLOOR_MS, LATE_SHARE, run_open
from tunectl.runners.server import lifecycle
from tunectl.runners.server.ladder import target
from tunectl.traces import load_trace

pytestmark = pytest.mark.slow
MOONCAKE = Path(__file__).resolve().parents[2] / "profiles" / "traces" / "mooncake-sample.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # the sample trace's long shared prompts reach the baseline's modeled page_table_1_flattened crash (chunked
    # prefill over a cached prefix); these tests are about timing, so the server runs without that path
    prof = sim_profile(tmp_path_factory.mktemp("openloop"), **{"objective.slo": {"p99_ttft_ms": 2000.0},
                                                               "server.flags.disable-chunked-prefix-cache": True})
    srv = start(prof)
    assert lifecycle.wait_ready(srv).ready
    yield srv
    lifecycle.teardown(srv)


def _late_counted_as_reported(m, scale: float) -> np.ndarray:
    """The level's lateness figures are exactly what its recorded sends say; returns the lateness (wall s)."""
    due, sent = (np.array(x) for x in zip(*m.sends))
    late = np.maximum(0.0, sent - due)
    allowed = np.maximum(LATE_FLOOR_MS / 1000, LATE_SHARE * due)
    assert m.metrics["late_requests"] == int((late > allowed).sum())
    assert m.metrics["max_lateness_ms"] == pytest.approx(late.max() * 1000 / scale)
    assert m.metrics["p99_lateness_ms"] == pytest.approx(np.percentile(late, 99) * 1000 / scale)
    assert m.client_bound == (m.metrics["late_requests"] > 0 or m.client["loop_lag_p99_ms"] > LAG_BOUND_MS)
    return late


def test_rate_level_sends_at_the_requested_rate(server) -> None:
    tg, rate, n = target(server), 12.0, 240
    m = run_open(tg, WorkloadSpec(input_len=64, output_len=16, warmup_requests=1), OpenLoad(rate, 1.0, None, n))
    assert m.ok and m.completed == n and m.metrics["request_rate"] == rate and m.metrics["completed"] == n
    assert 0 <= m.metrics["slo_attainment"] <= 1 and m.metrics["goodput"] > 0
    late = _late_counted_as_reported(m, tg.time_scale)
    sent = np.array([s for _, s in m.sends])
    # the span of n-1 exponential gaps has relative sd 1/sqrt(n-1); the sends move it by at most the lateness
    span = (sent[-1] - sent[0]) / tg.time_scale
    slack = 4 / math.sqrt(n - 1) + late.max() / tg.time_scale / ((n - 1) / rate)
    assert abs(span * rate / (n - 1) - 1) <= slack, (span, late.max())


def test_max_concurrency_caps_the_requests_in_flight(server) -> None:
    tg, w = target(server), WorkloadSpec(input_len=64, output_len=64, warmup_requests=0)
    capped = run_open(tg, w, OpenLoad(400.0, 1.0, 3, 30))
    free = run_open(tg, w, OpenLoad(400.0, 1.0, None, 30))
    # mean requests in flight (sum of latencies / duration): at most the cap with it, far above it without
    assert capped.ok and free.ok and capped.metrics["max_concurrency"] == 3
    assert capped.metrics["concurrency"] <= 3.0 + 1e-6 < 6 < free.metrics["concurrency"]


def test_trace_replay_keeps_the_trace_timestamps(server) -> None:
    tg = target(server)
    w = WorkloadSpec(kind="trace", path=str(MOONCAKE), warmup_requests=1)
    m = run_open(tg, w, OpenLoad(None, 1.0, None, 0))
    trace = load_trace(str(MOONCAKE))
    assert m.ok and m.completed == len(trace.requests) == len(m.sends)
    due = [d for d, _ in m.sends]
    assert due == pytest.approx([r.t_s * tg.time_scale for r in trace.requests], abs=1e-9)   # the trace's clock
    late = _late_counted_as_reported(m, tg.time_scale)
    on_time = late <= np.maximum(LATE_FLOOR_MS / 1000, LATE_SHARE * np.array(due))
    assert on_time.sum() + m.metrics["late_requests"] == len(due)       # on time, or counted and reported
    assert m.metrics["request_rate"] == pytest.approx((len(due) - 1) / trace.span_s)
    assert sum(r.output_len for r in trace.requests) == m.metrics["total_output_tokens"]


def test_a_client_that_cannot_keep_up_reports_its_lateness(server, tmp_path: Path) -> None:
    """1,500 requests due at the same instant: sending them takes the client far more than 5 ms on any host."""
    path = tmp_path / "burst.jsonl"
    path.write_text("".join(f'{{"timestamp": 0, "input_length": 16, "output_length": 1}}\n' for _ in range(1500)))
    tg = target(server)
    m = run_open(tg, WorkloadSpec(kind="trace", path=str(path), warmup_requests=0), OpenLoad(None, 1.0, None, 0))
    late = _late_counted_as_reported(m, tg.time_scale)
    assert m.metrics["late_requests"] > 0 and m.client_bound and late.max() > LATE_FLOOR_MS / 1000
