"""Writes a landscape's design.yaml (docs/real-gpu.md, "Measured landscapes"): the full factorial of a small
space of SGLang flags, in the order it is to be measured, so that a lease that stops part-way still leaves a
balanced subset behind.

Order: the half of the 2^3 part (three two-level knobs: for the dense model max-running x chunked prefill x KV
dtype, for the MoE model the MoE runner x max-running x KV dtype) whose coded product is +1 comes first (each of
those three knobs at each value equally often), crossed with the three CUDA-graph settings in a Latin order (every
run of three configs has the three graph settings and three different 2^3 cells); then the other half in the same
way. Config ids (c00 ...) follow that order.

  python3 bench/gpu/landscape_design.py NAME GPU OUT.yaml [PROFILE] [--model llama8b|qwen3moe30b]
  (PROFILE: default the model's profile)
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import yaml

GRAPHS = [  # the graph knob: off, on with a small max batch, on with a large one
    {"cuda-graph-backend-decode": "disabled"},
    {"cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 32},
    {"cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 256},
]
TWO_LEVEL = {"max-running-requests": [64, 512], "chunked-prefill-size": [2048, 8192],
             "kv-cache-dtype": ["auto", "fp8_e4m3"]}
MODELS = {
    "llama8b": {
        "description": "Llama-3.1-8B-shaped (32 layers, hidden 4096, 32 heads, 8 KV heads, intermediate 14336, llama3 "
                       "rope), bf16 random weights (--load-format dummy), vocabulary 4,096",
        "config": "bench/gpu/llama8b/config.json", "profile": "profiles/real-llama8b-h100.yaml",
        "two_level": TWO_LEVEL},
    # the MoE runner is the knob a MoE model adds (auto: SGLang's Triton fused MoE on bf16; triton_kernel: the
    # Triton-kernels runner, served on the GLM-5-shaped model, docs/real-gpu.md); the chunk size stays the profile's
    "qwen3moe30b": {
        "description": "Qwen3-30B-A3B-shaped MoE (48 layers, hidden 2048, 32 heads, 4 KV heads of 128, 128 experts of "
                       "768, 8 per token), bf16 random weights (--load-format dummy, ~60 GB), vocabulary 4,096",
        "config": "bench/gpu/qwen3moe30b/config.json", "profile": "profiles/real-qwen3moe30b-h100.yaml",
        "two_level": {"moe-runner-backend": ["auto", "triton_kernel"], "max-running-requests": [64, 512],
                      "kv-cache-dtype": ["auto", "fp8_e4m3"]}},
}


def _half(sign: int, two_level: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cells of the 2^3 part whose coded product (-1 / +1 per knob) is `sign`."""
    names = list(two_level)
    cells = []
    for code in itertools.product((-1, 1), repeat=len(names)):
        if code[0] * code[1] * code[2] == sign:
            cells.append({n: two_level[n][(c + 1) // 2] for n, c in zip(names, code)})
    return cells


def configs(two_level: dict[str, list[Any]] = TWO_LEVEL) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sign in (1, -1):
        cells = _half(sign, two_level)
        for rnd in range(len(cells)):
            for g, graph in enumerate(GRAPHS):
                out.append({**graph, **cells[(rnd + g) % len(cells)]})
    return [{"id": f"c{i:02d}", "set": s} for i, s in enumerate(out)]


def design(name: str, gpu: str, profile: str | None = None, model: str = "llama8b") -> dict[str, Any]:
    m = MODELS[model]
    return {
        "name": name,
        "model": {"description": m["description"], "config": m["config"]},
        "gpu": gpu,
        "sglang": "0.5.17",
        "profile": profile or m["profile"],
        "levels": [16, 64, 256],
        "requests_per_level": 4,
        "workload": {"kind": "random", "input_len": 256, "output_len": 128},
        "clients": ["builtin", "bench_serving"],
        "knobs": {"cuda-graph-backend-decode": ["disabled", "full"], "cuda-graph-max-bs-decode": [32, 256],
                  **m["two_level"]},
        "configs": configs(m["two_level"]),
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    model = "llama8b"
    if "--model" in args:
        i = args.index("--model")
        model = args[i + 1]
        del args[i:i + 2]
    if len(args) < 3 or model not in MODELS:
        sys.exit(f"usage: landscape_design.py NAME GPU OUT.yaml [PROFILE] [--model {'|'.join(MODELS)}]")
    Path(args[2]).parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(design(args[0], args[1], *args[3:4], model=model), sort_keys=False, width=120)
    Path(args[2]).write_text(text)
