"""What running tunectl against real SGLang 0.5.17 on an H200 taught (docs/real-gpu.md), pinned with the real logs
tunectl captured there (tests/fixtures/logs/h200-tunectl/)."""
from __future__ import annotations

from pathlib import Path

from tunectl.sglang.crashes.classifier import LogWatcher, classify
from tunectl.profile import load_profile
from tunectl.runners.clients.prompts import make_prompts, warmup_prompts
from tunectl.runners.server import plan as server

LOGS = Path(__file__).parents[1] / "fixtures" / "logs" / "h200-tunectl"
PROFILE = Path(__file__).parents[2] / "profiles" / "tiny-llama-h200.yaml"


def test_cublas_alloc_failure_at_startup_is_a_startup_oom() -> None:
    crash = classify((LOGS / "startup-oom-cublas.log").read_text(), "startup", None, 137)
    assert crash is not None and (crash.cls, crash.signature) == ("config_error", "cuda_oom_startup")
    assert "CUBLAS_STATUS_ALLOC_FAILED" in crash.exception_line and "mem-fraction-static" in crash.message


def test_config_option_sglang_rejects_is_a_config_error_with_the_fix() -> None:
    crash = classify((LOGS / "config-option-unsupported.log").read_text(), "startup", None, 1)
    assert crash is not None and (crash.cls, crash.signature) == ("config_error", "config_option_unsupported")
    assert "cuda_graph_backend_prefill" in crash.exception_line and "argv_flags" in crash.message


def test_argv_flags_go_on_the_command_line_not_into_the_config_file() -> None:
    prof = load_profile(PROFILE)
    plan = server.build_plan(prof, {"cuda-graph-max-bs-decode": 128, "max-running-requests": 64}, "r1", "/t")
    for flag in ("cuda-graph-backend-prefill", "cuda-graph-max-bs-decode"):
        assert flag not in plan.config                       # the --config file SGLang would reject
        assert f"--{flag}" in plan.exec_argv                  # ... travels as argv instead
        assert f"--{flag}" in plan.argv                       # and the reproduction command has it
    assert plan.config["max-running-requests"] == 64
    i = plan.exec_argv.index("--cuda-graph-max-bs-decode")
    assert plan.exec_argv[i + 1] == "128"


def test_token_ids_stay_inside_a_small_vocabulary() -> None:
    """Ids beyond tiny-llama's 4,096-token vocabulary were a device-side assert on the real server."""
    w = load_profile(PROFILE).bench.workloads[0]
    assert w.vocab_size == 4096
    ids = [i for p in make_prompts(w, 64) + warmup_prompts(w) for i in p.ids]
    assert max(ids) < 4096 and min(ids) >= 1
    default = w.model_copy(update={"vocab_size": None})
    assert max(i for p in make_prompts(default, 64) for i in p.ids) >= 4096   # the cap is what keeps them in


def test_real_run_with_both_clients_is_not_a_crash() -> None:
    data = (LOGS / "sweep-both-clients.log").read_bytes()
    w = LogWatcher.read(data)
    assert not w.crashed
    assert classify(data.decode(errors="replace"), "load", 512, 137) is None


# ------------------------------------------------------------------- over SSH, tiny MoE (tests/fixtures/logs/h200-ssh)
SSH_LOGS = Path(__file__).parents[1] / "fixtures" / "logs" / "h200-ssh"


def test_option_names_in_the_server_args_line_are_no_crash_evidence() -> None:
    """The real GLM-5-shaped crash (a config field missing) was first called a FlashInfer autotune failure: the
    catalog's autotune pattern matched `disable_flashinfer_autotune=False` in the server_args line."""
    text = (SSH_LOGS / "glm5-shaped-missing-moe-layer-freq.log").read_text()
    assert "disable_flashinfer_autotune=False" in text
    crash = classify(text, "startup", None, 137)
    assert crash is not None and (crash.cls, crash.signature) == ("config_error", "model_config_missing_field")
    assert crash.exception_line == "AttributeError: 'GlmMoeDsaConfig' object has no attribute 'moe_layer_freq'"
    renamed = text.replace("AttributeError: 'GlmMoeDsaConfig' object", "AttributeError: 'GlmMoeDsaModel' object")
    assert classify(renamed, "startup", None, 137).signature == "unknown"     # never the autotune by its name


def test_moe_runner_refused_by_sglang_is_a_config_error_with_a_repair() -> None:
    """flashinfer_cutedsl on a bf16 model: SGLang's own argument check, before the server_args line, exit 1."""
    from tunectl.sglang.crashes.classifier import repairs_for

    text = (SSH_LOGS / "moe-runner-cutedsl-bf16.log").read_text()
    crash = classify(text, "startup", None, 1)
    assert crash is not None and (crash.cls, crash.signature) == ("config_error", "moe_runner_unsupported")
    assert crash.exception_line == "AssertionError: Invalid quantization 'None'."
    assert repairs_for("moe_runner_unsupported") == (("moe-runner-backend", "auto"),)
