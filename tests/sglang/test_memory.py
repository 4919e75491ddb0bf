"""SGLang's memory physics (tunectl/sglang/memory.py) checked on real SGLang 0.5.17 logs: the H100 landscape's
servers (docs/real-gpu/landscapes/llama8b-h100/results/, the Llama-3.1-8B-shaped model at mem-fraction 0.85) and
the fixtures in tests/fixtures/logs/. Each rule the search acts on is read from real lines here, not from the
stand-in's."""
from __future__ import annotations

from pathlib import Path

import pytest

from tunectl.models import RAISE
from tunectl.sglang import memory
from tunectl.sglang.crashes.classifier import LogWatcher, classify

ROOT = Path(__file__).resolve().parents[2]
LAND = ROOT / "docs" / "real-gpu" / "landscapes" / "llama8b-h100" / "results"
LOGS = ROOT / "tests" / "fixtures" / "logs"
MEM = 0.85          # profiles/real-llama8b-h100.yaml: every landscape config ran at this fraction


def facts(path: Path) -> dict[str, float]:
    w = LogWatcher.read(path.read_bytes())
    assert not w.crashed and w.ready
    return w.facts


def served(config: str) -> dict[str, float]:
    return facts(LAND / f"llama8b-h100-{config}" / "trials" / "0" / "server.log")


def test_graph_memory_from_two_max_batch_sizes_predicts_a_third_launch() -> None:
    # c04 and c01 captured decode graphs up to 32 (0.10 GB), c02 up to 256 (0.41 GB); c05, another launch with
    # graphs to 256 (and an FP8 pool), logged 0.42 GB
    line = memory.graph_memory([served("c04"), served("c01"), served("c02")])
    assert line is not None and line(256) == pytest.approx(served("c05")["graph_mem_gb"], abs=0.02)
    # from one size alone the rule scales in proportion: an overestimate (part of the memory is fixed), never under
    one = memory.graph_memory([served("c04")])
    assert one is not None and one(256) >= served("c02")["graph_mem_gb"]


def test_the_room_graphs_take_is_what_the_larger_capture_left() -> None:
    # from c04's log alone (graphs to 32, 11.27 GB left after startup) and the graph line, raising the graphs to
    # 256 at the same fraction leaves what c02 logged (10.96 GB): asked to leave 11.2 GB, the fraction must drop
    # by exactly the difference over the GPU's 78.5 GB
    c04, c02 = served("c04"), served("c02")
    line = memory.graph_memory([c04, c02])
    was = {memory.MEM_FRACTION: MEM, memory.GRAPH_MAX_BS: 32}
    cand = {memory.MEM_FRACTION: MEM, memory.GRAPH_MAX_BS: 256}
    left = c02["available_gpu_mem_gb"]
    bound = memory.graph_room_bound(was, cand, c04, line, 11.2)
    assert bound == pytest.approx(MEM - (11.2 - left) / c04["gpu_mem_gb"], abs=2e-4)
    assert memory.graph_room_bound(was, cand, c04, line, left - 0.05) is None     # the floor already holds
    assert memory.graph_room_bound(was, {**cand, memory.NO_GRAPHS: True}, c04, line, 11.2) is None


def test_the_footprint_weighs_the_pool_and_the_graphs_in_gb() -> None:
    fp = memory.footprint([served("c04"), served("c02")])
    assert fp is not None and fp.total_gb == 78.5
    small = {memory.MEM_FRACTION: MEM, memory.GRAPH_MAX_BS: 32}
    big = {memory.MEM_FRACTION: MEM, memory.GRAPH_MAX_BS: 256}
    assert fp.excess(big, small) == pytest.approx((0.41 - 0.10) / 78.5, abs=1e-3)
    assert fp.of({**big, memory.NO_GRAPHS: True}) is None


def test_a_real_startup_oom_says_how_much_of_the_gpu_was_missing() -> None:
    crash = classify((LOGS / "server-startup-oom.log").read_text(), "startup", None, 137)
    assert crash is not None and crash.signature == "cuda_oom_startup"
    # "Tried to allocate 70.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 6.31 MiB is free"
    assert memory.oom_missing(crash.exception_line) == pytest.approx(70 / 1024 / 139.8)
    assert memory.oom_surely_missing(crash.exception_line) == pytest.approx((70 - 6.31) / 1024 / 139.8)
    bound = memory.mem_fraction_bound({memory.MEM_FRACTION: 0.95}, memory.oom_missing(crash.exception_line))
    assert bound[memory.MEM_FRACTION] == pytest.approx(0.95 - 70 / 1024 / 139.8)
    assert memory.oom_missing("RuntimeError: CUDA error: out of memory") is None     # a message without sizes


def test_the_pool_the_log_sized_bounds_the_running_requests() -> None:
    f = served("c05")                                   # FP8 KV: 878,028 tokens
    assert memory.pool_bounds(f, 384) == {memory.MAX_RUNNING: pytest.approx(878028 / 384)}
    assert memory.pool_bounds({}, 384) == {}


def test_fp8_kv_is_offered_for_a_full_bf16_pool_and_not_for_one_the_log_says_is_fp8() -> None:
    full = facts(LOGS / "llama8b-h100" / "kv-pressure.log")         # bf16 pool, full, retracting
    view = {memory.KV_DTYPE: "auto", memory.MEM_FRACTION: 0.3, memory.MAX_RUNNING: 512, memory.GRAPH_MAX_BS: 256}
    hints = memory.log_hints(view, {}, full, 384, "fp8_e4m3")
    assert ([(memory.KV_DTYPE, "fp8_e4m3"), (memory.MEM_FRACTION, RAISE)], {}) in hints
    fp8 = served("c05")                                 # kv-cache-dtype fp8_e4m3: the log says 8 bits
    assert fp8["kv_cache_bits"] == 8
    assert memory.kv_relief({memory.KV_DTYPE: "auto"}, "fp8_e4m3", fp8) == []
    assert memory.kv_relief({memory.KV_DTYPE: "auto"}, None, full) == []          # no FP8 choice to take


def test_a_capped_eager_server_gets_its_cap_raised_and_its_graphs_on() -> None:
    f = facts(LOGS / "llama8b-h100" / "eager-queue-at-cap.log")    # landscape c00: graphs off, cap 64, 192 queued
    view = {memory.NO_GRAPHS: True, memory.MAX_RUNNING: 64, memory.KV_DTYPE: "fp8_e4m3"}
    hints = memory.log_hints(view, {}, f, 384, "fp8_e4m3")
    assert ([(memory.NO_GRAPHS, False)], {memory.GRAPH_MAX_BS: 64}) in hints
    assert ([(memory.MAX_RUNNING, RAISE)], {memory.MAX_RUNNING: 64 + 192}) in hints
