"""The finalists' race (search/race.py): intervals from the launch-to-launch noise, a lucky single reading never
wins over a config confirmed higher, overlapping intervals are a tie, the budget holds (real in-memory Optuna and
the real loop; the "launches" are scripted readings, so every outcome here is exact)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.search.conftest import make_profile
from tunectl.models import LevelResult, TrialResult
from tunectl.search import finalists as fin
from tunectl.search import race
from tunectl.search.loop import Hooks
from tunectl.search.parallel import ParallelLoop
from tunectl.search.study import HostState


def _tell(study: optuna.Study, params: dict[str, Any], value: float, half: float, **attrs: Any) -> int:
    study.enqueue_trial(params)
    t = study.ask()
    for k in params:
        t.suggest_categorical(k, [0, 1, 2, 3, 4])
    for k, v in attrs.items():
        t.set_user_attr(k, v)
    t.set_user_attr("objective_ci95", [value * (1 - half), value * (1 + half)])
    t.set_constraint("crash", 0.0)
    study.tell(t, value)
    return t.number


def _study(runs: dict[int, list[float]], base: float, half: float = 0.02) -> optuna.Study:
    """Config x=k read runs[k][0] in the search, then runs[k][1:] on its reruns."""
    study = optuna.create_study(direction="maximize")
    _tell(study, {"x": 0}, base, half, role="baseline")
    for k, values in runs.items():
        n = _tell(study, {"x": k}, values[0], half, role="search")
        for i, v in enumerate(values[1:]):
            _tell(study, {"x": k}, v, half, role="finalist", finalist_of=n, rerun=i + 1)
    return study


def test_a_config_run_once_has_the_launch_noise_as_its_interval() -> None:
    st = fin.standings(_study({1: [1000.0]}, base=500).get_trials(), prior=0.05)
    one = next(e for e in st.entries if e.params == {"x": 1})
    assert one.n == 1 and not one.confirmed
    assert one.interval.low < 0.9 * 1000 and one.interval.high > 1.1 * 1000   # +-2.8 sd of 5%, not a point


def test_configs_inside_each_others_noise_are_a_tie() -> None:
    study = _study({1: [1010, 990, 1000], 2: [1000, 1005, 985]}, base=500)
    verdicts = fin.verdicts(fin.standings(study.get_trials(), prior=0.05))
    win = fin.winner(verdicts)
    assert win is not None and win.launches == 3 and win.score == 1000
    other = next(v.trial for v in verdicts if v.trial != win.trial and v.survived and v.search_value != 500)
    assert other in fin.ties(verdicts, win)
    g = fin.gain_over(win.interval, fin.baseline_interval(study.get_trials(), 0.05))
    assert g is not None and g["verdict"] == "above" and g["low"] < 2.0 < g["high"]


def test_a_clear_difference_is_a_win() -> None:
    study = _study({1: [1300, 1290, 1310, 1305], 2: [1000, 1005, 995, 1002]}, base=600)
    st = fin.standings(study.get_trials(), prior=0.05)
    verdicts = fin.verdicts(st)
    win = fin.winner(verdicts)
    assert win is not None and win.search_value == 1300
    assert fin.ties(verdicts, win) == [] and st.contenders() == []
    assert race.next_round(st, reruns=2, budget_left=10) == []         # separated: the race is over


def test_the_leader_is_rerun_first_then_its_contenders_and_the_budget_holds() -> None:
    st = fin.standings(_study({1: [1300.0], 2: [1250.0], 3: [1240.0], 4: [700.0]}, base=600).get_trials(), 0.05)
    picks = race.next_round(st, reruns=2, budget_left=10)
    assert [e.params["x"] for e in picks] == [1, 1, 2, 3]        # the leader twice; contenders once; 4 is beaten
    assert len(race.next_round(st, reruns=2, budget_left=3)) == 3


class Scripted:
    """The trial engine: each config's readings in launch order (one level; its own interval +-1%)."""

    def __init__(self, readings: dict[int, list[float]]):
        self.readings, self.calls = {k: list(v) for k, v in readings.items()}, []

    def __call__(self, n: int, params: dict[str, Any], role: str, prune: Any = None) -> TrialResult:
        v = self.readings[params["max-running-requests"]].pop(0)
        self.calls.append((role, params["max-running-requests"], v))
        lv = LevelResult(512, "ok", "random", completed=512, duration_s=10.0, metrics={"output_throughput": v},
                         output_throughput_ci95=[0.99 * v, 1.01 * v])
        return TrialResult(trial=n, status="ok", params=dict(params), role=role, levels=[lv])


def _race(readings: dict[int, list[float]], tmp: Path, budget: int = 12) -> tuple[ParallelLoop, Scripted]:
    """A study whose search ran each config once (its first reading), then the real loop's race."""
    prof = make_profile(search__finalists={"reruns": 2, "budget": budget}, search__space={
        "max-running-requests": {"type": "int", "choices": sorted(readings), "default": min(readings)}})
    study = optuna.create_study(direction="maximize")
    engine = Scripted(readings)
    loop = ParallelLoop(study, prof, Hooks(evaluate=engine), {"local": HostState(tmp, "local")},
                        lambda key, *a: engine(*a))
    for i, k in enumerate(sorted(readings)):
        study.enqueue_trial({"max-running-requests": k}, user_attrs={"role": "baseline" if i == 0 else "search"})
        assert loop._launch(study.ask())              # one slot: the trial runs on this thread
        loop._land()
    loop.finalists()
    return loop, engine


def test_a_lucky_single_reading_never_wins_over_a_config_confirmed_higher(tmp_path: Path) -> None:
    # config 128 read 3,000 once (lucky) and 2,000 on every fresh launch; 256 reads 2,500 every time
    loop, engine = _race({64: [1000] * 9, 128: [3000] + [2000] * 9, 256: [2500] * 10}, tmp_path)
    best = fin.winner(loop.stats.verdicts)
    assert best is not None and best.params == {"max-running-requests": 256} and best.launches >= 3
    assert [c for c in engine.calls if c[0] == "finalist"][:2] == [("finalist", 128, 2000)] * 2   # leader first
    assert loop.stats.race["spent"] <= 12 and "overlaps the leader" in loop.stats.race["rule"]


def test_the_race_stops_at_its_budget_and_names_the_tie(tmp_path: Path) -> None:
    loop, _ = _race({64: [2000, 2400, 1900, 2300, 2000] * 3, 128: [2100, 1950, 2350, 2050, 2200] * 3,
                     256: [1000] * 15}, tmp_path, budget=6)
    assert loop.stats.race["spent"] == 6
    win = fin.winner(loop.stats.verdicts)
    assert win is not None and fin.ties(loop.stats.verdicts, win)        # never separated: a tie, named


def test_a_crash_on_rerun_demotes_the_config() -> None:
    study = _study({1: [1300.0], 2: [1200.0, 1190.0, 1210.0]}, base=600)
    n1 = next(t.number for t in study.trials if t.params == {"x": 1})
    study.enqueue_trial({"x": 1}, user_attrs={"role": "finalist", "finalist_of": n1, "rerun": 1})
    t = study.ask()
    t.suggest_categorical("x", [0, 1, 2, 3, 4])
    t.set_user_attr("crash_class", "load_crash")
    t.set_constraint("crash", 1.0)
    study.tell(t, 0.0)
    assert study.trials[-1].state == TrialState.COMPLETE
    verdicts = fin.verdicts(fin.standings(study.get_trials(), 0.05))
    win = fin.winner(verdicts)
    assert win is not None and win.params == {"x": 2}
    assert any(v.params == {"x": 1} and v.reason.startswith("demoted") for v in verdicts)


def test_a_config_whose_launches_scatter_more_than_the_study_gets_a_wider_interval() -> None:
    # config 1's launches agree within 1% (the study's spread); config 2's move 25% (an eager config on a real
    # GPU): its interval carries its own scatter, config 1's stays as narrow as the pooled spread allows
    study = _study({1: [2000, 2010, 1990, 2005], 3: [1800, 1810, 1795, 1805], 4: [1500, 1490, 1510, 1505],
                    2: [1000, 1250, 800]}, base=500)
    st = fin.standings(study.get_trials(), prior=0.05)
    calm, wild = (next(e for e in st.entries if e.params == {"x": k}) for k in (1, 2))
    pooled_only = race.t95(st.noise_df + race.PRIOR_DF) * st.noise / 3 ** 0.5
    assert wild.interval.half_rel > 1.4 * pooled_only
    assert calm.interval.half_rel == pytest.approx(race.t95(st.noise_df + race.PRIOR_DF) * st.noise / 2)


def test_after_the_race_the_baseline_is_relaunched_and_the_gain_rests_on_its_launches(tmp_path: Path) -> None:
    # the baseline (64) read 1,600 on its one search launch and 1,000 on every fresh one: claimed on its first
    # reading alone, the winner's gain would be 1.56x; on three launches it is about 2x, with an interval that
    # holds the truth. Its reruns are not the race's: the race's budget is untouched by them.
    loop, engine = _race({64: [1600] + [1000] * 9, 128: [2500] * 10, 256: [1500] * 10}, tmp_path)
    base_runs = [c for c in engine.calls if c[0] == "finalist" and c[1] == 64]
    assert len(base_runs) == 2
    trials = loop.trials()
    assert sum(bool(t.user_attrs.get(fin.GAIN_BASE)) for t in trials) == 2
    assert loop.stats.race["spent"] == fin.spent(trials) == len(
        [c for c in engine.calls if c[0] == "finalist"]) - 2
    win = fin.winner(loop.stats.verdicts)
    assert win is not None and win.params == {"max-running-requests": 128}
    base = fin.baseline_interval(trials, 0.05)
    assert base is not None and base.n == 3 and base.value == pytest.approx(1200)
    g = fin.gain_over(win.interval, base)
    assert g is not None and g["low"] <= 2500 / 1000 <= g["high"]


def _on_machines(runs: dict[int, list[tuple[float, str]]], base: list[tuple[float, str]]) -> optuna.Study:
    """Config x=k read runs[k][0] in the search, then runs[k][1:] on its reruns, each (value, machine)."""
    study = optuna.create_study(direction="maximize")
    b = _tell(study, {"x": 0}, base[0][0], 0.01, role="baseline", machine=base[0][1])
    for i, (v, m) in enumerate(base[1:]):
        _tell(study, {"x": 0}, v, 0.01, role="finalist", finalist_of=b, rerun=i + 1, machine=m)
    for k, values in runs.items():
        n = _tell(study, {"x": k}, values[0][0], 0.01, role="search", machine=values[0][1])
        for i, (v, m) in enumerate(values[1:]):
            _tell(study, {"x": k}, v, 0.01, role="finalist", finalist_of=n, rerun=i + 1, machine=m)
    return study


A, B = "NVIDIA H100 80GB HBM3 x1, 700 W, gpu-aaaa", "NVIDIA H100 80GB HBM3 x1, 700 W, gpu-bbbb"


def test_a_study_resumed_on_a_slower_machine_ranks_its_configs_on_one_scale() -> None:
    """The end-to-end real search's shape (docs/real-gpu.md): the race's reruns after a resume ran on a second H100
    that read every config ~10% lower. Config 1 was read three times on the fast machine only; config 2 as high
    there, then twice on the slow one; config 3 links the machines too. Read as they came, 1 wins by the machine
    alone; with each machine's level taken out, 2 is level with it, and every number is on one machine's scale."""
    runs = {1: [(10000, A), (10050, A), (9950, A)],
            2: [(10100, A), (9100, B), (9050, B)],
            3: [(9000, A), (8100, B), (8150, B)]}
    study = _on_machines(runs, base=[(6000, A), (5400, B), (5420, B)])
    st = fin.standings(study.get_trials(), prior=0.05)
    assert set(st.machines) == {A, B} and st.linked == 3
    launches = {m: sum(m == x for e in st.entries for x in e.machines) for m in (A, B)}
    [ref] = [m for m, v in st.machines.items() if v == 0.0]           # the scale: the machine with most launches
    assert launches[ref] == max(launches.values())
    other = A if ref == B else B
    assert 0.08 < abs(st.machines[other]) < 0.12                       # a ~10% level, either way round
    two = next(e for e in st.entries if e.params == {"x": 2})
    one = next(e for e in st.entries if e.params == {"x": 1})
    assert abs(two.mean / one.mean - 1) < 0.03                        # level on one scale (raw means: 0.93)
    assert max(two.values) / min(two.values) < 1.03                  # its launches agree once on one scale
    assert "2 machines" in race.rule(st) and "gpu-aaaa" in race.rule(st) and "gpu-bbbb" in race.rule(st)
    # a launch moved by a machine's level carries that level's error in the interval; one left as read does not
    for e in st.entries:
        assert (e.level_var > 0) == any(m != ref for m in e.machines)
    wide = race.interval(two, st.noise, st.noise_df)
    two.level_var = 0.0
    assert race.interval(two, st.noise, st.noise_df).high < wide.high
    # the gain: the baseline on the same scale as the winner
    win = fin.winner(fin.verdicts(st))
    g = fin.gain_over(win.interval, fin.baseline_interval(study.get_trials(), 0.05))
    assert g is not None and abs(g["ratio"] - 10000 / 6000) < 0.06


def test_one_machine_or_an_unlinked_second_leaves_the_readings_as_they_came() -> None:
    same = {1: [(10000, A), (10050, A)], 2: [(9000, A), (9100, A)]}
    for runs in (same, {1: [(10000, A), (10050, A)], 2: [(9000, B), (9100, B)]},     # no config on both
                 {1: [(10000, A), (9000, B)], 2: [(9000, A), (9100, A)]}):            # one link: its noise decides
        st = fin.standings(_on_machines(runs, base=[(6000, A)]).get_trials(), prior=0.05)
        assert st.machines == {} and "machines" not in race.rule(st)
        assert sorted(v for e in st.entries for v in e.values) == sorted(
            [6000.0] + [v for r in runs.values() for v, _ in r])
