"""The radix cache's worth depends on the workload, on the stand-in and in the search: prefix hits come from the real
token prefixes a client sends (live) and from the same prefixes named block by block (virtual); radix on costs a
little on every step. Chat-like multi-turn traffic favours it, unique random prompts do not."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.sim._server import Server
from tunectl.profile import WorkloadSpec, load_profile
from tunectl.runners.clients import builtin
from tunectl.runners.clients.base import Target
from tunectl.runners.hosts.local import LocalRunner
from tunectl.sim import TOKENIZER
from tunectl.sim.sched import BLOCK
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

DEFAULT = Path(__file__).resolve().parents[2] / "profiles" / "sim-glm5.yaml"
CHAT = {"kind": "shared_prefix", "name": "chat", "shared_prefix_len": 512, "input_len": 128, "output_len": 128,
        "range_ratio": 0.5, "turns": 4, "prompts_per_level": 2, "min_prompts": 8}
RANDOM = {"kind": "random", "input_len": 256, "output_len": 128, "prompts_per_level": 1, "min_prompts": 2}
# the default's best region (docs/sim.md), radix either way
BEST = {"disable-cuda-graph": False, "cuda-graph-max-bs": 256, "max-running-requests": 512,
        "flashinfer-cutlass-autotune": True, "disable-chunked-prefix-cache": True, "mem-fraction-static": 0.88}


def _profile(workload: dict):
    return load_profile(DEFAULT, {"bench.workloads": [workload]})


@pytest.mark.parametrize(("workload", "radix_wins"), [(CHAT, True), (RANDOM, False)])
def test_the_stand_ins_throughput_orders_radix_by_workload(workload: dict, radix_wins: bool) -> None:
    ev = VirtualEvaluator(_profile(workload))
    on, off = (ev(0, {**BEST, "disable-radix-cache": not flag}, "search") for flag in (True, False))
    assert on.status == off.status == "ok"
    for a, b in zip(on.levels, off.levels):
        if a.concurrency >= 16:                  # where batches form; at 1-4 streams both are latency-bound
            assert (a.output_throughput > b.output_throughput) == radix_wins, (a.concurrency, a, b)
    ratio = on.best_output_throughput / off.best_output_throughput
    assert ratio > 1.2 if radix_wins else 0.9 < ratio < 1.0


@pytest.mark.parametrize(("workload", "radix_on"), [(CHAT, True), (RANDOM, False)])
def test_the_search_recommends_radix_by_workload(workload: dict, radix_on: bool, tmp_path: Path) -> None:
    prof = _profile(workload)
    out = run_search(prof, trials=40, root=tmp_path, evaluate=VirtualEvaluator(prof), in_memory=True)
    assert out.best is not None
    assert out.best["params"]["disable-radix-cache"] is (not radix_on)


def _level(srv: Server, w: WorkloadSpec, c: int, n: int) -> None:
    target = Target(base_url=srv.url, host_url=srv.url, runner=LocalRunner(), python=sys.executable, out_dir="/tmp",
                    backend="sglang", model="default", tokenizer=str(TOKENIZER), request_timeout_s=60)
    assert builtin.CLIENT.run_level(target, w, c, n).ok


def _cached(srv: Server) -> list[int]:
    return [int(x) for x in re.findall(r"Prefill batch, .*#cached-token: (\d+)", srv.text())]


@pytest.mark.parametrize("radix", [True, False])
def test_live_prefix_hits_are_the_histories_blocks(launch, radix: bool) -> None:
    srv: Server = launch(*([] if radix else ["--disable-radix-cache"]), "--enable-metrics", scale=0.002)
    w = WorkloadSpec(kind="random", input_len=100, output_len=30, turns=3, warmup_requests=0)
    _level(srv, w, 4, 12)                  # 4 conversations of 3 turns, each turn resending the one before
    prompts = builtin.make_prompts(w, 12, salt=4)
    # a turn's cached prefix: the previous turn's prompt, whole blocks of it (the answer ids differ from what the
    # stand-in generated, as they would on SGLang: only the prompt was cached)
    want = sum((len(t.ids) // BLOCK) * BLOCK for p in prompts for t in p.turns()[:-1])
    got = sum(_cached(srv))
    assert got == (want if radix else 0)
    metrics = srv.get("/metrics")[1]
    assert re.search(r'^sglang:cached_tokens_total\{.*cache_source="device"\} ' + re.escape(str(float(got))) + "$",
                     metrics, re.M)
