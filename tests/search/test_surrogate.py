"""The local steps' value model (search/surrogate.py): the running-batch cap enters as a hinge at the ladder's top
level, so a config throttled by its cap does not teach the model that its other values are slow."""
from __future__ import annotations

from pathlib import Path

from tunectl.profile import SearchSpec, load_profile
from tunectl.search.steps import admission
from tunectl.search.surrogate import ValueModel

ROOT = Path(__file__).resolve().parents[2]
RUNNER, CAP, MEM = "moe-runner-backend", "max-running-requests", "mem-fraction-static"
SPACE = SearchSpec.model_validate({"space": {
    RUNNER: {"type": "categorical", "choices": ["triton", "flashinfer_cutlass"], "default": "triton"},
    CAP: {"type": "int", "low": 32, "high": 2048, "log": True, "default": 2048},
    MEM: {"type": "float", "low": 0.78, "high": 0.94, "step": 0.01, "default": 0.85}}})


def served(runner: str, cap: int, mem: float) -> tuple[dict, float]:
    # a landscape where the cap throttles every batch below the 512 requests the top levels keep running, and
    # the second runner is 25% faster
    value = (1.25 if runner == "flashinfer_cutlass" else 1.0) * 1000.0 * min(cap, 512) / 512 * (1 + mem - 0.85)
    return {RUNNER: runner, CAP: cap, MEM: mem}, value


def test_a_config_throttled_by_its_running_cap_does_not_make_its_runner_look_slow() -> None:
    # the only config with the faster runner ran capped at 74 requests (a random start) and served a fifth of
    # the best; from the incumbent's cap of 2048, the runner's move is rated by what the runner did, not the cap
    rows = [served("triton", 2048, 0.85), served("triton", 891, 0.88), served("triton", 388, 0.85),
            served("triton", 169, 0.81), served("triton", 2048, 0.81), served("flashinfer_cutlass", 74, 0.85)]
    move = {RUNNER: "flashinfer_cutlass", CAP: 2048, MEM: 0.85}
    stay = {**move, RUNNER: "triton"}

    def runner_share(model: ValueModel) -> float:
        return model.predict(move) / model.predict(stay)

    hinged = ValueModel(SPACE, rows, (CAP, 1024.0))
    plain = ValueModel(SPACE, rows)
    assert runner_share(plain) < 0.6                 # a quadratic in the cap's position blames the runner
    assert runner_share(hinged) > 0.7                # the hinge takes the throttling, ridge shrinkage the rest
    assert hinged.predict({**stay, CAP: 169}) < 0.5 * hinged.predict(stay)      # and the cap's own effect stays


def test_admission_is_the_knob_that_caps_the_batch_and_the_ladders_top_level() -> None:
    mixtral = load_profile(ROOT / "profiles" / "sim-mixtral-8x22b-4xh100.yaml")
    assert admission(mixtral) == (CAP, float(max(mixtral.bench.levels)))
    mixtral.search.space.pop(CAP)
    assert admission(mixtral) is None                # no knob drives it: no hinge
    glm5 = load_profile(ROOT / "profiles" / "sim-glm5.yaml")
    assert admission(glm5) == (CAP, 512.0)


def test_a_value_tried_only_in_pruned_configs_is_no_longer_rated_as_never_tried() -> None:
    # the runner deep_gemm ran once and was pruned on the ladder (no value to fit); flashinfer_cutlass never ran.
    # The pruned run narrows deep_gemm's uncertainty, not its mean: the never-tried runner is the optimistic move
    space = SearchSpec.model_validate({"space": {
        **{k: v.model_dump(exclude_none=True) for k, v in SPACE.space.items()},
        RUNNER: {"type": "categorical", "choices": ["triton", "flashinfer_cutlass", "deep_gemm"],
                 "default": "triton"}}})
    rows = [served("triton", 2048, 0.85), served("triton", 891, 0.88), served("triton", 388, 0.85),
            served("triton", 2048, 0.81)]
    stay = {RUNNER: "triton", CAP: 2048, MEM: 0.85}
    pruned, untried = {**stay, RUNNER: "deep_gemm"}, {**stay, RUNNER: "flashinfer_cutlass"}
    before = ValueModel(space, rows, (CAP, 1024.0))
    after = ValueModel(space, rows, (CAP, 1024.0), known=[pruned])
    assert before.upper(pruned) == before.upper(untried)            # both unseen: equally optimistic
    assert after.upper(pruned) < 0.99 * after.upper(untried)
    assert after.predict(pruned) == before.predict(pruned)          # the mean is not moved by a run with no value
    assert after.predict(stay) == before.predict(stay)
