"""Fixtures for the search tests: a profile whose space is the seeds' knobs on the stand-in's GLM-5 card."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from tunectl.profile import Profile

SPACE: dict[str, Any] = {
    "disable-cuda-graph": {"type": "bool", "default": False},
    "cuda-graph-max-bs": {"type": "int", "choices": [32, 64, 128, 256, 512], "default": 32,
                          "when": {"disable-cuda-graph": False}},
    "max-running-requests": {"type": "int", "choices": [64, 128, 256, 512, 1024, 2048], "default": 64},
    "moe-runner-backend": {"type": "categorical", "choices": ["flashinfer_cutlass", "triton", "cutlass"],
                           "default": "flashinfer_cutlass"},
    "autotune-patch": {"type": "bool", "patch": "0001-flashinfer-cutlass-autotune"},
    "disable-radix-cache": {"type": "bool"},
    "disable-chunked-prefix-cache": {"type": "bool"},
    "mem-fraction-static": {"type": "float", "low": 0.8, "high": 0.94, "step": 0.02, "default": 0.88},
}

BASE: dict[str, Any] = {
    "name": "search-test",
    "model": {"path": "zai-org/GLM-5-NVFP4"},
    "server": {"engine": "sim", "flags": {"tp-size": 8, "kv-cache-dtype": "fp8_e4m3", "attention-backend": "nsa",
                                          "nsa-prefill-backend": "flashmla_sparse", "nsa-decode-backend": "trtllm"}},
    "search": {"space": SPACE, "finalists": {"top_k": 2, "reruns": 2}},
    "bench": {"levels": [1, 4, 16, 64, 256, 512]},
}


def make_profile(**over: Any) -> Profile:
    data = copy.deepcopy(BASE)
    for dotted, value in over.items():
        node = data
        parts = dotted.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return Profile.model_validate(data)


@pytest.fixture
def profile() -> Profile:
    return make_profile()
