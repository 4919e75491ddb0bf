"""Pruning on the concurrency ladder.

Each stable level is reported to Optuna as an intermediate value (step = position on the ladder). A config whose
throughput at a level is below `margin` x the best seen at that same level (over finished feasible trials) stops
after `min_levels` levels. The time the skipped levels would have taken is estimated from the trials that ran them.
"""
from __future__ import annotations

from statistics import mean
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tunectl.models import LevelResult
from tunectl.profile import Pruning

LevelKey = tuple[str, int]


def _ladders(trials: list[FrozenTrial]) -> list[list[list[Any]]]:
    return [t.user_attrs["ladder"] for t in trials
            if t.state == TrialState.COMPLETE and isinstance(t.user_attrs.get("ladder"), list)]


def best_per_level(trials: list[FrozenTrial]) -> dict[LevelKey, float]:
    """Best stable output throughput per (workload, concurrency) over finished trials."""
    best: dict[LevelKey, float] = {}
    for ladder in _ladders(trials):
        for workload, conc, status, thr, _dur in ladder:
            if status == "ok":
                key = (workload, int(conc))
                best[key] = max(best.get(key, 0.0), float(thr))
    return best


def mean_durations(trials: list[FrozenTrial]) -> dict[LevelKey, float]:
    seen: dict[LevelKey, list[float]] = {}
    for ladder in _ladders(trials):
        for workload, conc, status, _thr, dur in ladder:
            if status == "ok":
                seen.setdefault((workload, int(conc)), []).append(float(dur))
    return {k: mean(v) for k, v in seen.items()}


class LadderPruner:
    """One per trial: `should_prune` is handed to the trial engine and called after every level."""

    def __init__(self, cfg: Pruning, trials: list[FrozenTrial], trial: optuna.trial.Trial | None = None,
                 planned: list[LevelKey] | None = None):
        self.cfg = cfg
        self.best = best_per_level(trials)
        self.durations = mean_durations(trials)
        self.trial = trial
        self.planned = planned or []
        self.seen = 0
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
        ref = self.best.get((lv.workload, lv.concurrency))
        if ref is None or lv.output_throughput >= self.cfg.margin * ref:
            return False
        self.pruned_at = (lv.workload, lv.concurrency)
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
