"""Real SGLang 0.5.17 logs from one H100 serving the Llama-3.1-8B-shaped model
(tests/fixtures/logs/llama8b-h100/, docs/real-gpu.md "Measured landscapes"): the log facts the search acts on,
read from real lines, not the stand-in's. `kv-pressure.log`: mem-fraction 0.3 (an 85,001-token pool) under 256
streams: the pool fills and SGLang retracts; `eager-queue-at-cap.log`: landscape config c00 (graphs off, max-
running 64, FP8 KV) under 256 streams."""
from __future__ import annotations

from pathlib import Path

from tunectl.sglang.crashes.classifier import LogWatcher, classify
from tunectl.profile import load_profile
from tunectl.search.repair import log_hints, repaired_configs
from tunectl.search.sampler import complete
from tunectl.search.space import baseline_params

LOGS = Path(__file__).parents[1] / "fixtures" / "logs" / "llama8b-h100"
PROFILE = load_profile(Path(__file__).parents[2] / "profiles" / "real-llama8b-h100.yaml")


def facts(name: str) -> dict[str, float]:
    w = LogWatcher.read((LOGS / name).read_bytes())
    assert not w.crashed and w.ready
    return w.facts


def test_retraction_and_a_full_pool_are_read_from_real_lines() -> None:
    f = facts("kv-pressure.log")
    # "KV cache pool is full. Retract requests. #retracted_reqs: 1, ..." 40 times; decode lines at token usage
    # 0.91-0.99 with requests queued below the 512 cap
    assert f["retracted_reqs"] == 40
    assert f["decode_queue_pool_full"] == 33 and "decode_queue_at_cap" not in f
    assert (f["kv_tokens"], f["kv_cache_bits"], f["max_running_requests"]) == (85001, 16, 512)
    # the decode graphs' sizes and memory from the 0.5.17 capture lines
    assert (f["graph_bs_max"], f["graph_mem_gb"], f["gpu_mem_gb"]) == (256, 0.43, 78.5)


def test_queue_at_the_running_cap_and_eager_batches_are_read_from_real_lines() -> None:
    f = facts("eager-queue-at-cap.log")
    assert (f["max_running_requests"], f["decode_bs_max"], f["decode_bs_nograph_max"]) == (64, 64, 64)
    assert f["decode_queue_at_cap"] == 192 and "retracted_reqs" not in f
    assert f["kv_cache_bits"] == 8 and "graph_bs_max" not in f          # FP8 pool, no graphs captured


def test_served_runs_are_no_crash() -> None:
    for name in ("kv-pressure.log", "eager-queue-at-cap.log"):
        assert classify((LOGS / name).read_text(), "load", 256, 137) is None   # SIGTERM stop: exit 137


def test_the_real_lines_become_the_search_proposals() -> None:
    c00 = {"cuda-graph-backend-decode": "disabled", "max-running-requests": 64, "chunked-prefill-size": 2048,
           "kv-cache-dtype": "fp8_e4m3"}
    flags = {**PROFILE.server.flags, **c00}
    hints = log_hints(PROFILE.search, c00, flags, facts("eager-queue-at-cap.log"), 384)
    assert ([("max-running-requests", "<raise>")], {"max-running-requests": 256}) in [
        ([(k, str(v)) for k, v in moves], bounds) for moves, bounds in hints]
    full = {"cuda-graph-backend-decode": "full", "max-running-requests": 512, "chunked-prefill-size": 8192,
            "kv-cache-dtype": "auto"}
    flags = {**PROFILE.server.flags, **full, "mem-fraction-static": 0.3}
    hints = log_hints(PROFILE.search, full, flags, facts("kv-pressure.log"), 384)
    assert [[k for k, _ in moves] for moves, _ in hints] == [["kv-cache-dtype", "mem-fraction-static"]]
    assert hints[0][0][0] == ("kv-cache-dtype", "fp8_e4m3")


def test_decode_graphs_off_the_0517_way_get_switched_back_on() -> None:
    """c00 turns decode graphs off as 0.5.17 spells it (`cuda-graph-backend-decode: disabled`; its
    `disable-cuda-graph` is a deprecated alias that disables both phases) and its batches of 64 ran eager: one hint
    switches decode graphs back on, with a max bs that covers 64 (not the knob's first grid value). The prefill
    backend the profile fixes at `disabled` is not a graphs-off config: with decode graphs on, no such hint."""
    import random

    c00 = {"cuda-graph-backend-decode": "disabled", "max-running-requests": 64, "chunked-prefill-size": 2048,
           "kv-cache-dtype": "fp8_e4m3"}
    f = facts("eager-queue-at-cap.log")
    hints = log_hints(PROFILE.search, c00, {**PROFILE.server.flags, **c00}, f, 384)
    base = baseline_params(PROFILE)
    cands = [c for fixes, bounds in hints for c in repaired_configs(
        PROFILE.search, c00, fixes, lambda p: complete(PROFILE.search, p, random.Random(0), base), bounds)]
    assert {**c00, "cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 64} in cands
    assert len(hints) == 2                                    # graphs on, and max-running raised (above)
    on = {**c00, "cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 64}
    hints = log_hints(PROFILE.search, on, {**PROFILE.server.flags, **on}, f, 384)
    assert not any(moves for moves, _ in hints if any("backend" in str(t) or "disable" in str(t) for t, _ in moves))
