"""Pruning on the concurrency ladder.

Each stable level is reported to Optuna as an intermediate value (step = position on the ladder). After
`min_levels` levels, a config that has not yet beaten the incumbent stops early when it is clearly worse than the
best seen at the same level (below `margin` x that best), or when it cannot reach the incumbent even if it scaled
from here like the best-scaling finished trial did. Never at the last level (nothing left to save). The time the
skipped levels would have taken is estimated from the trials that ran them.
"""
from __future__ import annotations

from statistics import mean

import optuna
from optuna.trial import FrozenTrial, TrialState

from tunectl.models import LadderStep, LevelResult, ladder_steps
from tunectl.profile import Pruning

LevelKey = tuple[str, int]
MIN_FEASIBLE_FOR_BOUND = 5      # scaling bounds need a few finished configs before they are trusted
BOUND_SLACK = 1.1


def _ladders(trials: list[FrozenTrial]) -> list[list[LadderStep]]:
    return [ladder_steps(t.user_attrs.get("ladder")) for t in trials if t.state == TrialState.COMPLETE]


def best_per_level(trials: list[FrozenTrial]) -> dict[LevelKey, float]:
    """Best stable output throughput per (workload, concurrency) over finished trials."""
    best: dict[LevelKey, float] = {}
    for ladder in _ladders(trials):
        for s in ladder:
            if s.status == "ok":
                key = (s.workload, s.concurrency)
                best[key] = max(best.get(key, 0.0), s.output_throughput)
    return best


def scaling_bounds(trials: list[FrozenTrial]) -> dict[LevelKey, float]:
    """Per level: the largest ratio (final best / throughput at that level) any finished feasible trial showed."""
    bound: dict[LevelKey, float] = {}
    for t in trials:
        if t.state != TrialState.COMPLETE or not t.values:
            continue
        if any(v > 0 for v in t.constraints.values()):
            continue
        for s in ladder_steps(t.user_attrs.get("ladder")):
            if s.status == "ok" and s.output_throughput > 0:
                key = (s.workload, s.concurrency)
                bound[key] = max(bound.get(key, 0.0), t.values[0] / s.output_throughput)
    return bound


def incumbent(trials: list[FrozenTrial]) -> float:
    return max((t.values[0] for t in trials if t.state == TrialState.COMPLETE and t.values
                and all(v <= 0 for v in t.constraints.values())), default=0.0)


def mean_durations(trials: list[FrozenTrial]) -> dict[LevelKey, float]:
    seen: dict[LevelKey, list[float]] = {}
    for ladder in _ladders(trials):
        for s in ladder:
            if s.status == "ok":
                seen.setdefault((s.workload, s.concurrency), []).append(s.duration_s)
    return {k: mean(v) for k, v in seen.items()}


class LadderPruner:
    """One per trial: `should_prune` is handed to the trial engine and called after every level."""

    def __init__(self, cfg: Pruning, trials: list[FrozenTrial], trial: optuna.trial.Trial | None = None,
                 planned: list[LevelKey] | None = None):
        self.cfg = cfg
        self.best = best_per_level(trials)
        self.bounds = scaling_bounds(trials)
        self.incumbent = incumbent(trials)
        self.n_feasible = sum(1 for t in trials if t.state == TrialState.COMPLETE
                              and all(v <= 0 for v in t.constraints.values()))
        self.durations = mean_durations(trials)
        self.trial = trial
        self.planned = planned or []
        self.seen = 0
        self.running_best = 0.0
        self.pruned_at: LevelKey | None = None

    def __call__(self, lv: LevelResult) -> bool:
        return self.should_prune(lv)

    def should_prune(self, lv: LevelResult) -> bool:
        self.seen += 1
        if lv.status != "ok":
            return False
        if self.trial is not None:
            self.trial.report(lv.output_throughput, step=self.seen - 1)
        if not self.cfg.enabled or self.seen < self.cfg.min_levels:
            return False
        key = (lv.workload, lv.concurrency)
        self.running_best = max(self.running_best, lv.output_throughput)
        if self.planned and key == self.planned[-1]:
            return False                        # the ladder is done: nothing left to save
        if self.running_best >= self.incumbent:
            return False                        # an earlier level already beats the incumbent
        ref = self.best.get(key)
        clearly_worse = ref is not None and lv.output_throughput < self.cfg.margin * ref
        # even scaling up like the best-scaling finished trial did, it could not reach the incumbent
        hopeless = (self.n_feasible >= MIN_FEASIBLE_FOR_BOUND and key in self.bounds
                    and lv.output_throughput * self.bounds[key] * BOUND_SLACK < self.incumbent)
        if not (clearly_worse or hopeless):
            return False
        self.pruned_at = key
        return True

    def saved_s(self) -> float:
        """Estimated seconds the levels after the pruned one would have taken."""
        if self.pruned_at is None or self.pruned_at not in self.planned:
            return 0.0
        rest = self.planned[self.planned.index(self.pruned_at) + 1:]
        return sum(self.durations.get(k, 0.0) for k in rest)


def make_pruner(cfg: Pruning, study: optuna.Study, trial: optuna.trial.Trial | None,
                planned: list[LevelKey]) -> LadderPruner:
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    reporting = trial if len(study.directions) == 1 else None   # Optuna reports single-objective only
    return LadderPruner(cfg, trials, reporting, planned)
