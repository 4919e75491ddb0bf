"""Where a flag has any effect (tunectl/sglang/scopes.py): a knob outside its flag's scope, read from SGLang's source, is
inactive there, as under a `when:` the profile wrote, and takes its baseline value when a move brings it in."""
from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest

from tunectl.sglang import scopes
from tunectl.profile import load_profile
from tunectl.search.sampler import complete
from tunectl.search.space import base_values, is_active
from tunectl.search.steps import Steps
from tunectl.wiring.study import open_storage, run_search
from tunectl.wiring.virtual import VirtualEvaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[2]
DEEPSEEK = ROOT / "profiles" / "sim-deepseek-v32-8xb200.yaml"     # SGLang 0.5.9, no `when:` on the autotune knob
GLM5 = ROOT / "profiles" / "sim-glm5.yaml"                         # 0.5.9, the autotune patch as a knob
AUTOTUNE, RUNNER = "disable-flashinfer-autotune", "moe-runner-backend"


def test_sglang_0_5_9_autotune_knob_acts_only_with_the_runners_it_autotunes() -> None:
    space = load_profile(DEEPSEEK).search.space
    assert "when" not in DEEPSEEK.read_text().split(AUTOTUNE)[1].split("\n")[0]      # the profile wrote none
    for runner, active in (("triton", False), ("deep_gemm", False), ("flashinfer_trtllm", True),
                           ("flashinfer_mxfp4", True)):
        assert is_active(space[AUTOTUNE], {RUNNER: runner}) is active, runner


def test_a_switch_into_the_scope_brings_the_knob_at_its_baseline_value() -> None:
    # the walk's incumbent runs deep_gemm; a move to flashinfer_trtllm must not carry an autotune value picked
    # where it did nothing: it takes SGLang's default (autotune on), as a knob under a `when:` does
    prof = load_profile(DEEPSEEK)
    base = base_values(prof)
    incumbent = complete(prof.search, {**base, RUNNER: "deep_gemm", AUTOTUNE: True}, random.Random(0), base)
    assert AUTOTUNE not in incumbent
    moved = complete(prof.search, {**incumbent, RUNNER: "flashinfer_trtllm"}, random.Random(0), base)
    assert moved[AUTOTUNE] is False


def virtual_search(path: Path, trials: int, seed: int, root: Path,
                   baseline: dict[str, object] | None = None) -> list[optuna.trial.FrozenTrial]:
    """Every trial of a search on the stand-in's virtual model (no finalists). `baseline`: knob defaults instead of
    the profile's (a baseline that runs out of memory at startup leaves the loop no served config to step from, so
    the sampler proposes until one serves)."""
    prof = load_profile(path)
    prof.search.finalists.top_k = 0
    for name, value in (baseline or {}).items():
        prof.search.space[name].default = value
    url = f"memory:scopes:{path.name}:{seed}"
    run_search(prof, trials=trials, root=root, evaluate=VirtualEvaluator(prof, seed), seed=seed, storage_url=url)
    return optuna.load_study(study_name=prof.name, storage=open_storage(url)).trials


def test_no_trial_of_a_search_samples_the_knob_where_it_does_nothing(tmp_path: Path) -> None:
    trials = virtual_search(DEEPSEEK, 14, 0, tmp_path)
    ran = [t.params for t in trials if t.params]
    assert len(ran) >= 14
    assert {p[RUNNER] for p in ran} & {"triton", "deep_gemm"}                  # both sides were visited
    for p in ran:
        assert (AUTOTUNE in p) == (p[RUNNER] in ("flashinfer_trtllm", "flashinfer_mxfp4")), p


def test_rules_hold_only_for_the_versions_they_were_read_from() -> None:
    # 0.5.17 also autotunes dense FP8/FP4 GEMMs, whatever the MoE runner: no condition to imply there
    later = load_profile(DEEPSEEK, {"server.sglang_version": "0.5.17"})
    assert AUTOTUNE not in scopes.implied(later)
    assert is_active(later.search.space[AUTOTUNE], {RUNNER: "deep_gemm"})


def test_an_explicit_when_is_the_profiles_word_even_when_empty() -> None:
    prof = load_profile(DEEPSEEK, {f"search.space.{AUTOTUNE}.when": {}})
    assert AUTOTUNE not in scopes.implied(prof)
    assert is_active(prof.search.space[AUTOTUNE], {RUNNER: "deep_gemm"})


def test_the_autotune_patch_widens_the_scope_and_has_its_own() -> None:
    prof = load_profile(GLM5)          # runners flashinfer_cutlass, triton, flashinfer_trtllm; patch 0001 a knob
    space = prof.search.space
    assert is_active(space[AUTOTUNE], {RUNNER: "flashinfer_cutlass"})          # the patch makes cutlass autotune
    assert not is_active(space[AUTOTUNE], {RUNNER: "triton"})
    patch = "flashinfer-cutlass-autotune"
    assert is_active(space[patch], {RUNNER: "flashinfer_cutlass", AUTOTUNE: False})
    assert not is_active(space[patch], {RUNNER: "flashinfer_cutlass", AUTOTUNE: True})   # autotune off: no effect
    assert not is_active(space[patch], {RUNNER: "flashinfer_trtllm", AUTOTUNE: False})
    # without the patch in the profile, flashinfer_cutlass is out of the autotune knob's scope
    del space[patch]
    scopes.apply(prof)
    assert not is_active(space[AUTOTUNE], {RUNNER: "flashinfer_cutlass"})


def test_an_implied_condition_that_would_close_a_circle_is_dropped() -> None:
    # the profile makes the runner depend on the autotune knob; the autotune scope would make that knob depend on
    # the runner: the profile's word stands, the implied condition goes (validation would fail on the circle)
    prof = load_profile(DEEPSEEK, {f"search.space.{RUNNER}.when": {AUTOTUNE: False}})
    assert AUTOTUNE not in scopes.implied(prof)
    assert prof.search.space[AUTOTUNE].conditions == {}


def test_implied_conditions_stay_out_of_the_recorded_space() -> None:
    # a study records its space (study.json) and refuses to resume on another: what tunectl infers is not the
    # profile's, so a study begun before the rule existed resumes
    spec = load_profile(DEEPSEEK).search.space[AUTOTUNE]
    assert spec.conditions and spec.model_dump(mode="json")["when"] == {}


# ------------------------------------------------------------------------------------------ what a GPU lacks

L40S = ROOT / "profiles" / "sim-qwen3-30b-a3b-l40s.yaml"                 # compute capability 8.9


def test_gpu_model_names_give_their_compute_capability() -> None:
    assert scopes.sm_of("NVIDIA H200") == 90 and scopes.sm_of("NVIDIA L40S") == 89
    assert scopes.sm_of("NVIDIA RTX PRO 6000 Blackwell Server Edition") == 120
    assert scopes.sm_of("NVIDIA A100-SXM4-80GB") == 80 and scopes.sm_of("NVIDIA B200") == 100
    assert scopes.sm_of("NVIDIA H200, NVIDIA L4") is None          # mixed: no single answer
    assert scopes.sm_of("unknown") is None and scopes.sm_of("") is None


def test_backends_without_kernels_for_the_gpu_are_named() -> None:
    prof = load_profile(L40S)
    base = base_values(prof)
    lacks = scopes.gpu_lacks(prof, {**base, RUNNER: "deep_gemm"}, 89)
    assert len(lacks) == 1 and "deep_gemm" in lacks[0] and "8.9" in lacks[0]
    assert scopes.gpu_lacks(prof, {**base, RUNNER: "deep_gemm"}, 90) == []
    assert scopes.gpu_lacks(prof, {**base, "attention-backend": "fa3"}, 89) == []   # SGLang allows SM 8.x
    assert scopes.gpu_lacks(prof, {**base, "attention-backend": "fa3"}, 100)          # ... not Blackwell
    assert scopes.gpu_lacks(prof, {**base, RUNNER: "deep_gemm"}, None) == []          # unknown GPU: no opinion


def test_a_search_never_runs_a_backend_the_gpu_lacks(tmp_path: Path) -> None:
    # the L40S card's deep_gemm fails at startup ("DeepGEMM requires SM90"): proposals of it are dropped unrun.
    # The loop's own steps never propose it; the sampler proposes while no config has served (a baseline that runs
    # out of memory at startup): seeds are tried until its draws include deep_gemm, and no seed's search runs it.
    proposed: list[optuna.trial.FrozenTrial] = []
    for seed in range(8):
        trials = virtual_search(L40S, 16, seed, tmp_path / str(seed),
                                {"mem-fraction-static": 0.94, "cuda-graph-max-bs": 512})
        assert trials[0].user_attrs.get("crash_phase") == "startup"
        ran = [t for t in trials if t.state != optuna.trial.TrialState.FAIL]
        assert len(ran) >= 16 and not any(t.params.get(RUNNER) == "deep_gemm" for t in ran)
        proposed = [t for t in trials if t.params.get(RUNNER) == "deep_gemm"]
        if proposed:
            break
    assert proposed and all(t.state == optuna.trial.TrialState.FAIL for t in proposed)     # proposed, dropped
    # the rule itself, before any crash: certain on SM 8.9, silent on SM 9.0 and on an unknown GPU
    prof = load_profile(L40S)
    for sm, risk in ((89, 1.0), (90, 0.0), (None, 0.0)):
        steps = Steps(prof, None, random.Random(0), sm)
        assert steps.veto({**base_values(prof), RUNNER: "deep_gemm"}, [])[0] == risk


@pytest.mark.parametrize("parallel", [None, 2])
def test_a_search_that_ran_every_config_it_may_run_stops_without_running_what_the_vetoes_drop(
        tmp_path: Path, parallel: int | None) -> None:
    """On L40S, a space of the MoE runner and the attention backend alone: 12 configs, 3 with deep_gemm, which the
    GPU lacks (and FlashInfer CUTLASS, which crashes at startup on this card). Once the loop has run what it may,
    the sampler proposes configs already run or vetoed, and the loop steps off to unseen configs the vetoes allow,
    then stops: never a deep_gemm config, and no runner run again after its startup crash was known (a run of
    vetoed proposals used to end with the next proposal run as it was). Also with 2 trials in flight."""
    prof = load_profile(L40S)
    prof.search.finalists.top_k = 0
    prof.search.space = {k: v for k, v in prof.search.space.items() if k in (RUNNER, "attention-backend")}
    url = f"memory:scopes:step-off:{parallel}"
    out = run_search(prof, trials=14, root=tmp_path, evaluate=VirtualEvaluator(prof, 0), seed=0, storage_url=url,
                     parallel=parallel)
    trials = optuna.load_study(study_name=prof.name, storage=open_storage(url)).trials
    ran = [t for t in trials if t.state != optuna.trial.TrialState.FAIL and "duplicate_of" not in t.user_attrs]
    assert out.exhausted and len(ran) < 14
    assert not any(t.params[RUNNER] == "deep_gemm" for t in ran)
    crashed = [t for t in ran if t.user_attrs.get("crash_phase") == "startup"]
    for runner in {t.params[RUNNER] for t in crashed}:     # once, or once per slot: in flight before it crashed
        assert sum(t.params[RUNNER] == runner for t in crashed) <= (parallel or 1)
    assert {t.params[RUNNER] for t in ran} == {"auto", "triton", "flashinfer_cutlass"}
