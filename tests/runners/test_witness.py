"""The server's own figures beside the client's (runners/server/witness.py)."""
from __future__ import annotations

from tunectl.runners.server.witness import Witness, log_rate

# (running requests, gen throughput) of a level's `Decode batch` lines; the first spans the idle time before the
# level, the last the drain
LINES = [(3, 900.0), (128, 20_000.0), (128, 22_000.0), (128, 21_000.0), (40, 8_000.0)]


def test_the_log_rate_is_time_weighted_and_leaves_out_the_idle_and_drain_lines():
    rate = log_rate(LINES)
    assert rate == 3 * 128 / sum(128 / x for x in (20_000.0, 22_000.0, 21_000.0))
    assert 20_000 < rate < 22_000


def test_a_steady_window_is_compared_when_the_client_has_one():
    out = Witness(None, 0).finish("http://unused", LINES, {"steady_output_throughput": 21_500.0,
                                                            "output_throughput": 30_000.0}, None, False)
    assert out["compared"] == "steady" and abs(out["gap_log"]) < 0.05 and "flag" not in out


def test_a_client_without_a_steady_window_is_witnessed_on_its_whole_run():
    """sglang.bench_serving reports the whole run only: the server's log still says whether it drove the server
    as hard as it read (on a real H200 its levels carried no witness at all)."""
    out = Witness(None, 0).finish("http://unused", LINES, {"output_throughput": 17_000.0}, None, False)
    assert out["compared"] == "whole_run"
    assert out["gap_log"] < -0.05 and out["flag"] == "disagree"
    assert "log_gen_throughput" not in Witness(None, 0).finish("http://unused", LINES[:2], {"output_throughput": 1.0},
                                                               None, False)
