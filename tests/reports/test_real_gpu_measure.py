"""One config on three fresh launches of real SGLang 0.5.17 (H200, tiny MoE, over SSH), each level measured by the
built-in client and then by the real sglang.bench_serving on the same server (docs/real-gpu.md, "Measurements on
fresh launches", docs/real-gpu/measure/): what was recorded still reads the same through today's code."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunectl.launches import summarize
from tunectl.models import TrialResult

DIR = Path(__file__).resolve().parents[2] / "docs" / "real-gpu" / "measure"
CAP_S, WAVES = 40.0, 8           # the campaign's bench.max_level_s and prompts_per_level


def launches(name: str) -> list[TrialResult]:
    return [TrialResult.from_dict(d) for d in json.loads((DIR / name).read_text())["launches"]]


@pytest.mark.parametrize("name", ["winner-x3.json", "default-x3.json"])
def test_every_fresh_launch_lies_inside_the_pooled_interval(name: str) -> None:
    rows = summarize(launches(name))
    assert {(r.workload.split("@")[1], r.concurrency) for r in rows} >= {("builtin", 128), ("builtin", 512)}
    for row in rows:
        assert len(row.ok) >= 1 and row.held == len(row.ok), (row.workload, row.concurrency)
        if len(row.ok) == 3:
            assert 0 < row.spread < 0.30                  # three launches of one config agree within 30%


def test_the_builtin_client_through_the_ssh_forward_was_slower_and_said_so() -> None:
    runs = launches("winner-x3.json")
    flagged = 0
    for r in runs:
        lv = {(x.workload, x.concurrency): x for x in r.levels}
        ours, real = lv[("random@builtin", 128)], lv[("random@bench_serving", 128)]
        assert ours.output_throughput < 0.75 * real.output_throughput       # same server, same launch
        # the server agreed with the slow client: in a closed loop a slow client serves it fewer requests
        assert abs(ours.witness["gap_log"]) < 0.10
        flagged += ours.client_bound
    assert flagged == 3 and [r.status for r in runs] == ["ok", "ok", "infra"]


def test_the_failed_levels_were_cut_by_their_cap_not_lost_requests() -> None:
    """The fix in runners/clients/builtin.py: these levels' 'failed' requests were never sent."""
    cut = [lv for r in launches("winner-x3.json") + launches("default-x3.json") for lv in r.levels
           if lv.status == "failed"]
    assert len(cut) == 3
    for lv in cut:
        assert lv.completed + lv.failed_requests == WAVES * lv.concurrency and lv.duration_s >= CAP_S
        assert lv.capped and lv.metrics["steady_output_throughput"] > 0


def test_every_teardown_was_clean_and_left_the_gpu_empty() -> None:
    for r in launches("winner-x3.json") + launches("default-x3.json"):
        assert r.teardown["verdict"] == "clean"
    for f in DIR.glob("gpu-*.csv"):
        assert f.read_text().split(",")[1].strip() == "0 MiB"
