"""Speculative decoding and GPU power on real SGLang 0.5.17, one H100 (docs/real-gpu.md, "Speculative decoding on
the real GPU"): the three sweeps of bench/gpu/spec.sh as tunectl recorded them, read back through tunectl's own
models, and the power check of bench/gpu/power_check.py on the nvidia-smi samples taken beside them."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.scripts import load_script
from tunectl.sglang.crashes.classifier import classify
from tunectl.models import TrialResult

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "real-gpu" / "results" / "spec-h100"


def _trial(name: str) -> TrialResult:
    return TrialResult.from_dict(json.loads((RUN / f"spec-{name}" / "trials" / "0" / "trial.json").read_text()))


def _levels(name: str) -> dict[int, dict]:
    return {lv.concurrency: {**lv.metrics, "level_tok_s": lv.output_throughput,
                             **{f"w_{k}": v for k, v in (lv.witness or {}).items()}}
            for lv in _trial(name).levels if lv.status == "ok"}


def test_ngram_pays_at_low_load_and_loses_at_high_load_with_the_acceptance_read_twice():
    off, ngram = _levels("off"), _levels("ngram")
    assert set(off) == set(ngram) == {1, 4, 16, 64, 256}
    for c, m in ngram.items():
        # SGLANG_SIMULATE_ACC_LEN=2.5 reaches NGRAM's verify too (ngram_worker.py imports eagle_sample): the decode
        # lines' `accept len` and /metrics' sglang:spec_accept_length both read it, within 5% of each other
        assert 2.3 < m["spec_accept_length"] < 2.7, c
        assert abs(m["spec_accept_length"] / m["w_server_spec_accept_length"] - 1) < 0.05, c
        assert "spec_accept_length" not in off[c]
    gain = {c: ngram[c]["level_tok_s"] / off[c]["level_tok_s"] for c in off}
    assert gain[1] > 1.3 and gain[4] > 1.3            # fewer, longer steps pay while the GPU has room
    assert gain[64] < 0.8 and gain[256] < 0.8          # verifying 4 drafted tokens per stream costs more than 2.5 win
    crossover = min(c for c in sorted(gain) if gain[c] < 1.0)
    assert crossover in (16, 64)
    assert ngram[1]["median_tpot_ms"] < off[1]["median_tpot_ms"]


def test_eagle_with_a_dummy_draft_died_at_startup_and_is_classified():
    t = _trial("eagle")
    assert t.status == "crashed" and not t.levels and t.crash.phase == "startup"
    log = (RUN / "spec-eagle" / "trials" / "0" / "server.log").read_text()
    info = classify(log, "startup", None, 137)
    assert (info.signature, info.cls) == ("python_module_missing", "config_error")
    assert "deep_gemm" in info.exception_line and "eagle_worker_v2.py" in info.traceback_excerpt


def _power_check():
    return load_script("bench/gpu/power_check.py")


def test_tunectl_power_agrees_with_nvidia_smi_sampled_beside():
    rows = _power_check().check(RUN)
    assert len(rows) == 10                               # every level of the two sweeps that served
    for r in rows:
        assert r["reader"] == "nvml" and r["tunectl_samples"] >= 10 and r["smi_samples"] >= 10, r
        assert abs(r["diff"]) < 0.08, r
    # the level files' own figure is the witness's: joules per token follow from it and the level's throughput
    # (the steady window's)
    for name in ("off", "ngram"):
        for m in _levels(name).values():
            assert m["gpu_power_w"] == m["w_power"]["watts"]
            assert abs(m["joules_per_output_token"] * m["level_tok_s"] / m["gpu_power_w"] - 1) < 0.01
    # power rises with load when nothing else changes
    off = {r["concurrency"]: r["smi_w"] for r in rows if r["study"] == "spec-off"}
    assert off[256] > off[64] > off[4]
