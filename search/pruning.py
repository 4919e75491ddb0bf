"""Pruning on the concurrency ladder.

Each stable level is reported to Optuna as an intermediate value (step = position on the ladder). After
`min_levels` levels, a config that has not yet beaten the incumbent stops early when it is clearly worse than the
best seen at the same level (below `margin` x that best), or when it cannot reach the incumbent even if it scaled
from here like the best-scaling finished trial did. Never at the last level (nothing left to save). The time the
skipped levels would have taken is estimated from the trials that ran them.

Noise-aware: levels carry a 95% interval (`output_throughput_ci95`; a point where none was measured). A config
is stopped only when its interval lies wholly below the reference's: the best trial's interval at the same level,
or the incumbent's interval for the scaling bound. What the decision rested on is kept on the trial
(`pruned_by`: level, its interval, the reference interval), so every prune can be checked afterwards.
"""
from __future__ import annotations

from statistics import mean

import optuna
from optuna.trial import FrozenTrial, TrialState

from tunectl.models import LadderStep, LevelResult, ladder_steps
from tunectl.profile import Pruning
from tunectl.stats import Interval

LevelKey = tuple[str, int]
MIN_FEASIBLE_FOR_BOUND = 5      # scaling bounds need a few finished configs before they are trusted
BOUND_SLACK = 1.1


def _ladders(trials: list[FrozenTrial]) -> list[list[LadderStep]]:
    return [ladder_steps(t.user_attrs.get("ladder")) for t in trials if t.state == TrialState.COMPLETE]


def _cis(t: FrozenTrial) -> dict[LevelKey, tuple[float, float]]:
    rows = t.user_attrs.get("ladder_ci")
    return {(w, int(c)): (float(lo), float(hi)) for w, c, lo, hi, *_ in rows} if isinstance(rows, list) else {}


def best_per_level(trials: list[FrozenTrial]) -> dict[LevelKey, Interval]:
    """Best stable output throughput per (workload, concurrency) over finished trials, with its interval."""
    best: dict[LevelKey, Interval] = {}
    for t in trials:
        if t.state != TrialState.COMPLETE:
            continue
        cis = _cis(t)
        for s in ladder_steps(t.user_attrs.get("ladder")):
            key = (s.workload, s.concurrency)
            if s.status == "ok" and (key not in best or s.output_throughput > best[key].value):
                best[key] = Interval.of(s.output_throughput, cis.get(key))
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


def incumbent(trials: list[FrozenTrial]) -> Interval:
    """The best feasible trial's value with its interval (a zero point when there is none)."""
    best = max((t for t in trials if t.state == TrialState.COMPLETE and t.values
                and all(v <= 0 for v in t.constraints.values())), key=lambda t: t.values[0], default=None)
    if best is None:
        return Interval(0.0, 0.0, 0.0)
    return Interval.of(best.values[0], best.user_attrs.get("objective_ci95"))


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
                 planned: list[LevelKey] | None = None, only: dict[str, float] | None = None):
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
        self.evidence: dict[str, Any] = {}
        # `objective.weights` with one workload: only its levels compare with the incumbent, scaled by its weight
        # (a workload the objective leaves out, or the sum of several, says nothing level by level)
        self.only = only

    def __call__(self, lv: LevelResult) -> bool:
        return self.should_prune(lv)

    def should_prune(self, lv: LevelResult) -> bool:
        if self.only is not None and lv.workload not in self.only:
            return False                        # not in the objective: neither reported nor counted
        self.seen += 1
        if lv.status != "ok":
            return False
        if self.trial is not None:
            self.trial.report(lv.output_throughput, step=self.seen - 1)
        if not self.cfg.enabled or self.seen < self.cfg.min_levels:
            return False
        key = (lv.workload, lv.concurrency)
        mine = Interval.of(lv.output_throughput, lv.output_throughput_ci95)
        w = 1.0 if self.only is None else self.only[lv.workload]     # the level as the objective counts it
        self.running_best = max(self.running_best, mine.high * w)
        if self.planned and key == self.planned[-1]:
            return False                        # the ladder is done: nothing left to save
        if self.running_best >= self.incumbent.low:
            return False                        # an earlier level already reaches the incumbent (noise included)
        ref = self.best.get(key)
        clearly_worse = ref is not None and mine.value < self.cfg.margin * ref.value and mine.high < ref.low
        # even scaling up like the best-scaling finished trial did, it could not reach the incumbent (the bound is
        # objective / level throughput: the weight is in it)
        hopeless = (self.n_feasible >= MIN_FEASIBLE_FOR_BOUND and key in self.bounds
                    and mine.high * self.bounds[key] * BOUND_SLACK < self.incumbent.low)
        if not (clearly_worse or hopeless):
            return False
        self.pruned_at = key
        self.evidence = {"level": list(key), "ci95": [mine.low, mine.high],
                         "reference": "best at this level" if clearly_worse else "incumbent (scaling bound)",
                         "reference_ci95": [ref.low, ref.high] if clearly_worse and ref else
                         [self.incumbent.low, self.incumbent.high],
                         "bound": round(self.bounds.get(key, 0.0) * BOUND_SLACK, 4) if not clearly_worse else None}
        if self.trial is not None:
            self.trial.set_user_attr("pruned_by", self.evidence)
        return True

    def saved_s(self) -> float:
        """Estimated seconds the levels after the pruned one would have taken."""
        if self.pruned_at is None or self.pruned_at not in self.planned:
            return 0.0
        rest = self.planned[self.planned.index(self.pruned_at) + 1:]
        return sum(self.durations.get(k, 0.0) for k in rest)


def make_pruner(cfg: Pruning, study: optuna.Study, trial: optuna.trial.Trial | None,
                planned: list[LevelKey], only: dict[str, float] | None = None) -> LadderPruner:
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    reporting = trial if len(study.directions) == 1 else None   # Optuna reports single-objective only
    return LadderPruner(cfg, trials, reporting, planned, only)
