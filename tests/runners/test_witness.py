"""The server's own figures beside the client's (runners/server/witness.py)."""
from __future__ import annotations

import re
from pathlib import Path

from tunectl.runners.server.witness import Witness, log_rate

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "h200-dsa" / "bench-serving-decode-lines.log"

# (running requests, gen throughput) of a level's `Decode batch` lines; the first spans the idle time before the
# level, the last the drain
LINES = [(3, 900.0), (128, 20_000.0), (128, 22_000.0), (128, 21_000.0), (40, 8_000.0)]


def test_the_log_rate_is_time_weighted_and_leaves_out_the_idle_and_drain_lines():
    rate = log_rate(LINES)
    # each interval holds the mean of the running requests at its ends: the ramp-up interval (3 -> 128) fewer
    spans = [(65.5, 20_000.0), (128, 22_000.0), (128, 21_000.0)]
    assert rate == sum(n for n, _ in spans) / sum(n / x for n, x in spans)
    assert 20_000 < rate < 22_000


def test_on_a_real_servers_bursty_levels_the_trapezoid_reads_closer_to_the_real_clients_whole_run():
    """Real SGLang 0.5.17 on an H200, the real sglang.bench_serving at 128 and 512 streams (max-running 438):
    its whole-run readings were 18,055 and 16,350 tok/s. Weighting each log line by the running requests at its
    end alone read 14,230 and 8,630 (-21%, -47%): an interval that began with a burst of admissions counted as
    full. The trapezoid reads 16,280 and 11,939 (-10%, -27%): closer, still approximate (the exact witness is the
    Prometheus counter)."""
    levels, rx = [], re.compile(r"#running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+)")
    for line in REAL.read_text().splitlines():
        if line.startswith("#"):
            levels.append([])
        elif m := rx.search(line):
            levels[-1].append((int(m.group(1)), float(m.group(2))))
    for lines, client in zip(levels, (18_055.0, 16_350.0)):
        end_only = [(b, x) for (b, x) in lines[1:-1]]
        old = sum(n for n, _ in end_only) / sum(n / x for n, x in end_only)
        new = log_rate(lines)
        assert abs(new / client - 1) < 0.30 and abs(new / client - 1) < abs(old / client - 1) - 0.10


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
