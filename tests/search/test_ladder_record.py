"""The `ladder` user attribute is a list of named LadderStep records; studies written before it stored positional
[workload, concurrency, status, throughput, duration] lists, and those still read the same."""
from __future__ import annotations

import json

import optuna

from tunectl.models import LadderStep, LevelResult, TrialResult, ladder_steps
from tunectl.search.feedback import ladder_attr
from tunectl.search.pruning import best_per_level, mean_durations, scaling_bounds
from tunectl.search.steps import level_values

LEVELS = [(1, 40.0, 2.0), (8, 300.0, 3.0), (64, 900.5, 4.0)]


def result() -> TrialResult:
    res = TrialResult(trial=3, status="ok", params={})
    res.levels = [LevelResult(c, "ok", "random", duration_s=d, metrics={"output_throughput": v}) for c, v, d in LEVELS]
    res.levels.append(LevelResult(256, "crashed", "random", duration_s=1.5))
    return res


def study_with(attr: list) -> list[optuna.trial.FrozenTrial]:
    study = optuna.create_study(direction="maximize")
    t = study.ask()
    t.set_user_attr("ladder", attr)
    t.set_constraint("crash", 0.0)
    study.tell(t, 1000.0)
    return study.trials


def test_a_trials_ladder_is_stored_by_name_and_read_back() -> None:
    attr = ladder_attr(result())
    assert json.loads(json.dumps(attr))[1] == {"workload": "random", "concurrency": 8, "status": "ok",
                                               "output_throughput": 300.0, "duration_s": 3.0}
    assert ladder_steps(attr) == [LadderStep.of(lv) for lv in result().levels]
    assert ladder_steps(None) == [] and ladder_steps("junk") == []


def test_old_positional_ladders_read_the_same_as_named_ones() -> None:
    named = study_with(ladder_attr(result()))
    old = study_with([[s.workload, s.concurrency, s.status, s.output_throughput, s.duration_s]
                      for s in ladder_steps(ladder_attr(result()))])
    for read in (best_per_level, scaling_bounds, mean_durations):
        assert read(named) == read(old) != {}
    assert level_values(named[0]) == level_values(old[0]) == {("random", c): v for c, v, _ in LEVELS}
    assert best_per_level(old)[("random", 64)].value == 900.5 and ("random", 256) not in best_per_level(old)


def test_an_open_loop_probe_keeps_its_request_rate_and_is_keyed_by_it() -> None:
    """A capacity search's probes all run at concurrency 0: the stored step keeps its request rate (closed-loop
    steps are stored as before, without the key), and `load_levels` keys the levels and the crash by the rate."""
    from tunectl.search.trials import load_levels

    res = TrialResult(trial=4, status="crashed", params={})
    res.levels = [LevelResult(0, "ok", "random", metrics={"output_throughput": v}, request_rate=r)
                  for r, v in ((2.0, 250.0), (4.0, 480.0), (8.0, 900.0))]
    res.levels.append(LevelResult(0, "crashed", "random", request_rate=16.0))
    attr = json.loads(json.dumps(ladder_attr(res)))
    assert [a["request_rate"] for a in attr] == [2.0, 4.0, 8.0, 16.0]
    assert "request_rate" not in ladder_attr(result())[0]
    study = optuna.create_study(direction="maximize")
    t = study.ask()
    t.set_user_attr("ladder", attr)
    t.set_user_attr("crash_phase", "load")
    t.set_user_attr("crash_level", 0)
    study.tell(t, 8.0)
    assert load_levels(study.trials[0]) == ({2.0: 250.0, 4.0: 480.0, 8.0: 900.0}, 16.0)
    closed = study_with(ladder_attr(result()))[0]
    assert load_levels(closed) == ({1: 40.0, 8: 300.0, 64: 900.5}, None)
