"""The last H200 lease (docs/real-gpu.md, "The client beside the server"; docs/real-gpu/local/): the SSH search's
winner with tunectl's built-in client and the real sglang.bench_serving both on the GPU host, one launch; the
GLM-5-shaped model's second refusal; the triton_kernel MoE runner. What was recorded reads the same through today's
code."""
from __future__ import annotations

import json
from pathlib import Path

from tunectl.sglang.crashes.classifier import classify
from tunectl.models import TrialResult

DIR = Path(__file__).resolve().parents[2] / "docs" / "real-gpu" / "local"
TINY_GLM5 = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "tiny-glm5" / "config.json"


def trial(name: str) -> TrialResult:
    return TrialResult.from_dict(json.loads((DIR / name).read_text()))


def test_both_clients_measured_one_server_and_the_server_sided_with_the_builtin_client():
    r = trial("local.json")
    lv = {(x.workload, x.concurrency): x for x in r.levels}
    assert r.status == "ok" and r.teardown["verdict"] == "clean"
    for c in (128, 512):
        ours, real = lv[("random@builtin", c)], lv[("random@bench_serving", c)]
        assert ours.status == real.status == "ok"
        low, high = ours.output_throughput_ci95
        assert low <= ours.metrics["steady_output_throughput"] <= high
        # beside the server (no SSH forward) the built-in client read more than the real one, and the server's own
        # Decode-batch lines during the built-in level were closer to the built-in reading than to bench_serving's
        server = ours.witness["log_gen_throughput"]
        assert real.output_throughput < ours.output_throughput
        assert abs(ours.metrics["steady_output_throughput"] - server) < abs(real.output_throughput - server)
    assert abs(lv[("random@builtin", 128)].witness["gap_log"]) < 0.05


def test_the_glm5_shaped_model_was_refused_for_a_config_field_and_the_config_now_has_it():
    r = trial("glm5.json")
    log = (DIR / "results" / "h200-glm5" / "trials" / "0" / "server.log").read_text()
    info = classify(log, "startup", None, r.crash.exit_code)
    assert info is not None and info.signature == r.crash.signature == "model_config_missing_field"
    assert "'GlmMoeDsaConfig' object has no attribute 'topk_method'" in info.exception_line
    cfg = json.loads(TINY_GLM5.read_text())
    assert cfg["topk_method"] == "noaux_tc" and "moe_layer_freq" in cfg      # both refusals fixed


def test_the_triton_kernel_moe_runner_served_and_the_gpu_was_left_empty():
    r = trial("moe-tk2.json")
    assert r.status == "ok" and r.params == {"moe-runner-backend": "triton_kernel"}
    assert "triton_kernel" in r.launch.argv and r.levels[0].output_throughput > 0
    steps = (DIR / "steps.log").read_text().splitlines()
    assert steps[-1].strip() == "0 MiB"                    # nvidia-smi after its teardown
