"""Finalists compared by intervals: ties are called ties, gains carry their interval (real in-memory Optuna)."""
from __future__ import annotations

from typing import Any

import optuna
from tunectl.search import finalists as fin


def _tell(study: optuna.Study, params: dict[str, Any], value: float, half: float, **attrs: Any) -> int:
    study.enqueue_trial(params)
    t = study.ask()
    for k in params:
        t.suggest_categorical(k, [0, 1, 2])
    for k, v in attrs.items():
        t.set_user_attr(k, v)
    t.set_user_attr("objective_ci95", [value * (1 - half), value * (1 + half)])
    t.set_constraint("crash", 0.0)
    study.tell(t, value)
    return t.number


def _study(a_runs: list[float], b_runs: list[float], base: float, half: float = 0.02) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    _tell(study, {"x": 0}, base, half, role="baseline")
    a = _tell(study, {"x": 1}, a_runs[0], half, role="search")
    b = _tell(study, {"x": 2}, b_runs[0], half, role="search")
    for n, runs in ((a, a_runs), (b, b_runs)):
        for i, v in enumerate(runs[1:]):
            _tell(study, {"x": 1 if n == a else 2}, v, half, role="finalist", finalist_of=n, rerun=i + 1)
    return study


def _verdicts(study: optuna.Study) -> list[fin.FinalistVerdict]:
    trials = study.get_trials(deepcopy=False)
    return [fin.verdict(trials, t, 2) for t in fin.pick(trials, 2, 1)]


def test_finalists_inside_each_others_noise_are_a_tie() -> None:
    study = _study([1010, 990, 1000], [1000, 1005, 985], base=500)
    verdicts = _verdicts(study)
    win = fin.winner(verdicts, 2)
    assert win is not None and all(v.survived and v.launches == 3 for v in verdicts)
    other = next(v.trial for v in verdicts if v.trial != win.trial)
    assert fin.ties(verdicts, win) == [other]
    g = fin.gain_over(win.interval, fin.baseline_interval(study.get_trials()))
    assert g is not None and g["verdict"] == "above" and g["low"] < 2.0 < g["high"]
    assert g["text"].startswith("2.0") and "(" in g["text"]


def test_a_clear_difference_is_a_win_and_a_gain_inside_the_noise_is_a_tie() -> None:
    study = _study([1300, 1290, 1310], [1000, 1005, 995], base=1270)
    verdicts = _verdicts(study)
    win = fin.winner(verdicts, 2)
    assert win is not None and win.search_value == 1300
    assert fin.ties(verdicts, win) == []
    assert win.launch_spread == (1310 - 1290) / 1300
    g = fin.gain_over(win.interval, fin.baseline_interval(study.get_trials()))
    assert g is not None and g["verdict"] == "tie"              # +2.4% over a baseline measured at +-2%
    assert g["low"] < 1.0 < g["high"]
