"""The H200 lease of docs/real-gpu.md, "The GLM-5-shaped model serves; FlashInfer MoE runners; two clients within
5%" (docs/real-gpu/dsa-runners/): what real SGLang 0.5.17 did, read through today's code."""
from __future__ import annotations

import json
from pathlib import Path

from tunectl.sglang.crashes.classifier import classify
from tunectl.models import TrialResult
from tunectl.runners.checks.patches import load_manifest

DIR = Path(__file__).resolve().parents[2] / "docs" / "real-gpu" / "dsa-runners"


def trial(name: str) -> TrialResult:
    return TrialResult.from_dict(json.loads((DIR / name).read_text()))


def log(study: str) -> str:
    return (DIR / "results" / study / "trials" / "0" / "server.log").read_text()


def test_the_glm5_shaped_model_died_in_the_dsa_mha_prefill_for_a_kernel_the_install_lacks():
    for name, study in (("glm5.json", "h200-glm5"), ("glm5-prefix.json", "h200-glm5-prefix")):
        r, text = trial(name), log(study)
        assert r.status == "crashed" and r.teardown["verdict"] == "clean"
        assert "cuda_graph_end" in r.startup_phases            # decode graphs captured; the first prefill died
        info = classify(text, "startup", None, r.crash.exit_code)
        assert (info.signature, info.cls) == ("kernel_not_installed", "config_error")
        assert info.exception_line.startswith("ImportError: Can not import FA3 in sgl_kernel")
        frames = text[text.index("Traceback"):text.index("Can not import FA3")]
        assert "in _forward_standard_mha" in frames and "flash_attention_v3.py" in frames   # DSA's MHA prefill
        assert "Set DSA backends for fp8_e4m3 KV Cache: prefill=flashmla_kv, decode=flashmla_kv." in text


def test_with_the_mla_prefill_it_served_both_levels_with_fp8_kv_and_the_dsa_backends():
    r, text = trial("glm5-mla.json"), log("h200-glm5-mla")
    assert r.status == "ok" and r.teardown["verdict"] == "clean"
    assert r.launch.env["SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"] == "0"
    assert "Dense attention kv len threshold is manually set to 0 for DSA" in text
    assert "KV Cache is allocated. dtype: torch.float8_e4m3fn" in text
    lv = {x.concurrency: x for x in r.levels}
    assert set(lv) == {16, 64} and all(x.status == "ok" and x.failed_requests == 0 for x in lv.values())
    low, high = lv[64].output_throughput_ci95
    assert 5_000 < low <= lv[64].metrics["steady_output_throughput"] <= high
    # patch 0004 was applied (its hash recorded) and stayed silent: the MLA prefill never reaches its line
    assert r.patch_hashes == {"0004-log-dsa-fp8-prefix": load_manifest()["0004-log-dsa-fp8-prefix"].sha256}
    assert "tunectl patch 0004" not in text
    assert (DIR / "steps-glm5-mla.log").read_text().strip().endswith("gpu 0 MiB")


def test_flashinfer_trtllm_on_sm90_stalled_in_autotune_and_cutlass_was_stopped_while_it_compiled():
    r = trial("moe-flashinfer-trtllm.json")
    assert (r.crash.cls, r.crash.signature) == ("startup_timeout", "timeout_autotune")
    assert r.params == {"moe-runner-backend": "flashinfer_trtllm"} and r.teardown["verdict"] == "clean"
    assert "Running FlashInfer autotune" in r.crash.exception_line
    cut = json.loads((DIR / "results" / "h200-moe-flashinfer-cutlass-noautotune" / "trials" / "0" /
                      "trial.json").read_text())
    # SIGTERM to tunectl while FlashInfer's JIT (ninja + nvcc, each in its own process group) built fused_moe_90:
    # the compilers were in the snapshot (found by the run's environment marker) and nothing was left
    assert cut["teardown"]["verdict"] == "clean" and len(cut["teardown"]["snapshot_pids"]) > 20
    assert (DIR / "leftover-after-teardown.txt").read_text() == ""
    assert (DIR / "gpu-after-term.txt").read_text().strip() == "0 MiB"


def test_beside_the_server_the_two_clients_read_within_5_percent():
    r = trial("local.json")
    lv = {(x.workload, x.concurrency): x for x in r.levels}
    for c in (128, 512):
        ours, real = lv[("random@builtin", c)], lv[("random@bench_serving", c)]
        assert ours.status == real.status == "ok" and real.completed == 8 * c
        assert abs(ours.metrics["output_throughput"] / real.output_throughput - 1) < 0.05     # whole runs
        low, high = ours.output_throughput_ci95                      # the real client's reading inside our
        assert low <= real.output_throughput <= high                 # steady interval
