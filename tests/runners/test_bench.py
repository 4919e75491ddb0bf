"""The built-in client against the fake server of known cadence (correctness, not speed: see bench/)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import fakeserver as fake
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.builtin import METRIC_KEYS, run_level
from tunectl.runners.clients.prompts import make_prompts

RESULT_JSONL = Path(__file__).parent.parent / "fixtures" / "bench_serving" / "0.5.23-result.jsonl"


@pytest.fixture(scope="module")
def server():
    proc, url = fake.start(itl_ms=20, ttft_ms=40, chunk_tokens=1)
    yield url
    fake.stop(proc)


@pytest.fixture(scope="module")
def chunky():
    proc, url = fake.start(itl_ms=40, ttft_ms=40, chunk_tokens=4)
    yield url
    fake.stop(proc)


def _run(url: str, conc: int = 8, n: int = 16, out: int = 16, **kw):
    kw.setdefault("processes", 1)
    return run_level(url, conc, WorkloadSpec(input_len=32, output_len=out, warmup_requests=1), n,
                     model="fake", request_timeout_s=30, **kw)


def test_metric_keys_are_sglang_result_keys() -> None:
    real = json.loads(RESULT_JSONL.read_text())
    assert set(METRIC_KEYS) - {"max_concurrency"} <= set(real)


@pytest.mark.parametrize("time_scale", [1.0, 0.5])
def test_metrics_match_the_known_cadence(server: str, time_scale: float) -> None:
    res = _run(server, time_scale=time_scale)
    m, k = res.metrics, 1 / time_scale
    assert (res.completed, res.failed, m["completed"], m["total_output_tokens"]) == (16, 0, 16, 16 * 16)
    assert m["median_itl_ms"] == pytest.approx(20 * k, rel=0.25)
    assert m["median_tpot_ms"] == pytest.approx(20 * k, rel=0.25)
    # No server answers before its schedule: the lower bounds hold on any host. On a busy host the client's own
    # timestamps are late by its event loop's oversleep, which it measures and flags (client_bound): the upper
    # bounds widen by that p99 lag (wall ms), and only when the client says so.
    slack = res.client["loop_lag_p99_ms"] if res.client_bound else 0.0
    assert 40 * k <= m["median_ttft_ms"] < (80 + slack) * k, res.client
    e2e = (40 + 15 * 20) * k
    assert e2e <= m["median_e2e_latency_ms"] < (e2e * 1.3 + slack * k), res.client
    assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / m["duration"])
    assert m["total_throughput"] == pytest.approx((16 * 32 + 16 * 16) / m["duration"])
    assert 5 < m["concurrency"] <= 8.01
    assert m["p99_itl_ms"] >= m["p95_itl_ms"] >= m["p90_itl_ms"] >= m["median_itl_ms"]


def test_native_itl_is_spread_over_the_tokens_of_a_chunk(chunky: str) -> None:
    m = _run(chunky).metrics
    assert m["total_output_tokens"] == 16 * 16
    assert m["median_itl_ms"] == pytest.approx(40 / 4, rel=0.25)      # 4 tokens per 40 ms chunk
    assert m["median_tpot_ms"] == pytest.approx((3 * 40) / 15, rel=0.25)


def test_openai_itl_is_per_chunk_and_tokens_come_from_usage(chunky: str) -> None:
    res = _run(chunky, backend="sglang-oai")
    assert res.completed == 16 and res.metrics["total_output_tokens"] == 16 * 16
    assert res.metrics["median_itl_ms"] == pytest.approx(40, rel=0.25)


def test_split_over_processes_gives_the_same_answer(server: str) -> None:
    seen: list[dict] = []
    res = _run(server, conc=8, n=32, processes=2, progress=seen.append)
    assert res.processes == 2 and (res.completed, res.failed) == (32, 0)
    assert res.metrics["median_itl_ms"] == pytest.approx(20, rel=0.25)
    assert 5 < res.metrics["concurrency"] <= 8.01
    assert seen and seen[-1]["total"] == 32


def test_progress_counts_tokens_while_requests_stream(server: str) -> None:
    seen: list[dict] = []
    res = _run(server, conc=2, n=2, out=60, progress=seen.append)     # ~1.2 s per request
    during = [d for d in seen if d["done"] == 0]
    assert during and max(d["output_tokens"] for d in during) > 10       # evidence before anything completes
    assert res.completed == 2


def test_a_dying_server_is_never_reported_as_planned_tokens() -> None:
    proc, url = fake.start(itl_ms=20, ttft_ms=20, die_after=6)      # warmup (1) + 5 requests, then exit 137
    try:
        t0 = time.monotonic()
        res = _run(url, conc=4, n=20, out=40)
        elapsed = time.monotonic() - t0
    finally:
        fake.stop(proc)
    assert res.failed > 0 and res.completed < 20 and res.server_gone
    assert res.metrics.get("total_output_tokens", 0) == 40 * res.completed     # only what was streamed
    assert any("refused" in e or "Disconnected" in e or "Payload" in e for e in res.errors)
    assert elapsed < 5 and not res.ok


def test_abort_ends_the_level_within_a_second(server: str) -> None:
    stop = threading.Event()
    threading.Timer(0.6, stop.set).start()
    t0 = time.monotonic()
    res = _run(server, conc=4, n=8, out=500, abort=stop)          # would take ~20 s
    assert time.monotonic() - t0 < 0.6 + 1.5
    assert res.aborted and res.completed == 0 and res.failed == 8 and not res.ok


def test_abort_reaches_worker_processes(server: str) -> None:
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    t0 = time.monotonic()
    res = _run(server, conc=4, n=8, out=500, abort=stop.is_set, processes=2)
    assert time.monotonic() - t0 < 1.5 + 1.5
    assert res.aborted and res.failed == 8


def test_no_server_fails_fast() -> None:
    t0 = time.monotonic()
    res = _run(f"http://127.0.0.1:{fake.free_port()}", conc=4, n=8)
    assert time.monotonic() - t0 < 3
    assert (res.completed, res.failed, res.server_gone, res.metrics) == (0, 8, True, {})
    assert "refused" in res.errors[0]


def test_workloads_are_seeded_and_shaped() -> None:
    spec = WorkloadSpec(kind="shared_prefix", input_len=50, output_len=10, shared_prefix_len=300, range_ratio=0.5)
    a, b = make_prompts(spec, 20, salt=64), make_prompts(spec, 20, salt=64)
    assert [p.ids for p in a] == [p.ids for p in b]
    assert all(p.ids[:300] == a[0].ids[:300] for p in a)
    assert all(325 <= p.input_len <= 350 and 5 <= p.output_len <= 10 for p in a)
    other = make_prompts(spec, 20, salt=128)
    assert other[0].ids[:300] == a[0].ids[:300] and other[0].ids[300:] != a[0].ids[300:]
    long = make_prompts(WorkloadSpec(kind="long_prompt", input_len=9000), 3)
    assert all(p.input_len == 9000 for p in long)
