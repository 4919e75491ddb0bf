"""Finalists: before a winner is named, the top-k configs are re-run R times on fresh launches.

Reruns are ordinary Optuna trials (enqueued with the same params, `role=finalist`, `finalist_of=<n>`), so they are
in the study, resumable, and a crash on rerun also teaches the sampler. Any crash demotes the config.

Compared by intervals: a finalist's score is the mean of its fresh launches (the search run and its reruns) with a
95% interval from the launch-to-launch spread (never narrower than the launches' own intervals allow, see
`tunectl.stats.pooled`); its launch-to-launch spread is kept. Survivors whose interval overlaps the winner's are
a tie (`ties`), not a loss; `gain` is the winner over the baseline as "x (low-high)".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from tunectl.search.space import config_key

from tunectl.stats import Interval, compare, gain, pooled, spread

SEARCH_ROLES = ("search", "baseline")


def role(t: FrozenTrial) -> str:
    return str(t.user_attrs.get("role", "search"))


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())


def candidates(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Feasible search trials, one per config, best first."""
    best: dict[str, FrozenTrial] = {}
    for t in trials:
        if role(t) in SEARCH_ROLES and feasible(t) and "duplicate_of" not in t.user_attrs:
            key = config_key(t.params)
            if key not in best or t.values[0] > best[key].values[0]:
                best[key] = t
    return sorted(best.values(), key=lambda t: -t.values[0])


@dataclass
class FinalistVerdict:
    trial: int                                 # the search trial that proposed the config
    params: dict[str, Any]
    search_value: float
    runs: list[dict[str, Any]] = field(default_factory=list)  # reruns: trial, value, feasible, crash_class
    pending: int = 0                           # reruns not finished yet
    survived: bool = False
    score: float = 0.0                         # mean over the search run and every rerun
    reason: str = ""
    ci95: list[float] = field(default_factory=list)   # the score's 95% interval over the launches
    launches: int = 0                          # fresh launches the score rests on
    launch_spread: float = 0.0                 # (max - min) / mean of the launches' values

    @property
    def interval(self) -> Interval:
        return Interval.of(self.score, self.ci95 or None, self.launches)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _runs_of(trials: list[FrozenTrial], n: int) -> list[FrozenTrial]:
    return [t for t in trials if role(t) == "finalist" and t.user_attrs.get("finalist_of") == n]


def enqueue_reruns(study: optuna.Study, picks: list[FrozenTrial], reruns: int) -> int:
    """Queue the missing reruns of each pick (idempotent); returns how many were queued."""
    trials = study.get_trials(deepcopy=False)
    queued = 0
    for t in picks:
        have = [r for r in _runs_of(trials, t.number) if r.state != TrialState.FAIL]
        for i in range(len(have), reruns):
            study.enqueue_trial(dict(t.params), user_attrs={"role": "finalist", "finalist_of": t.number,
                                                             "rerun": i + 1})
            queued += 1
    return queued


def verdict(trials: list[FrozenTrial], t: FrozenTrial, reruns: int) -> FinalistVerdict:
    v = FinalistVerdict(trial=t.number, params=dict(t.params), search_value=float(t.values[0]))
    done = [r for r in _runs_of(trials, t.number) if r.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    v.pending = sum(r.state in (TrialState.WAITING, TrialState.RUNNING) for r in _runs_of(trials, t.number))
    for r in done:
        v.runs.append({"trial": r.number, "value": r.values[0] if r.values else None, "feasible": feasible(r),
                       "crash_class": r.user_attrs.get("crash_class"), "crash_level": r.user_attrs.get("crash_level")})
    crashed = [r for r in v.runs if not r["feasible"]]
    if crashed:
        first = crashed[0]
        v.reason = f"demoted: rerun trial {first['trial']} crashed ({first['crash_class']}, c={first['crash_level']})"
    elif len(v.runs) < reruns:
        v.reason = f"{len(v.runs)}/{reruns} reruns finished"
    else:
        v.survived = True
        v.reason = f"survived {reruns} reruns"
    ok = [r for r in done if feasible(r) and r.values]
    launches = [trial_interval(t)] + [trial_interval(r) for r in ok]
    both = pooled(launches)
    v.score, v.ci95, v.launches = both.value, [both.low, both.high], len(launches)
    v.launch_spread = spread([i.value for i in launches])
    return v


def trial_interval(t: FrozenTrial) -> Interval:
    """A finished trial's objective with the 95% interval of the level it came from (a point if none)."""
    return Interval.of(float(t.values[0]), t.user_attrs.get("objective_ci95"))


def pick(trials: list[FrozenTrial], top_k: int, rounds: int) -> list[FrozenTrial]:
    """The configs to confirm: top-k, then the next k for each earlier round in which none survived."""
    return candidates(trials)[: top_k * max(1, rounds)]


def winner(verdicts: list[FinalistVerdict], top_k: int) -> FinalistVerdict | None:
    alive = [v for v in verdicts if v.survived]
    return max(alive, key=lambda v: v.score) if alive else None


def ties(verdicts: list[FinalistVerdict], win: FinalistVerdict) -> list[int]:
    """Surviving finalists the winner does not beat beyond the noise: their intervals overlap."""
    return [v.trial for v in verdicts if v.survived and v.trial != win.trial
            and compare(win.interval, v.interval) == "tie"]


def baseline_interval(trials: list[FrozenTrial]) -> Interval | None:
    """The baseline (trial 0's config) over its launches: the baseline run and any rerun of it."""
    base = next((t for t in trials if role(t) == "baseline" and feasible(t) and t.values), None)
    if base is None:
        return None
    runs = [base] + [r for r in _runs_of(trials, base.number) if feasible(r) and r.values]
    return pooled([trial_interval(t) for t in runs])


def gain_over(win: Interval, base: Interval | None) -> dict[str, Any] | None:
    """The winner over the baseline: ratio with its conservative interval, and the verdict (a tie is a tie)."""
    if base is None:
        return None
    g = gain(win, base)
    return {"ratio": g.value, "low": g.low, "high": g.high, "text": f"{g.value:.2f}x ({g.low:.2f}-{g.high:.2f})",
            "verdict": compare(win, base), "baseline": base.to_dict()}
