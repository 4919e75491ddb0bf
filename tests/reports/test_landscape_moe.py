"""The MoE landscape (docs/real-gpu/landscapes/qwen3moe30b-h100/): its design is the full factorial it says, balanced
in the order the leases measure it, over knobs its profile searches, for a model whose bf16 weights leave a KV pool on
the GPU it names, and it is what bench/gpu/landscape_design.py writes; what the leases measured so far is pinned."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import yaml

from tests.helpers.scripts import load_script
from tunectl.models import TrialResult
from tunectl.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
LAND = ROOT / "docs" / "real-gpu" / "landscapes" / "qwen3moe30b-h100"
DESIGN = yaml.safe_load((LAND / "design.yaml").read_text())
GRAPH = ("cuda-graph-backend-decode", "cuda-graph-max-bs-decode")


def _script():
    return load_script("bench/gpu/landscape_design.py")


def test_the_design_is_what_the_script_writes_and_a_balanced_full_factorial():
    assert DESIGN == _script().design(DESIGN["name"], DESIGN["gpu"], model="qwen3moe30b")
    cfgs = [c["set"] for c in DESIGN["configs"]]
    two = [k for k in DESIGN["knobs"] if k not in GRAPH]
    assert "moe-runner-backend" in two and len(two) == 3
    cells = {tuple(s[k] for k in two) for s in cfgs}
    assert cells == set(itertools.product(*(DESIGN["knobs"][k] for k in two)))
    graphs = [(s["cuda-graph-backend-decode"], s.get("cuda-graph-max-bs-decode")) for s in cfgs]
    assert len(cfgs) == len(set(map(lambda s: tuple(sorted(s.items())), cfgs))) == 24
    assert sorted(set(graphs), key=str) == sorted({("disabled", None), ("full", 32), ("full", 256)}, key=str)
    for k in two:                                # the first twelve alone are balanced
        assert sorted(sum(1 for s in cfgs[:12] if s[k] == v) for v in DESIGN["knobs"][k]) == [6, 6]


def _kv_tokens_estimate(prof, bytes_per_value: int) -> float:
    cfg = json.loads((ROOT / DESIGN["model"]["config"]).read_text())
    h, layers, experts = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_experts"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    attn = h * cfg["num_attention_heads"] * cfg["head_dim"] * 2 + h * kv * 2
    params = layers * (attn + experts * 3 * h * cfg["moe_intermediate_size"] + h * experts) + 2 * cfg["vocab_size"] * h
    assert 55 < params * 2 / 1e9 < 65                                 # Qwen3-30B-A3B's ~30B parameters, bf16
    static_gb = prof.server.flags["mem-fraction-static"] * 79.19 * 1.073741824   # an H100 80GB as torch reports it
    return (static_gb - params * 2 / 1e9) * 1e9 / (layers * kv * 2 * bytes_per_value)


def test_the_profile_searches_the_designs_knobs_and_the_model_fits_the_gpu():
    prof = load_profile(ROOT / DESIGN["profile"])
    assert set(DESIGN["knobs"]) <= set(prof.search.space)
    assert prof.server.sglang_version == DESIGN["sglang"] and prof.bench.levels == DESIGN["levels"]
    cfg = json.loads((ROOT / DESIGN["model"]["config"]).read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["vocab_size"] == 4096
    # bf16 weights of Qwen3-30B-A3B's ~30B parameters leave a pool for the top level's 256 streams
    assert _kv_tokens_estimate(prof, 2) > 256 * (256 + 128)


def test_what_the_leases_measured_so_far():
    # lease 3 (2026-12-06, H100 80GB HBM3): c00 only (13 minutes: eager MoE decodes at ~0.1 s a step).
    # docs/real-gpu/landscapes/qwen3moe30b-h100/leases.md. Extend this set as leases add configs.
    runs = {d.name: TrialResult.from_dict(json.loads((d / "trials" / "0" / "trial.json").read_text()))
            for d in sorted((LAND / "results").glob(f"{DESIGN['name']}-c*"))}
    assert set(runs) == {"qwen3moe30b-h100-c00"}
    c00 = runs["qwen3moe30b-h100-c00"]
    assert c00.status == "ok" and c00.teardown["verdict"] == "clean"
    got = {(x.workload, x.concurrency) for x in c00.levels if x.status == "ok"}
    assert got == {(f"random@{c}", lvl) for c in ("builtin", "bench_serving") for lvl in DESIGN["levels"]}
    log = (LAND / "results" / "qwen3moe30b-h100-c00" / "trials" / "0" / "server.log").read_text()
    # the pool the design's memory estimate promised: FP8 KV (c00) holds twice the bf16 estimate, within 10%
    kv = int(re.search(r"max_total_num_tokens=(\d+)", log).group(1))
    assert abs(kv / _kv_tokens_estimate(load_profile(ROOT / DESIGN["profile"]), 1) - 1) < 0.10
    # max-running 64 holds the batch at 64 while 256 streams queue behind it
    running = [int(m) for m in re.findall(r"Decode batch, #running-req: (\d+)", log)]
    assert max(running) == 64
    assert re.search(r"#queue-req: [1-9]\d{1,}", log)
