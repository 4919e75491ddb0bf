"""Finalists: before a winner is named, the configs the leader does not beat beyond the noise race on fresh
launches (search/race.py: the rule, the intervals, the rounds).

Reruns are ordinary Optuna trials (enqueued with the same params, `role=finalist`, `finalist_of=<n>`), so they are
in the study, resumable, shared by every worker of a study (the budget too), and a crash on rerun also teaches the
sampler. Any crash demotes the config.

A finalist's score is the mean objective value of its fresh launches (the search run and its reruns) with the race's
95% interval; its launch-to-launch spread is kept. Configs whose interval overlaps the winner's are a tie (`ties`),
not a loss; `gain` is the winner over the baseline as "x (low-high)".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from tunectl.search import race
from tunectl.search.space import UNSET_ATTR, config_key

from tunectl.stats import Interval, compare, gain, spread

SEARCH_ROLES = ("search", "baseline")
GAIN_BASE = "gain_baseline"          # a rerun of the baseline for the gain's interval, not the race's


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
    estimate: float = 0.0                      # what the race ranked it by: its launches pooled with the others'
    estimate_ci95: list[float] = field(default_factory=list)   # (search/pooling.py); the score's own without a model

    @property
    def interval(self) -> Interval:
        return Interval.of(self.score, self.ci95 or None, self.launches)

    @property
    def ranked(self) -> Interval:
        if not self.estimate:
            return self.interval
        return Interval.of(self.estimate, self.estimate_ci95 or None, self.launches)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_rerun(t: FrozenTrial, n: int) -> bool:
    return role(t) == "finalist" and t.user_attrs.get("finalist_of") == n


def _runs_of(trials: list[FrozenTrial], n: int) -> list[FrozenTrial]:
    return [t for t in trials if is_rerun(t, n)]


def spent(trials: list[FrozenTrial]) -> int:
    """Reruns the race has used: every finalist trial queued, running or finished (not one told FAIL unrun), the
    baseline's own reruns for the gain (`baseline_reruns`) apart."""
    return sum(role(t) == "finalist" and t.state != TrialState.FAIL and not t.user_attrs.get(GAIN_BASE)
               for t in trials)


def baseline_reruns(st: race.Standings, trials: list[FrozenTrial], reruns: int) -> list[race.Entry]:
    """The baseline's missing reruns once the race is over: the gain the study claims rests on the baseline's own
    launches (1 + `reruns`, as the winner's do), not on one reading and the other configs' spread: a baseline that
    scatters more between launches than the finalists (an eager one, on real GPUs) gets the interval it earns."""
    base = next((t.number for t in trials if role(t) == "baseline"), None)
    entry = next((e for e in st.entries if e.trial == base), None)
    if entry is None or not entry.alive:
        return []
    return [entry] * max(0, 1 + reruns - entry.n - entry.pending)


def standings(trials: list[FrozenTrial], prior: float, pool: Any = None) -> race.Standings:
    return race.standings(trials, candidates(trials), prior, is_rerun, feasible, pool)


def enqueue(study: optuna.Study, entries: list[race.Entry], **attrs: Any) -> int:
    """Queue one rerun per listed entry (a config listed twice gets two); returns how many were queued."""
    done: dict[int, int] = {}
    unset = {t.number: t.user_attrs[UNSET_ATTR] for t in study.get_trials(deepcopy=False) if UNSET_ATTR in t.user_attrs}
    for e in entries:
        done[e.trial] = done.get(e.trial, e.n + e.pending - 1) + 1
        keep = {UNSET_ATTR: unset[e.trial]} if e.trial in unset else {}    # the baseline's knobs left to the server
        study.enqueue_trial(dict(e.params), user_attrs={"role": "finalist", "finalist_of": e.trial,
                                                         "rerun": done[e.trial], **keep, **attrs})
    return len(entries)


def verdicts(st: race.Standings) -> list[FinalistVerdict]:
    """The raced configs (re-run at least once, or the leader): each with its launches, interval and fate."""
    out = []
    for e in st.entries:
        if e.n < 2 and e.crashed is None and e is not st.leader:
            continue
        v = FinalistVerdict(trial=e.trial, params=dict(e.params), search_value=e.values[0] if e.values else 0.0,
                            pending=e.pending, survived=e.confirmed, score=e.mean, launches=e.n,
                            ci95=[e.interval.low, e.interval.high], launch_spread=spread(e.values),
                            estimate=e.ranked.value, estimate_ci95=[e.ranked.low, e.ranked.high])
        v.runs = [{"trial": n, "value": val, "feasible": True, "crash_class": None, "crash_level": None}
                  for n, val in zip(e.runs[1:], e.values[1:])]
        if e.crashed is not None:
            c = e.crashed
            v.runs.append({"trial": c.number, "value": c.values[0] if c.values else None, "feasible": False,
                           "crash_class": c.user_attrs.get("crash_class"), "crash_level": c.user_attrs.get(
                               "crash_level")})
            v.reason = (f"demoted: rerun trial {c.number} crashed ({c.user_attrs.get('crash_class')}, "
                        f"c={c.user_attrs.get('crash_level')})")
        else:
            v.reason = f"confirmed on {e.n} launches" if e.confirmed else "one launch: not confirmed"
        out.append(v)
    return out


def trial_interval(t: FrozenTrial) -> Interval:
    """A finished trial's objective with the 95% interval of the level it came from (a point if none)."""
    return Interval.of(float(t.values[0]), t.user_attrs.get("objective_ci95"))


def winner(verdicts: list[FinalistVerdict], top_k: int = 0) -> FinalistVerdict | None:
    """The best confirmed estimate (two or more launches, no crash): never a single reading."""
    alive = [v for v in verdicts if v.survived]
    return max(alive, key=lambda v: v.ranked.value) if alive else None


def ties(verdicts: list[FinalistVerdict], win: FinalistVerdict) -> list[int]:
    """Raced configs the winner does not beat beyond the noise: their intervals overlap (or lie above, unconfirmed)."""
    return [v.trial for v in verdicts if v.trial != win.trial and not v.reason.startswith("demoted")
            and compare(win.ranked, v.ranked) != "above"]


def baseline_interval(trials: list[FrozenTrial], prior: float = 0.05) -> Interval | None:
    """The baseline (trial 0's config) over its launches (the baseline run and any rerun of it), with the race's
    interval: the launch-to-launch noise counts for the baseline too, or the gain's interval would be too narrow."""
    base = next((t for t in trials if role(t) == "baseline" and feasible(t) and t.values), None)
    if base is None:
        return None
    entry = next((e for e in standings(trials, prior).entries if e.trial == base.number), None)
    if entry is not None and entry.alive:
        return entry.interval
    return trial_interval(base)


def gain_over(win: Interval, base: Interval | None) -> dict[str, Any] | None:
    """The winner over the baseline: ratio with its conservative interval, and the verdict (a tie is a tie)."""
    if base is None:
        return None
    g = gain(win, base)
    return {"ratio": g.value, "low": g.low, "high": g.high, "text": f"{g.value:.2f}x ({g.low:.2f}-{g.high:.2f})",
            "verdict": compare(win, base), "baseline": base.to_dict()}
