"""The real SGLang client (`python -m sglang.bench_serving`, 0.5.9) runs unmodified against the stand-in.

Needs the client installed: `pip install --no-deps sglang==0.5.9` plus pybase64 pillow transformers datasets
(what bench_serving imports); the tokenizer is the stand-in's own (`tunectl.sim.TOKENIZER`), the tiny Llama's used on
the H200.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim._server import TOKENIZER, Server

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("sglang", "transformers", "datasets", "pybase64", "PIL")),
    reason="sglang.bench_serving 0.5.9 not installed")


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai"])
def test_bench_serving_runs_unmodified(launch, tmp_path: Path, backend: str) -> None:
    srv: Server = launch("--disable-radix-cache", "--stream-interval", "16", scale=0.005)
    out = tmp_path / "result.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--host", "127.0.0.1",
           "--port", str(srv.port), "--dataset-name", "random-ids", "--tokenizer", str(TOKENIZER),
           "--model", str(TOKENIZER), "--num-prompts", "16", "--max-concurrency", "8",
           "--random-input-len", "256", "--random-output-len", "32", "--random-range-ratio", "1",
           "--output-file", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "no_proxy": "127.0.0.1,localhost"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == 16 and result["total_output_tokens"] == 16 * 32
    # the client measured wall time; divided by the reported scale it is in modeled units
    modeled = result["output_throughput"] * 0.005
    assert 0 < modeled < 5000
    assert srv.proc.poll() is None
