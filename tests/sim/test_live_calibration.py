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
    srv: Server = launch("--stream-interval", "32", "--sim-noise", "0", scale=SCALE)    # the model's own value
    wl = WorkloadSpec(input_len=256, output_len=128, range_ratio=1.0)
    m = run_level(srv.url, 64, wl, 64, time_scale=SCALE)
    assert m.completed == 64 and m.failed == 0
    # One wave of 64 identical requests: the whole run is the model's, even when the client flags itself
    # client_bound (its own loop is late on a busy host; the server's clock is not).
    assert m.metrics["output_throughput"] == pytest.approx(880, rel=0.05), m.client


BEST = ["--cuda-graph-max-bs", "512", "--max-running-requests", "1024", "--disable-radix-cache",
        "--disable-chunked-prefix-cache", "--mem-fraction-static", "0.85", "--stream-interval", "32"]


def _steady_reading(launch, busy: int) -> tuple[float, int]:
    """The main job's level at 256 (steady-state rule, the client over worker processes) on one launch of the
    card's best config, noise on, with `busy` CPU-bound loops beside it (started and stopped here, by pid)."""
    import subprocess
    import sys

    from tunectl.runners.clients.steady import StopRule

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        srv = launch(*BEST, scale=0.005, env={"TUNECTL_SIM_PATCHES": "0001-flashinfer-cutlass-autotune",
                                               "TUNECTL_RUN_ID": "busy-t5-0000"})     # one launch's noise draw
        wl = WorkloadSpec(input_len=256, output_len=128, range_ratio=1.0)
        m = run_level(srv.url, 256, wl, 256, time_scale=0.005, processes=2,
                      rule=StopRule(min_prompts=256, min_s=5, precision=0.03, max_s=90))
        srv.stop()
        return m.metrics["output_throughput"], m.steady.samples if m.steady else 0
    finally:
        for p in loops:
            p.kill()
            p.wait()


def test_two_busy_loops_change_no_reading(launch) -> None:
    """Issue 38's W2: with two busy loops beside it the same launch of the same config read 2% apart. The stand-in's
    clock waits for each client process's requests, and the steady window is cut on the server's clock (the
    requests a late client still starts do not count), so the host's load changes nothing, noise on or off."""
    quiet, samples = _steady_reading(launch, 0)
    busy = _steady_reading(launch, 2)
    assert busy[1] == samples and busy[0] == pytest.approx(quiet, rel=1e-9)     # the same cycles, summed in any order
