"""Racing the finalists (as in F-race): re-run on fresh launches every config that the leader does not beat beyond
the noise, until the leader's interval separates from the rest or the rerun budget is spent.

- Each config's launches (its search run and its reruns) give its mean objective value and a 95% interval from the
  launch-to-launch noise: one relative spread for the whole study, pooled over every config with two or more
  launches, with the profile's prior (`search.finalists.noise`, real GPUs: ~5%, docs/real-gpu.md) counted as
  `PRIOR_DF` launches' worth, so a config run once has an honest interval (+-2 sd), never a point; wider for a
  config whose own launches scatter more (`own_noise`: eager configs do on real GPUs); never narrower than the
  launches' own level intervals allow.
- Pooled (`search.pool`, search/pooling.py): each config's launches weighed against what the value model predicts
  for it from the other configs; the race ranks by that estimate and its interval (a lucky reading that its knob
  values do not explain ranks lower), while the number printed for a config stays the mean of its own launches.
- The leader is the config ranked first; its contenders are the configs whose interval overlaps the leader's.
  A round queues the leader's missing reruns (it rests on 1 + `reruns` launches at least, and on as many as any
  contender), then one rerun of each contender, the highest upper bound first, as far as the budget goes. A rerun
  that crashes demotes its config.
- The winner is the best-ranked confirmed config (two or more launches, none crashed), never a single reading; the
  configs whose intervals still overlap the winner's are tied with it and named.
- Launches on more than one machine (the trials' recorded `machine`: a study resumed on another host or GPU, or
  slots on different cards): the same config can read 2-18% apart on two H100s of one model (docs/real-gpu.md, the
  end-to-end search), so a config re-run only on the slower machine would rank below one read only on the faster.
  Where configs read on both link the machines, each machine's level is taken out first (log value = config +
  machine, least squares over the linked launches, `machine_terms`): every launch is put on the scale of the
  machine with the most launches, and the race's means, intervals, ranking and gain are on that scale; each
  interval also carries the error of the machine levels its launches were moved by (`level_var`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tunectl.stats import Interval, compare, machine_words, t95

ROUND = 3               # contenders re-run per round (the highest upper bounds): successive halving, not all at once
PRIOR_DF = 4            # the prior spread counts as this many launches' worth of evidence
MIN_LINKS = 2           # configs read on two machines before their levels are taken out (one: its noise decides)
RULE = ("every config whose 95% interval overlaps the leader's is re-run on fresh launches until the leader "
        "separates or the rerun budget is spent; the winner is the best mean over two or more launches")
POOLED = ("every config whose 95% interval overlaps the leader's is re-run on fresh launches until the leader "
          "separates or the rerun budget is spent; configs are ranked by their launches pooled with what the other "
          "configs' readings predict for them (model misfit {misfit:.1%}); the winner is the best so ranked of "
          "those with two or more launches, its number the mean of its own launches")


MACHINES = ("; launches ran on {n} machines: each machine's level taken out, every number on the scale of the one "
            "with the most launches ({terms}; from {linked} configs read on more than one)")


def rule(st: "Standings") -> str:
    """The rule the race ran by, as the closing lines and best.json print it."""
    out = POOLED.format(misfit=st.misfit) if math.isfinite(st.misfit) else RULE
    if st.machines:
        out += MACHINES.format(n=len(st.machines), terms=machine_words(st.machines), linked=st.linked)
    return out


@dataclass
class Entry:
    """One config in the race: its search trial, the objective value of each fresh launch (the search run first)."""

    trial: int
    params: dict[str, Any]
    values: list[float] = field(default_factory=list)
    halves: list[float] = field(default_factory=list)   # each launch's own 95% half-width, relative
    runs: list[int] = field(default_factory=list)       # the trials of those launches
    machines: list[str] = field(default_factory=list)   # the machine each launch ran on ("": not recorded)
    level_var: float = 0.0                              # the machine levels' error in its mean (x launch variance)
    pending: int = 0                                    # reruns queued or running
    crashed: FrozenTrial | None = None                  # the first rerun that crashed: the config is demoted
    interval: Interval = field(default_factory=lambda: Interval(0.0, 0.0, 0.0, 0))   # its own launches
    pooled: Interval | None = None                      # its launches and the other configs' (search/pooling.py)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return fmean(self.values) if self.values else 0.0

    @property
    def ranked(self) -> Interval:
        """What the race ranks it by: the pooled estimate where there is one, else its own launches."""
        return self.pooled or self.interval

    @property
    def estimate(self) -> float:
        return self.ranked.value

    @property
    def alive(self) -> bool:
        return self.crashed is None and bool(self.values)

    @property
    def confirmed(self) -> bool:
        return self.alive and self.n >= 2


@dataclass
class Standings:
    entries: list[Entry]                  # alive first, best mean first
    noise: float                          # the relative launch-to-launch sd the intervals use
    noise_df: int                         # launches' worth of evidence the study measured it from (prior excluded)
    misfit: float = math.inf              # the value model's log error for a config it did not see (pooling)
    machines: dict[str, float] = field(default_factory=dict)   # machine -> its log level (the reference 0); {}: one
    linked: int = 0                       # configs read on more than one of those machines

    @property
    def leader(self) -> Entry | None:
        return next((e for e in self.entries if e.alive), None)

    def contenders(self, of: Entry | None = None) -> list[Entry]:
        """Alive configs the given one (default: the leader) does not beat beyond the noise, highest bound first."""
        top = of or self.leader
        if top is None:
            return []
        out = [e for e in self.entries if e.alive and e is not top and compare(top.ranked, e.ranked) != "above"]
        return sorted(out, key=lambda e: -e.ranked.high)

    def winner(self) -> Entry | None:
        """The best confirmed estimate; None when no config has two launches."""
        return max((e for e in self.entries if e.confirmed), key=lambda e: e.estimate, default=None)


def _value(t: FrozenTrial) -> tuple[float, float]:
    v = float(t.values[0])
    ci = t.user_attrs.get("objective_ci95")
    return v, ((ci[1] - ci[0]) / 2 / v if ci and v > 0 else 0.0)


def standings(trials: list[FrozenTrial], configs: list[FrozenTrial], prior: float,
              is_rerun: Any, feasible: Any, pool: Any = None) -> Standings:
    """`configs`: the feasible search trials, one per config; `is_rerun(t, n)`: t is a rerun of search trial n;
    `pool`: search/pooling.py's estimator (None: each config on its own launches)."""
    entries = []
    for c in configs:
        e = Entry(c.number, dict(c.params))
        e.values, e.halves, e.runs = [_value(c)[0]], [_value(c)[1]], [c.number]
        e.machines = [str(c.user_attrs.get("machine") or "")]
        for r in (r for r in trials if is_rerun(r, c.number)):
            if r.state in (TrialState.WAITING, TrialState.RUNNING):
                e.pending += 1
            elif r.state == TrialState.COMPLETE and feasible(r) and r.values and r.values[0] > 0:
                v, h = _value(r)
                e.values.append(v), e.halves.append(h), e.runs.append(r.number)
                e.machines.append(str(r.user_attrs.get("machine") or ""))
            elif r.state in (TrialState.COMPLETE, TrialState.PRUNED) and e.crashed is None:
                e.crashed = r
        entries.append(e)
    terms, linked, cov = machine_terms([e for e in entries if e.alive])
    for e in entries:  # every launch on the reference machine's scale (its level taken out); one machine: as read
        e.values = [v * math.exp(-terms.get(m, 0.0)) for v, m in zip(e.values, e.machines)]
        e.level_var = level_var(e, cov)
    noise, df = launch_noise(entries, prior)
    for e in entries:
        e.interval = interval(e, noise, df)
    tau = math.inf
    if pool is not None:
        alive = [e for e in entries if e.alive]
        est, tau = pool([(e.params, e.values) for e in alive], noise)
        for e, got in zip(alive, est):
            if got is not None:
                h = t95(df + PRIOR_DF) * math.sqrt(got[1] ** 2 + e.level_var * noise ** 2)
                e.pooled = Interval(math.exp(got[0]), math.exp(got[0] - h), math.exp(got[0] + h), e.n)
    entries.sort(key=lambda e: (not e.alive, -e.estimate))
    return Standings(entries, noise, df, tau, terms, linked)


def machine_terms(entries: list[Entry]) -> tuple[dict[str, float], int, dict[tuple[str, str], float]]:
    """Each machine's log level against the machine with the most launches (0), from log value = config + machine
    fitted by least squares on the launches of the configs read on more than one machine (a config read on one
    tells nothing of the machines), over the machines they link to it; how many configs link them; and the levels'
    covariance per unit launch variance ((m1, m2) -> c: times the launch spread squared, what the levels' own
    error adds to a launch put on the reference's scale). ({}, 0, {}): one machine, or fewer than MIN_LINKS
    configs link any two."""
    import numpy as np

    count: dict[str, int] = {}
    for e in entries:
        for m in e.machines:
            count[m] = count.get(m, 0) + 1
    if len(count) < 2:
        return {}, 0, {}
    ref = max(count, key=lambda m: (count[m], m))
    links = [e for e in entries if len(set(e.machines)) > 1 and min(e.values) > 0]
    group, grew = {ref}, True            # the machines linked to the reference
    while grew:
        grew = False
        for e in links:
            ms = set(e.machines)
            if ms & group and not ms <= group:
                group |= ms
                grew = True
    links = [e for e in links if len(set(e.machines) & group) > 1]
    if len(group) < 2 or len(links) < MIN_LINKS:
        return {}, 0, {}
    others = sorted(group - {ref})
    col = {m: len(links) + k for k, m in enumerate(others)}
    rows, ys = [], []
    for i, e in enumerate(links):
        for v, m in zip(e.values, e.machines):
            if m in group:
                x = [0.0] * (len(links) + len(others))
                x[i] = 1.0
                if m != ref:
                    x[col[m]] = 1.0
                rows.append(x)
                ys.append(math.log(v))
    x, y = np.array(rows), np.array(ys)
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    inv = np.linalg.pinv(x.T @ x)
    level = {ref: 0.0, **{m: float(beta[col[m]]) for m in others}}
    cov = {(a, b): float(inv[col[a], col[b]]) for a in others for b in others}
    return level, len(links), cov


def level_var(e: Entry, cov: dict[tuple[str, str], float]) -> float:
    """What the machine levels' error adds to the variance of a config's mean log value (per unit launch variance):
    w' C w, w the share of its launches on each machine whose level was taken out."""
    if not cov or not e.machines:
        return 0.0
    w: dict[str, float] = {}
    for m in e.machines:
        w[m] = w.get(m, 0.0) + 1.0 / len(e.machines)
    return max(0.0, sum(w.get(a, 0.0) * w.get(b, 0.0) * c for (a, b), c in cov.items()))


def launch_noise(entries: list[Entry], prior: float) -> tuple[float, int]:
    """The relative launch-to-launch sd pooled over the configs with two or more launches (log values), the prior
    counted as PRIOR_DF launches; and the degrees of freedom measured."""
    ss, df = 0.0, 0
    for e in entries:
        if e.n >= 2 and e.crashed is None and min(e.values) > 0:
            logs = [math.log(v) for v in e.values]
            m = fmean(logs)
            ss += sum((x - m) ** 2 for x in logs)
            df += e.n - 1
    return math.sqrt((ss + PRIOR_DF * prior ** 2) / (df + PRIOR_DF)), df


def own_noise(e: Entry, noise: float) -> float:
    """The config's launch-to-launch sd: the study's pooled one, or wider where its own launches scatter more (their
    spread shrunk toward the pooled one, which counts as PRIOR_DF launches). Launches of one config are not all alike
    in noise: on a real H100 eager configs moved 12% between launches where graphed ones moved 2%
    (docs/landscapes.md), and a pooled spread read mostly from the latter is too narrow for the former."""
    if e.n < 2 or min(e.values) <= 0:
        return noise
    logs = [math.log(v) for v in e.values]
    m = fmean(logs)
    own = math.sqrt((sum((x - m) ** 2 for x in logs) + PRIOR_DF * noise ** 2) / (e.n - 1 + PRIOR_DF))
    return max(noise, own)


def interval(e: Entry, noise: float, df: int) -> Interval:
    if not e.values:
        return Interval(0.0, 0.0, 0.0, 0)
    between = t95(df + PRIOR_DF) * math.sqrt(own_noise(e, noise) ** 2 / e.n + e.level_var * noise ** 2)
    within = math.sqrt(sum(h * h for h in e.halves)) / e.n
    h, m = max(between, within), e.mean
    return Interval(m, m * (1 - h), m * (1 + h), e.n)


def next_round(st: Standings, reruns: int, budget_left: int) -> list[Entry]:
    """The reruns to queue now (a config listed k times gets k), as far as `budget_left` goes; empty: the race is
    over (separated, spent, or every contender's rerun is still running elsewhere)."""
    leader = st.leader
    if leader is None or budget_left <= 0:
        return []
    rivals = st.contenders()
    want = max(1 + reruns, max((e.n + e.pending for e in rivals), default=0) + (1 if rivals else 0))
    out = [leader] * max(0, want - leader.n - leader.pending)
    out += [e for e in rivals if e.pending == 0][:ROUND]
    return out[:budget_left]
