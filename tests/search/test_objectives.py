"""The objective's other two paths on the stand-in's virtual model: SLO limits as constraints, and the
multi-objective study (throughput vs p99 TTFT)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from tunectl.search.feedback import PENALTY_LATENCY_MS

from tests.search.conftest import make_profile
from tunectl.models import TrialResult
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Recording:
    """The virtual engine, keeping every trial's result (per level: throughput and p99 TTFT)."""

    def __init__(self, prof: Any, seed: int = 0):
        self.inner = VirtualEvaluator(prof, seed)
        self.results: dict[int, TrialResult] = {}

    def __call__(self, n: int, params: dict[str, Any], role: str, should_prune: Any = None) -> TrialResult:
        res = self.inner(n, params, role, should_prune)
        self.results[n] = res
        return res


def finished(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=storage)
    return [t for t in study.trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]


def unconstrained_ttft(tmp_path: Path) -> list[float]:
    """p99 TTFT of every stable level the baseline and a few trials saw, without an SLO."""
    prof = make_profile(search__finalists={"top_k": 0, "reruns": 0})
    engine = Recording(prof)
    run_search(prof, trials=6, root=tmp_path / "free", evaluate=engine, seed=0)
    return sorted(lv.metrics["p99_ttft_ms"] for r in engine.results.values() for lv in r.stable_levels)


def test_slo_limits_are_constraints_and_the_winner_meets_them(tmp_path: Path) -> None:
    seen = unconstrained_ttft(tmp_path)
    limit = seen[len(seen) // 2]               # a limit some levels meet and others do not
    prof = make_profile(objective={"slo": {"p99_ttft_ms": limit}}, search__finalists={"top_k": 1, "reruns": 1})
    engine = Recording(prof)
    out = run_search(prof, trials=14, root=tmp_path / "slo", evaluate=engine, seed=0)
    trials = finished(out.storage, prof.name)
    assert trials and all("slo" in t.constraints for t in trials)
    for t in trials:
        res = engine.results[t.number]
        meeting = [lv for lv in res.stable_levels if lv.metrics["p99_ttft_ms"] <= limit]
        if t.user_attrs.get("crash_class") is None and meeting:
            assert t.constraints["slo"] <= 0
            assert t.values[0] == max(lv.output_throughput for lv in meeting)   # never a level over the limit
        elif not meeting:
            assert t.constraints["slo"] > 0                                      # infeasible, told as such
    assert any(t.values[0] < engine.results[t.number].best_output_throughput for t in trials)  # it did bite
    assert out.best is not None
    winner = engine.results[out.best["trial"]]
    level = next(lv for lv in winner.levels if lv.concurrency == out.best["best_concurrency"])
    assert level.metrics["p99_ttft_ms"] <= limit


def test_multi_objective_study_holds_throughput_and_p99_ttft(tmp_path: Path) -> None:
    prof = make_profile(objective={"multi_objective": True}, search__finalists={"top_k": 1, "reruns": 1})
    engine = Recording(prof)
    out = run_search(prof, trials=12, root=tmp_path, evaluate=engine, seed=2)
    study = optuna.load_study(study_name=prof.name, storage=out.storage)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    trials = finished(out.storage, prof.name)
    for t in trials:
        res = engine.results[t.number]
        assert len(t.values) == 2
        if not res.stable_levels:
            assert t.values == [0.0, PENALTY_LATENCY_MS]          # never served: the worst on both axes
            continue
        level = next(lv for lv in res.stable_levels if lv.concurrency == t.user_attrs["best_concurrency"])
        assert t.values == [level.output_throughput, level.metrics["p99_ttft_ms"]]   # one level, both axes
    front = study.best_trials
    assert front and all(t.number in engine.results for t in front)
    ttft = [t.values[1] for t in front]
    thr = [t.values[0] for t in front]
    assert sorted(thr) == [thr[i] for i in sorted(range(len(front)), key=lambda i: ttft[i])]   # a real trade-off
    searched = [t for t in trials if t.user_attrs.get("role") in ("search", "baseline")
                and all(v <= 0 for v in t.constraints.values())]
    assert out.best is not None and out.best["value"] == max(t.values[0] for t in searched)
    assert out.finalists and out.finalists[0]["survived"]


def test_goodput_mode_maximizes_the_capacity_at_the_slo(tmp_path: Path) -> None:
    """Each config's value is the highest request rate its bracketing search passed (>= 99% of requests within
    the SLO); the winner serves more within the SLO than the baseline, whatever its raw throughput."""
    prof = make_profile(objective={"mode": "goodput", "slo": {"p99_ttft_ms": 2000.0}, "slo_attainment": 0.99},
                        bench__min_level_s=10, search__finalists={"top_k": 1, "reruns": 1})
    engine = Recording(prof)
    out = run_search(prof, trials=10, root=tmp_path, evaluate=engine, seed=0)
    trials = finished(out.storage, prof.name)
    assert trials
    for t in trials:
        res = engine.results[t.number]
        if res.status != "ok":
            continue
        cap = res.capacity
        assert t.values[0] == cap["capacity"] and cap["low"] == cap["capacity"] and t.constraints["slo"] <= 0
        passed = [lv for lv in res.levels if lv.metrics["slo_attainment"] >= 0.99]
        assert t.values[0] == max(lv.request_rate for lv in passed)       # never a rate that missed the SLO
        failed = [lv.request_rate for lv in res.levels if lv.metrics["slo_attainment"] < 0.99]
        assert failed and min(failed) > t.values[0]                         # bracketed from above
    base = next(t for t in trials if t.number == 0)
    assert out.best is not None and out.best["metric"] == "capacity" and out.best["value"] > base.values[0]
