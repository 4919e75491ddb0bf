"""The Client conformance suite: every load client (tunectl.runners.clients.CLIENTS) must pass these tests
unchanged, against the fake SGLang stream server of known cadence (tests/helpers/fakeserver.py).

Use it from a test module that provides a fixture `client` (a Client) and imports the classes:

    from tests.runners.client_conformance import *
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import fakeserver as fake
from tests.helpers.ports import free_port
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.base import Client, Target
from tunectl.runners.clients.metrics import METRIC_KEYS
from tunectl.runners.hosts.local import LocalRunner
from tunectl.sim import TOKENIZER

__all__ = ["TestDeadServer", "TestHealthyLevel", "healthy"]

CORE = {"completed", "duration", "total_output_tokens", "output_throughput", "total_throughput", "median_ttft_ms",
        "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2e_latency_ms"}
WORKLOAD = WorkloadSpec(input_len=32, output_len=16, warmup_requests=1)


def target(url: str, out_dir: Path) -> Target:
    host = url.removeprefix("http://")
    return Target(base_url=url, host_url=f"http://{host}", runner=LocalRunner(), python=sys.executable,
                  out_dir=str(out_dir), backend="sglang", model="fake", tokenizer=str(TOKENIZER),
                  request_timeout_s=30, level_timeout_s=120)


@pytest.fixture(scope="module")
def healthy():
    proc, url = fake.start(itl_ms=10, ttft_ms=30, chunk_tokens=1)
    yield url
    fake.stop(proc)


class TestHealthyLevel:
    def test_every_request_completes_with_sglang_metric_names(self, client: Client, healthy: str,
                                                              tmp_path: Path) -> None:
        res = client.run_level(target(healthy, tmp_path), WORKLOAD, 4, 12)
        assert (res.ok, res.completed, res.failed, res.concurrency, res.num_prompts) == (True, 12, 0, 4, 12), res.errors
        m = res.metrics
        assert CORE <= set(m) and CORE <= set(METRIC_KEYS)      # SGLang's result keys (0.5.9 has these), numbers
        assert all(isinstance(v, float | int) for v in m.values())
        assert m["completed"] == 12 and m["total_output_tokens"] == 12 * 16

    def test_timings_are_the_servers(self, client: Client, healthy: str, tmp_path: Path) -> None:
        m = client.run_level(target(healthy, tmp_path), WORKLOAD, 2, 6).metrics
        assert m["median_ttft_ms"] >= 30 and m["median_itl_ms"] >= 9
        assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / m["duration"], rel=0.05)


class TestDeadServer:
    def test_a_server_dying_mid_level_is_never_a_clean_level(self, client: Client, tmp_path: Path) -> None:
        proc, url = fake.start(itl_ms=20, ttft_ms=20, chunk_tokens=1, die_after=5)
        try:
            res = client.run_level(target(url, tmp_path), WORKLOAD, 2, 12)
        finally:
            fake.stop(proc)
        assert not res.ok and res.completed < 12 and res.failed > 0
        assert res.completed + res.failed == 12
        assert res.errors and all(isinstance(e, str) and e.strip() for e in res.errors)    # it says why

    def test_no_server_is_a_failed_level_not_an_exception(self, client: Client, tmp_path: Path) -> None:
        res = client.run_level(target(f"http://127.0.0.1:{free_port()}", tmp_path), WORKLOAD, 2, 4)
        assert not res.ok and res.completed == 0 and res.failed == 4
        assert res.errors and all(isinstance(e, str) and e.strip() for e in res.errors)    # it says why
