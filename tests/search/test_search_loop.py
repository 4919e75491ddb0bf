"""The search loop on the stand-in's virtual-clock model: crash feedback, infra retries, finalists, storage."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from tunectl.search.finalists import candidates

from tests.search.conftest import make_profile
from tunectl.models import CrashInfo, TrialResult
from tunectl.profile import default_profile_path, load_profile
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)


def search_trials(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=storage)
    return [t for t in study.trials if t.user_attrs.get("role") in ("search", "baseline")
            and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def crashed(t: optuna.trial.FrozenTrial) -> bool:
    return t.user_attrs.get("crash_class") is not None


def test_crashes_are_told_complete_with_graded_constraint(tmp_path: Path) -> None:
    prof = make_profile()
    out = run_search(prof, trials=16, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=1)
    trials = search_trials(out.storage, prof.name)
    crashes = [t for t in trials if crashed(t)]
    assert crashes, "the seeds' space holds crashing configs: a 16-trial search meets some"
    for t in crashes:
        assert t.state == TrialState.COMPLETE            # never FAIL: the sampler must see them
        assert t.constraints["crash"] > 0
        assert t.user_attrs["crash_signature"]
    startup = [t for t in crashes if t.user_attrs["crash_phase"] == "startup"]
    load = [t for t in crashes if t.user_attrs["crash_phase"] == "load"]
    if startup and load:   # graded: a config that served some levels violates less than one that never started
        assert max(_crash_c(t) for t in load) < min(_crash_c(t) for t in startup)


def _crash_c(t: optuna.trial.FrozenTrial) -> float:
    return float(t.constraints["crash"])


def _late_crash_share(sampler: str, seeds: range, tmp_path: Path) -> tuple[float, float]:
    early = late = n_early = n_late = 0
    for seed in seeds:
        prof = make_profile(search__sampler=sampler, search__finalists={"top_k": 0, "reruns": 0})
        out = run_search(prof, trials=40, root=tmp_path / f"{sampler}{seed}", evaluate=VirtualEvaluator(prof, seed),
                         seed=seed)
        flags = [crashed(t) for t in search_trials(out.storage, prof.name)]
        early, n_early = early + sum(flags[:10]), n_early + len(flags[:10])
        late, n_late = late + sum(flags[20:]), n_late + len(flags[20:])
    return early / n_early, late / n_late


@pytest.mark.slow
def test_crash_feedback_steers_tpe_away_from_crashing_regions(tmp_path: Path) -> None:
    early, late = _late_crash_share("tpe", range(3), tmp_path)
    _, random_late = _late_crash_share("random", range(3), tmp_path)
    assert late < early, f"TPE should visit crashing configs less later on (early {early:.0%}, late {late:.0%})"
    assert late < random_late, f"TPE late crash share {late:.0%} vs random {random_late:.0%}"


class FlakyHost:
    """The virtual engine, but the first attempt of chosen trials meets an infra fault or a flaky crash."""

    def __init__(self, prof: Any, infra_on: set[int], flaky_on: set[int]):
        self.inner = VirtualEvaluator(prof)
        self.infra_on, self.flaky_on = infra_on, flaky_on
        self.calls: list[tuple[int, dict[str, Any]]] = []

    def __call__(self, n: int, params: dict[str, Any], role: str, should_prune: Any = None) -> TrialResult:
        self.calls.append((n, dict(params)))
        if n in self.infra_on:
            return TrialResult(trial=n, status="infra", params=params, role=role,
                               crash=CrashInfo("infra", "ssh_link_lost", "startup", message="link lost"))
        if n in self.flaky_on:
            return TrialResult(trial=n, status="crashed", params=params, role=role,
                               crash=CrashInfo("flaky", "nccl_timeout", "load", level=64))
        return self.inner(n, params, role, should_prune)


def test_infra_fault_is_retried_and_not_counted(tmp_path: Path) -> None:
    prof = make_profile(search__finalists={"top_k": 0, "reruns": 0})
    host = FlakyHost(prof, infra_on={3, 4}, flaky_on={6})
    out = run_search(prof, trials=8, root=tmp_path, evaluate=host, seed=0)
    study = optuna.load_study(study_name=prof.name, storage=out.storage)
    t3, t4, t5 = study.trials[3], study.trials[4], study.trials[5]
    assert t3.state == TrialState.FAIL and t3.user_attrs["infra_fault"]       # never told as the config's fault
    assert t4.params == t3.params and t4.user_attrs["retry_of"] == 3 and t4.state == TrialState.FAIL
    assert t5.params == t3.params and t5.user_attrs["infra_tries"] == 2                # the third try counts:
    assert t5.state in (TrialState.COMPLETE, TrialState.PRUNED)                        # told as its result
    t6, t7 = study.trials[6], study.trials[7]
    assert t6.state == TrialState.FAIL and t6.user_attrs["flaky_retry"]      # flaky: one more try first
    assert t7.params == t6.params and t7.user_attrs["flaky_tries"] == 1
    assert len(search_trials(out.storage, prof.name)) == 8                     # retries did not eat the budget
    assert out.retries == 3


def test_a_host_that_fails_every_launch_stops_the_search_instead_of_retrying_forever(tmp_path: Path) -> None:
    # from trial 2 on the server never starts, whatever the config (the engine gone from the host): three infra
    # faults in a row and the search stops, says why, and keeps what it measured; no finalist reruns
    prof = make_profile(search__finalists={"top_k": 1, "reruns": 2})
    host = FlakyHost(prof, infra_on=set(range(2, 1000)), flaky_on=set())
    out = run_search(prof, trials=10, root=tmp_path, evaluate=host, seed=0)
    assert len(host.calls) == 2 + 3
    assert out.stopped is not None and "infra" in out.stopped and "link lost" in out.stopped
    assert out.trials == 2 and out.best is not None and out.best["trial"] in (0, 1)
    assert out.finalists == []


class CrashOnRerun:
    """The virtual engine, except the best config of the search crashes when re-run as a finalist."""

    def __init__(self, prof: Any):
        self.inner = VirtualEvaluator(prof)
        self.victim: dict[str, Any] | None = None

    def __call__(self, n: int, params: dict[str, Any], role: str, should_prune: Any = None) -> TrialResult:
        res = self.inner(n, params, role, should_prune)
        if role == "finalist" and self.victim is None:
            self.victim = dict(params)
        if role == "finalist" and params == self.victim:
            res.status = "crashed"
            res.crash = CrashInfo("load_crash", "page_table_1_flattened", "load", level=512)
            res.levels = res.levels[:-1]
        return res


def test_finalists_demote_a_config_that_crashes_on_rerun(tmp_path: Path) -> None:
    prof = make_profile(search__finalists={"top_k": 2, "reruns": 2})
    engine = CrashOnRerun(prof)
    out = run_search(prof, trials=14, root=tmp_path, evaluate=engine, seed=3)
    verdicts = {v["trial"]: v for v in out.finalists}
    demoted = [v for v in verdicts.values() if not v["survived"]]
    assert demoted and demoted[0]["params"] == engine.victim and "demoted" in demoted[0]["reason"]
    assert out.best is not None and out.best["params"] != engine.victim
    assert verdicts[out.best["trial"]]["survived"]
    study = optuna.load_study(study_name=prof.name, storage=out.storage)
    top = candidates(study.trials)[0]
    assert top.params == engine.victim      # the search's top config was not crowned


def test_storage_opens_with_optunas_own_load_study(tmp_path: Path) -> None:
    prof = make_profile(search__finalists={"top_k": 1, "reruns": 1})
    out = run_search(prof, trials=6, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    assert (tmp_path / prof.name / "study.db").exists()
    study = optuna.load_study(study_name=prof.name, storage=f"sqlite:///{tmp_path / prof.name / 'study.db'}")
    assert study.trials[0].user_attrs["role"] == "baseline"
    assert study.trials[0].params["max-running-requests"] == 64              # the profile's base values
    assert "cuda-graph-max-bs" in study.trials[0].params
    assert any(t.user_attrs.get("role") == "finalist" for t in study.trials)
    assert study.best_trials  # what optuna-dashboard shows first
    assert (tmp_path / prof.name / "best.json").exists() and out.best is not None


def test_rerun_of_the_same_command_resumes_without_repeating(tmp_path: Path) -> None:
    prof = make_profile(search__finalists={"top_k": 0, "reruns": 0})
    engine = VirtualEvaluator(prof)
    run_search(prof, trials=6, root=tmp_path, evaluate=engine, seed=0)
    first = engine.calls
    out = run_search(prof, trials=10, root=tmp_path, evaluate=engine, seed=0)
    assert engine.calls - first == 4 and out.trials == 10
    keys = [str(sorted(t.params.items())) for t in search_trials(out.storage, prof.name)]
    assert len(keys) == len(set(keys))                                        # no config evaluated twice


def test_try_first_configs_run_right_after_the_baseline(tmp_path: Path) -> None:
    seeds = {"disable-cuda-graph": True, "max-running-requests": 2048, "disable-radix-cache": True}
    prof = make_profile(search__try_first=[seeds], search__finalists={"top_k": 0, "reruns": 0})
    run_search(prof, trials=4, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    study = optuna.load_study(study_name=prof.name, storage=f"sqlite:///{tmp_path / prof.name / 'study.db'}")
    first = study.trials[1]
    assert first.user_attrs["proposed_by"] == "profile"
    assert {k: first.params[k] for k in seeds} == seeds
    assert "cuda-graph-max-bs" not in first.params          # inactive once graphs are off (its `when`)
    base = study.trials[0].params
    assert first.params["moe-runner-backend"] == base["moe-runner-backend"]   # the rest from the baseline


def test_try_first_names_only_knobs(tmp_path: Path) -> None:
    from tunectl.errors import ProfileError
    from tunectl.profile import load_profile

    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nmodel: {path: m}\nsearch:\n  space:\n    a: {type: bool}\n  try_first:\n    - {b: true}\n")
    with pytest.raises(ProfileError, match=r"try_first\[0\]: 'b' is not a knob; valid: \['a'\]"):
        load_profile(bad)


def test_sampler_proposals_of_ranged_knobs_run_on_the_grid(tmp_path: Path) -> None:
    """max-running-requests (int, log 32..2048) and the mem fraction (float, step 0.01) are ranges: a sampler
    proposal between grid points (max-running 1020) is not run as it is; its grid version runs instead. (The
    sampler proposes while the loop has no served config to step from: here the baseline's mem fraction, 0.94,
    runs out of memory at startup.)"""
    from tunectl.profile import load_profile
    from tunectl.search.space import GRID_POINTS, grid_space

    prof = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "sim-mixtral-8x22b-4xh100.yaml")
    prof.search.finalists.top_k = 0
    prof.search.space["mem-fraction-static"].default = 0.94
    out = run_search(prof, trials=12, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    study = optuna.load_study(study_name=prof.name, storage=out.storage)
    grid = grid_space(prof.search, points=GRID_POINTS)
    regridded = [t for t in study.trials if t.user_attrs.get("regridded")]
    assert study.trials[0].user_attrs.get("crash_phase") == "startup"
    assert regridded and all(t.state == TrialState.FAIL for t in regridded)        # never run, never counted
    assert any(t.params["max-running-requests"] not in grid["max-running-requests"] for t in regridded)
    sampled = [t for t in search_trials(out.storage, prof.name)
               if t.user_attrs.get("role") == "search" and t.user_attrs.get("proposed_by") in (None, "sampler")]
    assert any(t.user_attrs.get("proposed_by") == "sampler" for t in sampled)
    for t in sampled:
        assert t.params["max-running-requests"] in grid["max-running-requests"], t.params
        assert t.params["mem-fraction-static"] in grid["mem-fraction-static"], t.params


def test_the_embedded_default_finds_a_confirmed_winner_without_a_hand_tuned_start(tmp_path: Path) -> None:
    """The main job's profile lists no `try_first`: the search alone (baseline first, then its own proposals) ends
    with a confirmed winner above the seeds' config (1,950 tok/s at 256) by the main job's margin, on the model."""
    prof = load_profile(default_profile_path())
    assert prof.search.try_first == []
    out = run_search(prof, trials=40, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=prof.search.seed)
    assert out.best is not None and out.best["confirmed_value"] is not None
    assert out.best["confirmed_value"] > 2145
