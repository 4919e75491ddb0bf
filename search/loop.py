"""The ask/tell loop of one worker: baseline, search trials, duplicates, retries, finalists.

The loop knows nothing of processes or hosts: it calls `evaluate(n, params, role, should_prune)` (the trial engine,
bound by tunectl/study.py) and `cleanup(n)` (tear down what trial n left) and reports through `on_event`.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from tunectl.search import finalists as fin
from tunectl.search.feedback import Verdict, judge
from tunectl.search.foresight import Seen, predicted_crash, repairs_crash
from tunectl.search.pruning import make_pruner
from tunectl.search.repair import RepairLookup, lookup, repaired_configs
from tunectl.search.sampler import (
    LOCAL_AFTER,
    LOCAL_EVERY,
    MAX_VETOES,
    TPE_STARTUP,
    VETO_RISK,
    History,
    complete,
    neighbours,
    random_params,
    startup_risk,
)
from tunectl.search.space import baseline_params, config_key, suggest, try_first_params
from tunectl.search.study import HOST_ATTR, Heartbeat, HostState, WorkerLock, fail_running, requeue

from tunectl.models import LevelResult, TrialResult
from tunectl.profile import Profile

Evaluate = Callable[[int, dict[str, Any], str, Callable[[LevelResult], bool] | None], TrialResult]
Event = Callable[[str, dict[str, Any]], None]
MAX_DUPLICATES = 25


@dataclass
class Hooks:
    evaluate: Evaluate
    cleanup: Callable[[int], None] | None = None
    on_event: Event | None = None
    lock: Callable[[str], WorkerLock] | None = None     # a study-wide lock by name (baseline, finalists)
    repairs: RepairLookup | None = None                  # the crash catalog's repairs per signature


@dataclass
class LoopStats:
    evaluated: int = 0
    duplicates: int = 0
    retries: int = 0
    saved_s: float = 0.0
    exhausted: bool = False
    verdicts: list[fin.FinalistVerdict] = field(default_factory=list)


def _outcome(t: FrozenTrial) -> str:
    if t.state != TrialState.COMPLETE:
        return "pruned"
    if "crash_class" not in t.user_attrs and not t.user_attrs.get("degenerate"):
        return "ok"
    return "startup" if t.user_attrs.get("crash_phase") == "startup" or not t.values or not t.values[0] else "load"


def _history(done: list[FrozenTrial]) -> History:
    return [(t.params, _outcome(t), t.values[0] if t.values else 0.0) for t in done]


def _level_values(t: FrozenTrial) -> dict[tuple[str, int], float]:
    ladder = t.user_attrs.get("ladder") or []
    return {(w, int(c)): float(thr) for w, c, status, thr, _ in ladder if status == "ok"}


def _outpaced(t: FrozenTrial, incumbent: FrozenTrial | None) -> bool:
    """A config that crashed under load after serving more than the incumbent did at the same levels."""
    if t.state != TrialState.COMPLETE or t.user_attrs.get("crash_phase") != "load" or not t.values:
        return False
    if incumbent is None:
        return t.values[0] > 0
    mine, theirs = _level_values(t), _level_values(incumbent)
    top = max(mine, key=lambda k: k[1], default=None)
    return top is not None and mine[top] > theirs.get(top, incumbent.values[0])


def _improved(done: list[FrozenTrial]) -> bool:
    """The last finished trial was a local or repair step and is the new incumbent."""
    last = max(done, key=lambda t: t.number)
    best = fin.candidates(done)
    return bool(best) and best[0].number == last.number and last.user_attrs.get("proposed_by") in ("local", "repair")


def counted(t: FrozenTrial) -> bool:
    """Trials that use the search budget: search/baseline, not duplicates, not failed attempts."""
    return (fin.role(t) in fin.SEARCH_ROLES and "duplicate_of" not in t.user_attrs
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING))


class SearchLoop:
    def __init__(self, study: optuna.Study, prof: Profile, hooks: Hooks, host_key: str, state: HostState,
                 heartbeat_s: float = 10.0, seed: int | None = 0):
        self.study, self.prof, self.hooks, self.host_key = study, prof, hooks, host_key
        self.state, self.heartbeat_s = state, heartbeat_s
        self.stats = LoopStats()
        self.rng = random.Random(seed)
        self.local_steps = prof.search.sampler == "tpe"
        # With the crash catalog's repairs (Hooks.repairs), local steps also keep going while they improve and
        # fill knobs that become active with their baseline values (the catalog's vetoes catch the crashes a
        # walk then meets); without it they alternate with the sampler and draw such knobs at random.
        self.catalog = hooks.repairs is not None
        self._turn = 0

    def emit(self, kind: str, **data: Any) -> None:
        if self.hooks.on_event is not None:
            self.hooks.on_event(kind, data)

    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    # ------------------------------------------------------------------------------------------ phases

    def ensure_baseline(self) -> None:
        lock = self.hooks.lock("baseline") if self.hooks.lock else None
        if lock:
            lock.acquire(blocking=True)
        try:
            if not any(fin.role(t) == "baseline" for t in self.trials()):
                self.study.enqueue_trial(baseline_params(self.prof), user_attrs={"role": "baseline"})
                for params in try_first_params(self.prof):
                    self.study.enqueue_trial(params, user_attrs={"role": "search", "proposed_by": "profile"})
        finally:
            if lock:
                lock.release()

    def search(self, n_trials: int) -> None:
        dup_run = veto_run = 0
        while sum(counted(t) for t in self.trials()) < n_trials or self._waiting():
            optuna.storages.fail_stale_trials(self.study)
            self._maybe_local_step()
            trial = self._ask()
            if veto_run < MAX_VETOES and self._veto(trial):
                veto_run += 1
                continue
            veto_run = 0
            outcome = self.run_one(trial)
            dup_run = dup_run + 1 if outcome == "duplicate" else 0
            if dup_run >= MAX_DUPLICATES and not self._step_off():
                self.stats.exhausted = True
                self.emit("exhausted", trials=self.stats.evaluated)
                return

    def _maybe_local_step(self) -> None:
        """Queue a repair step or a local step before the sampler's next proposal: a repair whenever a config
        that out-served the incumbent crashed with a signature the catalog can repair; a local step every
        LOCAL_EVERY-th turn, and on every turn while the last local step improved the incumbent."""
        if self.local_steps is False or self._waiting():
            return
        trials = self.trials()
        done = [t for t in trials if counted(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        self._turn += 1
        if len(done) < LOCAL_AFTER:
            return
        seen = {config_key(t.params) for t in trials if t.state != TrialState.FAIL}
        repair = self._repair(done, seen)
        if repair is not None:
            self.study.enqueue_trial(repair[1], user_attrs={"role": "search", "proposed_by": "repair",
                                                            "repair_of": repair[0]})
            return
        if self._turn % LOCAL_EVERY and not (self.catalog and _improved(done)):
            return
        center = self._center(done)
        if center is None:
            return
        cands = neighbours(self.prof.search, dict(center.params), seen, self.rng, _history(done),
                           baseline_params(self.prof) if self.catalog else None,
                           self._explainer(done) if self.catalog else None)
        pick = next((c for c in cands if not self._foreseen(c, done)), None)
        if pick is not None:
            self.study.enqueue_trial(pick, user_attrs={"role": "search", "proposed_by": "local"})

    def _repair(self, done: list[FrozenTrial], seen: set[str]) -> tuple[int, dict[str, Any]] | None:
        """The first untried repair of the fastest config that crashed under load while serving more than the
        incumbent did at the same levels."""
        if self.hooks.repairs is None:
            return None
        best = fin.candidates(done)
        fixed = {t.user_attrs.get("repair_of") for t in best}
        known = self._seen(done)
        base = baseline_params(self.prof)
        for t in sorted((t for t in done if _outpaced(t, best[0] if best else None)), key=lambda t: -t.values[0]):
            if t.number in fixed:
                continue                        # one of its repairs already serves the whole ladder
            fixes = lookup(self.hooks.repairs, t.user_attrs.get("crash_signature"),
                           str(t.user_attrs.get("crash_exception", "")))
            for cand in repaired_configs(self.prof.search, dict(t.params), fixes,
                                         lambda p: complete(self.prof.search, p, self.rng, base)):
                if config_key(cand) not in seen and predicted_crash(self.prof.search, cand, known) is None:
                    return t.number, cand
        return None

    def _veto(self, trial: optuna.trial.Trial) -> bool:
        """Drop a sampler proposal the history says will crash at startup (told FAIL: no budget used, ignored by
        the sampler); the next ask proposes again."""
        if not self.local_steps or "fixed_params" in self.study._storage.get_trial_system_attrs(trial._trial_id):
            return False
        done = [t for t in self.trials() if counted(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        params = suggest(trial, self.prof.search)
        like = predicted_crash(self.prof.search, params, self._seen(done))
        risk = 1.0 if like is not None else startup_risk(params, _history(done)) if len(done) >= TPE_STARTUP else 0.0
        if risk < VETO_RISK:
            return False
        trial.set_user_attr("vetoed", round(risk, 3))
        if like is not None:
            trial.set_user_attr("vetoed_like", like.number)
        self.study.tell(trial, state=TrialState.FAIL)
        self.emit("vetoed", n=trial.number, params=params, risk=risk)
        return True

    def _foreseen(self, params: dict[str, Any], done: list[FrozenTrial]) -> bool:
        """A crash the history predicts: one the vetoes of search/foresight.py flag, or startup-crash odds of
        VETO_RISK or more."""
        return (predicted_crash(self.prof.search, params, self._seen(done)) is not None
                or len(done) >= TPE_STARTUP and startup_risk(params, _history(done)) >= VETO_RISK)

    def _explainer(self, done: list[FrozenTrial]) -> Callable[[dict[str, Any]], History]:
        """The history without the crashes a candidate repairs (it applies one of their catalog repairs): those
        say nothing about its own risk (fp8 KV crashed with the chunked prefix cache on, not with it off)."""
        rows, known = _history(done), self._seen(done)
        fixable = [i for i, s in enumerate(known) if s.crash_phase and s.fixes]

        def explain(cand: dict[str, Any]) -> History:
            gone = {i for i in fixable if repairs_crash(self.prof.search, cand, known[i])}
            return [r for i, r in enumerate(rows) if i not in gone] if gone else rows

        return explain

    def _seen(self, done: list[FrozenTrial]) -> list[Seen]:
        out = []
        for t in done:
            a = t.user_attrs
            phase = None if a.get("crash_class") is None else "startup" if _outcome(t) == "startup" else "load"
            fixes = lookup(self.hooks.repairs, a.get("crash_signature"), str(a.get("crash_exception", ""))) \
                if phase else ()
            out.append(Seen(dict(t.params), phase, fixes, {c: v for (_, c), v in _level_values(t).items()},
                            a.get("crash_level"), t.number))
        return out

    def _center(self, done: list[FrozenTrial]) -> FrozenTrial | None:
        """The config the local step moves from: the best feasible one, or (without the catalog, whose repair
        steps do this better) a config that crashed under load after serving more than that (its neighbours may
        keep the speed and lose the crash)."""
        best = fin.candidates(done)
        if self.catalog:
            return best[0] if best else None
        top = best[0].values[0] if best else 0.0
        load = [t for t in done if t.state == TrialState.COMPLETE and t.values and t.values[0] > top
                and t.user_attrs.get("crash_phase") == "load"]
        return max(load, key=lambda t: t.values[0]) if load else (best[0] if best else None)

    def _waiting(self) -> bool:
        return any(t.state == TrialState.WAITING for t in self.trials())

    def _step_off(self) -> bool:
        """The sampler keeps proposing configs already run: queue an unseen random one instead."""
        seen = {config_key(t.params) for t in self.trials() if t.state != TrialState.FAIL}
        for _ in range(200):
            params = random_params(self.prof.search, self.rng)
            if config_key(params) not in seen:
                self.study.enqueue_trial(params, user_attrs={"role": "search", "stepped_off": True})
                return True
        return False

    # ------------------------------------------------------------------------------------------ one trial

    def _ask(self) -> optuna.trial.Trial:
        """Ask, and record at once which host holds the trial (resume finds its orphans by this)."""
        trial = self.study.ask()
        trial.storage.set_trial_system_attr(trial._trial_id, HOST_ATTR, self.host_key)
        return trial

    def run_one(self, trial: optuna.trial.Trial) -> str:
        params = suggest(trial, self.prof.search)
        role = str(trial.user_attrs.get("role", "search"))
        if "role" not in trial.user_attrs:
            trial.set_user_attr("role", role)
        if role == "search" and self._duplicate(trial, params):
            return "duplicate"
        self.emit("trial_start", n=trial.number, params=params, role=role,
                  done=sum(counted(t) for t in self.trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)))
        result, pruner = self._evaluate(trial, params, role)
        verdict = judge(result, self.prof, int(trial.user_attrs.get("infra_tries", 0)),
                        int(trial.user_attrs.get("flaky_tries", 0)))
        self.tell(trial, verdict)
        self.stats.evaluated += 1
        self.stats.saved_s += pruner.saved_s()
        self.emit("trial_end", n=trial.number, params=params, role=role, state=verdict.state.name,
                  values=verdict.values, feasible=verdict.feasible, reason=verdict.reason,
                  constraints=verdict.constraints, result=result, best=self.best_value())
        return verdict.state.name

    def _evaluate(self, trial: optuna.trial.Trial, params: dict[str, Any], role: str) -> tuple[TrialResult, Any]:
        planned = [(w.kind, c) for w in self.prof.bench.workloads for c in self.prof.bench.levels]
        pruner = make_pruner(self.prof.search.pruning, self.study, trial if role == "search" else None, planned)
        if role != "search":
            pruner.cfg = pruner.cfg.model_copy(update={"enabled": False})   # baseline/finalists run the whole ladder
        self.state.set(trial.number)
        started = time.monotonic()
        with Heartbeat(self.study._storage, trial._trial_id, self.heartbeat_s):
            result = self.hooks.evaluate(trial.number, params, role, pruner)
        self.state.clear()
        if result.status == "pruned" and not result.saved_s:
            result.saved_s = pruner.saved_s()
        result.wall_s = result.wall_s or time.monotonic() - started
        return result, pruner

    def _duplicate(self, trial: optuna.trial.Trial, params: dict[str, Any]) -> bool:
        key = config_key(params)
        for t in self.trials():
            if (t.number == trial.number or fin.role(t) == "finalist" or "duplicate_of" in t.user_attrs
                    or config_key(t.params) != key):
                continue
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                self._tell_copy(trial, t)
                return True
            if t.state == TrialState.RUNNING:
                trial.set_user_attr("duplicate_of", t.number)
                self.study.tell(trial, state=TrialState.FAIL)
                return True
        return False

    def _tell_copy(self, trial: optuna.trial.Trial, t: FrozenTrial) -> None:
        """A config already run: tell its result again without running it (the sampler insisted)."""
        self.stats.duplicates += 1
        trial.set_user_attr("duplicate_of", t.number)
        for k in ("status", "crash_class", "ladder"):
            if k in t.user_attrs:
                trial.set_user_attr(k, t.user_attrs[k])
        if t.state == TrialState.PRUNED:
            self.study.tell(trial, state=TrialState.PRUNED)
            return
        for k, v in t.constraints.items() if isinstance(t.constraints, dict) else []:
            trial.set_constraint(k, v)
        self.study.tell(trial, t.values)
        self.emit("duplicate", n=trial.number, of=t.number)

    def tell(self, trial: optuna.trial.Trial, v: Verdict) -> None:
        for k, val in v.user_attrs.items():
            trial.set_user_attr(k, val)
        trial.set_user_attr("reason", v.reason)
        if v.state == TrialState.COMPLETE:
            for k, val in v.constraints.items():
                trial.set_constraint(k, val)
            self.study.tell(trial, v.values)
        elif v.state == TrialState.PRUNED:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        if v.retry:
            self.stats.retries += 1
            bump = "infra_tries" if v.user_attrs.get("infra_fault") else "flaky_tries"
            requeue(self.study, self.study.trials[trial.number], v.reason, **{bump: 1})
            self.emit("retry", n=trial.number, reason=v.reason)

    def best_value(self) -> float | None:
        cands = fin.candidates(self.trials())
        return float(cands[0].values[0]) if cands else None

    # ------------------------------------------------------------------------------------------ finalists

    def finalists(self) -> list[fin.FinalistVerdict]:
        cfg = self.prof.search.finalists
        if cfg.top_k == 0 or cfg.reruns == 0:
            self.stats.verdicts = []
            return []
        rounds = 1
        while True:
            picks = fin.pick(self.trials(), cfg.top_k, rounds)
            self._run_reruns(picks, cfg.reruns)
            trials = self.trials()
            verdicts = [fin.verdict(trials, t, cfg.reruns) for t in picks]
            if fin.winner(verdicts, cfg.top_k) or len(picks) < cfg.top_k * rounds or rounds >= 3:
                self.stats.verdicts = verdicts
                return verdicts
            rounds += 1

    def _run_reruns(self, picks: list[FrozenTrial], reruns: int) -> None:
        lock = self.hooks.lock("finalists") if self.hooks.lock else None
        if lock:
            lock.acquire(blocking=True)
        try:
            fin.enqueue_reruns(self.study, picks, reruns)
        finally:
            if lock:
                lock.release()
        self.emit("finalists", picks=[t.number for t in picks], reruns=reruns)
        while self._waiting():
            optuna.storages.fail_stale_trials(self.study)
            trial = self._ask()
            if "fixed_params" not in self.study._storage.get_trial_system_attrs(trial._trial_id):
                trial.set_user_attr("unused", True)      # the queue emptied under us: give the slot back
                fail_running(self.study, self.study.trials[trial.number])
                continue
            self.run_one(trial)
