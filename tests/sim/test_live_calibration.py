"""The live stand-in (subprocess, HTTP, the built-in client) reproduces the seeds' baseline within +-15%, whenever
the client could drive it (a level it does not flag client_bound).

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
    got = m.metrics["output_throughput"]
    assert got < 880 * 1.15                       # the stand-in never serves faster than its model
    # The seeds' number unless the client could not keep 64 requests in flight: on a busy host it measures its
    # own event loop's oversleep and flags the level client_bound, and then its reading is low, not the stand-in.
    if not m.client_bound:
        assert got == pytest.approx(880, rel=0.15), m.client
