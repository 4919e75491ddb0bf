"""The live stand-in (subprocess, HTTP, the built-in client) reproduces the seeds' baseline within 5%, busy host or
not: the client reads the server's own clock (every chunk carries it), and that clock waits for a late client.

bench/calibrate.py prints the full table.
"""
from __future__ import annotations

import pytest

from tests.sim._server import Server
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.builtin import run_level

SCALE = 0.1


def test_baseline_at_64_is_880(launch) -> None:
    srv: Server = launch("--stream-interval", "32", scale=SCALE)
    wl = WorkloadSpec(input_len=256, output_len=128, range_ratio=1.0)
    m = run_level(srv.url, 64, wl, 64, time_scale=SCALE)
    assert m.completed == 64 and m.failed == 0
    # One wave of 64 identical requests: the whole run is the model's, even when the client flags itself
    # client_bound (its own loop is late on a busy host; the server's clock is not).
    assert m.metrics["output_throughput"] == pytest.approx(880, rel=0.05), m.client
