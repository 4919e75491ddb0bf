"""The live stand-in (subprocess, HTTP, the built-in client) reproduces the seeds' baseline within +-15%.

A slow time scale keeps host CPU noise out of the modeled numbers; bench/calibrate.py prints the full table.
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
    assert m.metrics["output_throughput"] == pytest.approx(880, rel=0.15)
