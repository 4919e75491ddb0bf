"""Several workloads in one objective (`objective.weights`): the told value is the weighted sum of each workload's
best level, per-workload bests are kept on the trial, and the weights steer the winner (on the virtual model:
chat traffic wants the radix cache, random prompts do not)."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tunectl.errors import ProfileError
from tunectl.profile import load_profile
from tunectl.search.feedback import score
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)
DEFAULT = Path(__file__).resolve().parents[2] / "profiles" / "sim-glm5.yaml"
CHAT = {"kind": "shared_prefix", "name": "chat", "shared_prefix_len": 512, "input_len": 128, "output_len": 128,
        "range_ratio": 0.5, "turns": 4, "prompts_per_level": 2, "min_prompts": 8}
RANDOM = {"kind": "random", "input_len": 256, "output_len": 128, "prompts_per_level": 1, "min_prompts": 2}


def _profile(weights: dict[str, float]):
    return load_profile(DEFAULT, {"bench.workloads": [CHAT, RANDOM], "objective.weights": weights,
                                  "search.finalists": {"top_k": 0, "reruns": 0}})


@pytest.mark.parametrize(("weights", "radix_on"), [({"chat": 1.0}, True), ({"random": 1.0}, False),
                                                   ({"chat": 0.7, "random": 0.3}, True)])
def test_the_weights_decide_the_winner(weights: dict[str, float], radix_on: bool, tmp_path: Path) -> None:
    prof = _profile(weights)
    out = run_search(prof, trials=30, root=tmp_path, evaluate=VirtualEvaluator(prof), in_memory=True)
    assert out.best is not None and out.best["params"]["disable-radix-cache"] is (not radix_on)
    study = optuna.load_study(study_name=prof.name, storage=out.storage)
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        per = t.user_attrs.get("objective_per_workload")
        if per is None:
            continue
        assert set(per) == set(weights)
        assert t.values[0] == pytest.approx(sum(w * per[k] for k, w in weights.items()), rel=1e-3)


def test_the_score_is_the_weighted_sum_of_each_workloads_best_level() -> None:
    prof = _profile({"chat": 0.25, "random": 2.0})
    res = VirtualEvaluator(prof)(0, {"disable-chunked-prefix-cache": True, "max-running-requests": 256}, "search")
    assert res.status == "ok"
    best = {w: max(lv.output_throughput for lv in res.stable_levels if lv.workload == w) for w in ("chat", "random")}
    sc = score(res, prof)
    assert sc.per_workload == pytest.approx(best)
    assert sc.value == pytest.approx(0.25 * best["chat"] + 2.0 * best["random"])
    assert {lv.workload for lv in res.levels} == {"chat", "random"}


def test_a_weight_must_name_a_workload(tmp_path: Path) -> None:
    data = yaml.safe_load(DEFAULT.read_text())
    data["bench"]["workloads"] = [CHAT, RANDOM]
    data["objective"]["weights"] = {"chatt": 1.0}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"'chatt' is not a workload; valid: chat, random") as err:
        load_profile(path)
    assert "\n" not in str(err.value)
