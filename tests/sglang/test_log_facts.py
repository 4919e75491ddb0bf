"""Every log fact the search acts on (`LOG_FACTS`, the one list the classifier writes and the search keeps) is read
from real SGLang logs: the fixtures captured from SGLang 0.5.17 (tests/fixtures/logs/) and the servers of the
real-GPU runs (docs/real-gpu/**/server.log). On the H100 landscape, whose flags are known per config, the facts
read back what each server was launched with."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunectl.sglang.crashes.classifier import LOG_FACTS, LogWatcher

ROOT = Path(__file__).resolve().parents[2]
REAL = sorted((ROOT / "tests" / "fixtures" / "logs").rglob("*.log")) + sorted((ROOT / "docs" / "real-gpu").rglob("server.log"))
LAND = ROOT / "docs" / "real-gpu" / "landscapes" / "llama8b-h100" / "results"


def facts(path: Path) -> dict[str, float]:
    return LogWatcher.read(path.read_bytes()).facts


@pytest.fixture(scope="module")
def read() -> dict[Path, dict[str, float]]:
    return {p: facts(p) for p in REAL}


def test_every_log_fact_is_read_from_a_real_log(read: dict[Path, dict[str, float]]) -> None:
    assert len(REAL) > 20
    unproven = [f for f in LOG_FACTS if not any(f in got for got in read.values())]
    assert unproven == []
    assert all(set(got) <= set(LOG_FACTS) for got in read.values())      # no fact outside the one list


def test_the_landscape_servers_facts_are_the_flags_they_ran_with(read: dict[Path, dict[str, float]]) -> None:
    runs = sorted(LAND.glob("*/trials/0"))
    assert len(runs) >= 7
    pools = {}
    for run in runs:
        cfg = json.loads((run / "launch.json").read_text())["config"]
        got = read[run / "server.log"]
        assert got["max_running_requests"] == cfg["max-running-requests"], run
        assert got["chunked_prefill_size"] == cfg.get("chunked-prefill-size", got["chunked_prefill_size"]), run
        fp8 = str(cfg.get("kv-cache-dtype", "auto")).startswith("fp8")
        assert got["kv_cache_bits"] == (8 if fp8 else 16), run
        assert got["kv_tokens"] == got["max_total_num_tokens"] > 0
        pools.setdefault(fp8, set()).add(got["max_total_num_tokens"])
        graphs = "cuda-graph-max-bs-decode" in json.dumps(json.loads((run / "launch.json").read_text())["exec_argv"])
        assert ("graph_bs_max" in got) == graphs, run
    # one memory fraction for all: one pool size per KV dtype, FP8 holding twice the tokens
    (bf16,), (fp8_pool,) = pools[False], pools[True]
    assert fp8_pool == 2 * bf16
