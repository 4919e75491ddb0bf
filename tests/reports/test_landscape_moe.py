"""The MoE landscape's design (docs/real-gpu/landscapes/qwen3moe30b-h100/, not yet measured): the full factorial it
says, balanced in the order the leases measure it, over knobs its profile searches, for a model whose bf16 weights
leave a KV pool on the GPU it names; and it is what bench/gpu/landscape_design.py writes."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import yaml

from tests.helpers.scripts import load_script
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


def test_the_profile_searches_the_designs_knobs_and_the_model_fits_the_gpu():
    prof = load_profile(ROOT / DESIGN["profile"])
    assert set(DESIGN["knobs"]) <= set(prof.search.space)
    assert prof.server.sglang_version == DESIGN["sglang"] and prof.bench.levels == DESIGN["levels"]
    cfg = json.loads((ROOT / DESIGN["model"]["config"]).read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["vocab_size"] == 4096
    h, layers, experts = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_experts"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    attn = h * cfg["num_attention_heads"] * cfg["head_dim"] * 2 + h * kv * 2
    params = layers * (attn + experts * 3 * h * cfg["moe_intermediate_size"] + h * experts) + 2 * cfg["vocab_size"] * h
    weights_gb = params * 2 / 1e9                                     # bf16
    assert 55 < weights_gb < 65                                       # Qwen3-30B-A3B's ~30B parameters
    static_gb = prof.server.flags["mem-fraction-static"] * 79.19 * 1.073741824   # an H100 80GB as torch reports it
    kv_tokens = (static_gb - weights_gb) * 1e9 / (layers * kv * 2 * 2)
    assert kv_tokens > 256 * (256 + 128)                              # the top level's 256 streams fit in the pool
