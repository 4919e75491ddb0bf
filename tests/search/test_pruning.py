"""The ladder pruner against finished trials held in a real (in-memory) Optuna study."""
from __future__ import annotations

import optuna
from tunectl.search.pruning import LadderPruner

from tunectl.models import LevelResult
from tunectl.profile import Pruning

LEVELS = [1, 8, 64, 256, 512]
PLANNED = [("random", c) for c in LEVELS]


def finished(ladders: list[list[float]]) -> list[optuna.trial.FrozenTrial]:
    study = optuna.create_study(direction="maximize")
    for ladder in ladders:
        t = study.ask()
        t.set_user_attr("ladder", [["random", c, "ok", v, 1.0] for c, v in zip(LEVELS, ladder)])
        t.set_constraint("crash", 0.0)
        study.tell(t, max(ladder))
    return study.trials


def walk(pruner: LadderPruner, ladder: list[float]) -> int | None:
    """Feed the levels; the concurrency at which the pruner stopped the ladder, else None."""
    for c, v in zip(LEVELS, ladder):
        if pruner.should_prune(LevelResult(c, "ok", "random", metrics={"output_throughput": v})):
            return c
    return None


HISTORY = [[40, 300, 900, 1500, 1700], [40, 280, 850, 1400, 1600], [35, 260, 800, 1300, 1500],
           [30, 250, 700, 1200, 1400], [30, 240, 650, 1100, 1300]]


def test_a_clearly_worse_config_stops_and_the_saved_time_is_estimated() -> None:
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished(HISTORY), planned=PLANNED)
    assert walk(pruner, [10, 60, 200, 400, 500]) == 64
    assert pruner.saved_s() == 2.0          # the 256 and 512 levels, 1 s each in the finished trials


def test_a_config_at_par_runs_the_whole_ladder() -> None:
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished(HISTORY), planned=PLANNED)
    assert walk(pruner, [40, 290, 880, 1450, 1750]) is None


def test_never_pruned_at_the_last_level_nor_after_beating_the_incumbent() -> None:
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished(HISTORY), planned=PLANNED)
    assert walk(pruner, [45, 320, 950, 1800, 100]) is None    # peaked at 256 above the incumbent, fell at 512
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished(HISTORY), planned=PLANNED)
    assert walk(pruner, [40, 300, 900, 1500, 10]) is None     # collapsed at the last level: nothing to save


def test_disabled_pruning_never_stops() -> None:
    pruner = LadderPruner(Pruning(enabled=False), finished(HISTORY), planned=PLANNED)
    assert walk(pruner, [1, 2, 3, 4, 5]) is None


def finished_with_intervals(ladders: list[list[float]], half: float) -> list[optuna.trial.FrozenTrial]:
    """Finished trials whose levels were measured with a 95% interval of +-half (a share of the value)."""
    study = optuna.create_study(direction="maximize")
    for ladder in ladders:
        t = study.ask()
        t.set_user_attr("ladder", [["random", c, "ok", v, 1.0] for c, v in zip(LEVELS, ladder)])
        t.set_user_attr("ladder_ci", [["random", c, v * (1 - half), v * (1 + half), 40]
                                      for c, v in zip(LEVELS, ladder)])
        t.set_user_attr("objective_ci95", [max(ladder) * (1 - half), max(ladder) * (1 + half)])
        t.set_constraint("crash", 0.0)
        study.tell(t, max(ladder))
    return study.trials


def walk_ci(pruner: LadderPruner, ladder: list[float], half: float) -> int | None:
    for c, v in zip(LEVELS, ladder):
        lv = LevelResult(c, "ok", "random", metrics={"output_throughput": v},
                         output_throughput_ci95=[v * (1 - half), v * (1 + half)], samples=40)
        if pruner.should_prune(lv):
            return c
    return None


def test_a_pruned_configs_interval_lies_below_the_reference_interval() -> None:
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished_with_intervals(HISTORY, 0.03), planned=PLANNED)
    assert walk_ci(pruner, [10, 60, 200, 400, 500], 0.03) == 64
    ev = pruner.evidence
    assert ev["level"] == ["random", 64]
    assert ev["ci95"][1] < ev["reference_ci95"][0]          # its high end below the best's low end at that level


def test_a_config_whose_interval_reaches_the_reference_is_not_pruned() -> None:
    # Below half the best at 64 and 256 by its point values, but both were measured so noisily (+-40%, +-30%)
    # that the intervals touch: inside the noise, the pruner lets it run on.
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished_with_intervals(HISTORY, 0.4), planned=PLANNED)
    assert walk_ci(pruner, [10, 60, 420, 700, 800], 0.3) is None
    assert pruner.evidence == {}


def test_levels_of_a_workload_the_weighted_objective_leaves_out_never_prune() -> None:
    """`objective.weights: {random: 1}` on a profile that also runs a chat workload: the chat levels come first and
    are slow for configs that are fast on random (radix off), and must not stop the ladder before random runs."""
    pruner = LadderPruner(Pruning(min_levels=3, margin=0.5), finished(HISTORY), planned=PLANNED)
    pruner.only = {"random": 1.0}
    for c in LEVELS:
        assert not pruner.should_prune(LevelResult(c, "ok", "chat", metrics={"output_throughput": 1.0}))
    assert walk(pruner, [10, 60, 200, 400, 500]) == 64           # its own levels still prune as before


def test_a_weighted_workload_is_compared_to_the_incumbent_at_its_weight() -> None:
    """Weight 2: the incumbent's value is twice its best level (3,400). A level of 1,800 counts 3,600: it reaches
    the incumbent, and the ladder is not stopped after it; counted at weight 1 it would be (200 at 256)."""
    study = optuna.create_study(direction="maximize")
    for ladder in HISTORY:
        t = study.ask()
        t.set_user_attr("ladder", [["random", c, "ok", v, 1.0] for c, v in zip(LEVELS, ladder)])
        t.set_constraint("crash", 0.0)
        study.tell(t, 2 * max(ladder))
    fell = [40, 300, 1800, 200, 100]
    weighted = LadderPruner(Pruning(min_levels=3, margin=0.5), study.trials, planned=PLANNED, only={"random": 2.0})
    assert walk(weighted, fell) is None
    unweighted = LadderPruner(Pruning(min_levels=3, margin=0.5), study.trials, planned=PLANNED,
                              only={"random": 1.0})
    assert walk(unweighted, fell) == 256
