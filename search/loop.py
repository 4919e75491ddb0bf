"""What the ask/tell loop of one worker does, at any width: baseline, vetoes, duplicates, retries, the finalists'
race. The loop itself (asking while a slot is free, landing what finishes) is search/parallel.py's `ParallelLoop`,
the only one: a sequential search is that loop with one slot.

The loop knows nothing of processes or hosts: it calls `evaluate(n, params, role, should_prune)` (the trial engine,
bound by tunectl/wiring/study.py) and `cleanup(n)` (tear down what trial n left) and reports through `on_event`.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from tunectl.search import finalists as fin
from tunectl.search import pooling, race
from tunectl.search.feedback import Verdict, is_infra, judge
from tunectl.search.pruning import make_pruner
from tunectl.search.repair import RepairLookup
from tunectl.search.sampler import VETO_RISK, random_params, snap
from tunectl.search.effective import chosen, effective
from tunectl.search.space import (UNSET_ATTR, baseline_params, config_key, suggest, try_first_params,
                                  unset_in_baseline)
from tunectl.search.steps import Steps, admission, counted, finished, ran
from tunectl.search.study import (
    HOST_ATTR,
    Heartbeat,
    HostState,
    WorkerLock,
    fail_stale,
    queued,
    requeue,
)

from tunectl.models import LevelResult, TrialResult
from tunectl.profile import Profile

Evaluate = Callable[[int, dict[str, Any], str, Callable[[LevelResult], bool] | None], TrialResult]
Event = Callable[[str, dict[str, Any]], None]
MAX_DUPLICATES = 25
# infra results in a row (launch refused, runner fault, the engine missing on the host) that take a slot out of the
# run: with every slot out (one, in a sequential run) the search stops instead of retrying forever
RETIRE_AFTER_INFRA = 3


@dataclass
class Hooks:
    evaluate: Evaluate
    cleanup: Callable[[int], None] | None = None
    on_event: Event | None = None
    lock: Callable[[str], WorkerLock] | None = None     # a study-wide lock by name (baseline, finalists)
    repairs: RepairLookup | None = None                  # the crash catalog's repairs per signature
    gpu_sm: int | None = None                            # the GPU's compute capability x 10 (None: not known)


@dataclass
class LoopStats:
    evaluated: int = 0
    duplicates: int = 0
    retries: int = 0
    saved_s: float = 0.0
    exhausted: bool = False
    retired: bool = False                  # stopped: every slot ended RETIRE_AFTER_INFRA trials in a row as infra
    verdicts: list[fin.FinalistVerdict] = field(default_factory=list)
    race: dict[str, Any] = field(default_factory=dict)      # the race's rule, budget, reruns spent, noise used


class SearchLoop:
    def __init__(self, study: optuna.Study, prof: Profile, hooks: Hooks, host_key: str, state: HostState,
                 heartbeat_s: float = 10.0, seed: int | None = 0):
        self.study, self.prof, self.hooks, self.host_key = study, prof, hooks, host_key
        self.state, self.heartbeat_s = state, heartbeat_s
        self.stats = LoopStats()
        self.infra_run: dict[str, int] = {}      # a slot's infra results in a row
        self.retired_why: str | None = None       # the infra fault that took the last slot out of the run
        self.rng = random.Random(seed)
        self.local_steps = prof.search.sampler == "tpe"
        self.steps = Steps(prof, hooks.repairs, self.rng, hooks.gpu_sm)
        self.hostless: dict[int, float] = {}      # trials seen without a host, when first seen (`fail_stale`)

    def emit(self, kind: str, **data: Any) -> None:
        if self.hooks.on_event is not None:
            self.hooks.on_event(kind, data)

    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def history(self) -> list[FrozenTrial]:
        """The trials as the proposers and vetoes read them: a baseline's knobs left to SGLang at the values it chose
        (search/effective.py)."""
        return effective(self.prof.search, self.trials())

    # ------------------------------------------------------------------------------------------ phases

    def ensure_baseline(self) -> None:
        lock = self.hooks.lock("baseline") if self.hooks.lock else None
        if lock:
            lock.acquire(blocking=True)
        try:
            if not any(fin.role(t) == "baseline" for t in self.trials()):
                unset = unset_in_baseline(self.prof)            # knobs with no base value: the server's own
                self.study.enqueue_trial(baseline_params(self.prof), user_attrs={
                    "role": "baseline", **({UNSET_ATTR: unset} if unset else {})})
                for params in try_first_params(self.prof):
                    self.study.enqueue_trial(params, user_attrs={"role": "search", "proposed_by": "profile"})
        finally:
            if lock:
                lock.release()

    def search(self, n_trials: int) -> None:
        """Run trials until `n_trials` count (search/parallel.py `ParallelLoop`, at any width)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Run what is queued: the finalists' reruns (search/parallel.py `ParallelLoop`)."""
        raise NotImplementedError

    def _exhausted(self) -> None:
        self.stats.exhausted = True
        self.emit("exhausted", trials=self.stats.evaluated)

    def _maybe_local_step(self) -> None:
        """Queue the loop's own proposal (a repair or local step, search/steps.py), if it has one now."""
        if self.local_steps is False or self._waiting():
            return
        step = self.steps.next(self.history())
        if step is not None:
            self.study.enqueue_trial(step[0], user_attrs=step[1])

    def _veto(self, trial: optuna.trial.Trial) -> bool:
        """Drop a sampler proposal the history says will crash (told FAIL: no budget used, ignored by the
        sampler); the next ask proposes again."""
        if not self.local_steps or queued(trial):
            return False
        params = suggest(trial, self.prof.search)
        done = finished(self.history())
        on_grid = snap(self.prof.search, params)
        if on_grid != params:
            return self._regrid(trial, on_grid, done)
        risk, like = self.steps.veto(params, done)
        if risk < VETO_RISK:
            return False
        trial.set_user_attr("vetoed", round(risk, 3))
        if like is not None:
            trial.set_user_attr("vetoed_like", like.number)
        self.study.tell(trial, state=TrialState.FAIL)
        self.emit("vetoed", n=trial.number, params=params, risk=risk)
        return True

    def _regrid(self, trial: optuna.trial.Trial, params: dict[str, Any], done: list[FrozenTrial]) -> bool:
        """A sampler proposal off the grid: told FAIL unrun, and its grid version queued instead (unless it ran
        already or a veto drops it)."""
        seen = ran(self.history())
        trial.set_user_attr("regridded", True)
        self.study.tell(trial, state=TrialState.FAIL)
        if config_key(params) not in seen and self.steps.veto(params, done)[0] < VETO_RISK:
            self.study.enqueue_trial(params, user_attrs={"role": "search", "proposed_by": "sampler"})
        return True

    def _waiting(self) -> bool:
        return any(t.state == TrialState.WAITING for t in self.trials())

    def _step_off(self) -> bool:
        """The sampler keeps proposing configs already run, or configs the vetoes drop: queue an unseen random
        one instead (with the loop's vetoes on, one they would not drop: a queued trial skips them); False when
        200 draws found none."""
        trials = self.history()
        seen, done = ran(trials), finished(trials)
        known = self.steps.seen(done) if self.local_steps else []
        for _ in range(200):
            params = random_params(self.prof.search, self.rng)
            if config_key(params) not in seen and \
                    (not self.local_steps or self.steps.veto(params, done, known)[0] < VETO_RISK):
                self.study.enqueue_trial(params, user_attrs={"role": "search", "stepped_off": True})
                return True
        return False

    # ------------------------------------------------------------------------------------------ one trial

    def _ask(self, key: str | None = None) -> optuna.trial.Trial:
        """Ask, and record at once which host (slot) holds the trial (resume finds its orphans by this)."""
        trial = self.study.ask()
        trial.set_user_attr(HOST_ATTR, key or self.host_key)
        return trial

    def _retires(self, key: str, result: TrialResult) -> bool:
        """Counts slot `key`'s infra results in a row; True, with `slot_retired` emitted, when they reach
        RETIRE_AFTER_INFRA: a slot whose host fails every launch (its port held by a stranger, its GPUs dirty,
        the engine gone from its interpreter) would eat every config."""
        self.infra_run[key] = self.infra_run.get(key, 0) + 1 if is_infra(result) else 0
        if self.infra_run[key] < RETIRE_AFTER_INFRA:
            return False
        self.retired_why = (result.crash.message or result.crash.signature) if result.crash else "infra fault"
        self.emit("slot_retired", slot=key, reason=self.retired_why)
        return True

    def _new_machine(self, trial: optuna.trial.Trial, machine: str) -> dict[str, list[int]]:
        """Records the trial's machine (TrialResult.machine) on it; when the study's finished trials ran on other
        machines and none on this one: {machine: [trials]} of those (a resume on another host, or slots on
        different GPUs: the same config can read 20% apart on two cards of one model), else {}."""
        if not machine:
            return {}
        trial.set_user_attr("machine", machine)
        seen: dict[str, list[int]] = {}
        for t in self.trials():
            m = t.user_attrs.get("machine")
            if m and t.number != trial.number and t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                seen.setdefault(str(m), []).append(t.number)
        return {} if not seen or machine in seen else seen

    def begin(self, trial: optuna.trial.Trial) -> tuple[dict[str, Any], str] | None:
        """The trial's params and role, announced; None for a duplicate proposal (told without running)."""
        params = suggest(trial, self.prof.search)
        role = str(trial.user_attrs.get("role", "search"))
        if "role" not in trial.user_attrs:
            trial.set_user_attr("role", role)
        if role == "search" and self._duplicate(trial, params):
            return None
        self.emit("trial_start", n=trial.number, params=params, role=role, slot=trial.user_attrs.get(HOST_ATTR),
                  done=sum(counted(t) for t in self.trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)))
        return params, role

    def finish(self, trial: optuna.trial.Trial, params: dict[str, Any], role: str, result: TrialResult,
               pruner: Any) -> str:
        verdict = judge(result, self.prof, int(trial.user_attrs.get("infra_tries", 0)),
                        int(trial.user_attrs.get("flaky_tries", 0)))
        new_machine = self._new_machine(trial, result.machine)
        self.tell(trial, verdict)
        self.stats.evaluated += 1
        self.stats.saved_s += pruner.saved_s()
        self.emit("trial_end", n=trial.number, params=params, role=role, state=verdict.state.name,
                  values=verdict.values, feasible=verdict.feasible, reason=verdict.reason,
                  constraints=verdict.constraints, result=result, best=self.best_value())
        if new_machine:
            self.emit("machine_changed", n=trial.number, machine=result.machine, before=new_machine)
        unset = trial.user_attrs.get(UNSET_ATTR)
        if role == "baseline" and unset and result.server_facts:       # what SGLang picked for the knobs left to it
            self.emit("baseline_chose", n=trial.number, chose=chosen(self.prof.search, unset, result.server_facts))
        return verdict.state.name

    def pruner(self, trial: optuna.trial.Trial, role: str) -> Any:
        planned = [(w.label, c) for w in self.prof.bench.workloads for c in self.prof.bench.levels]
        cfg, weights = self.prof.search.pruning, self.prof.objective.weights
        only = None
        if role != "search" or self.prof.objective.mode != "throughput" or self.prof.bench.rates or len(weights) > 1:
            # baseline/finalists run the whole ladder; a capacity search or rate levels have no common ladder (nor
            # per-token modes a throughput one to compare); a
            # weighted sum over workloads is not known level by level
            cfg = cfg.model_copy(update={"enabled": False})
        elif weights:
            only = dict(weights)
        return make_pruner(cfg, self.study, trial if role == "search" else None, planned, only)

    def evaluate(self, trial: optuna.trial.Trial, params: dict[str, Any], role: str, pruner: Any,
                 evaluate: Evaluate) -> TrialResult:
        """Run the trial under its heartbeat (thread-safe: a parallel loop calls it from one thread per slot)."""
        started = time.monotonic()
        with Heartbeat(self.study._storage, trial._trial_id, self.heartbeat_s):
            result = evaluate(trial.number, params, role, pruner)
        if result.status == "pruned" and not result.saved_s:
            result.saved_s = pruner.saved_s()
        result.wall_s = result.wall_s or time.monotonic() - started
        return result

    def _duplicate(self, trial: optuna.trial.Trial, params: dict[str, Any]) -> bool:
        key = config_key(params)
        for t in self.trials():
            if (t.number == trial.number or fin.role(t) in ("finalist", "prior") or "duplicate_of" in t.user_attrs
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
        if tell_verdict(self.study, trial, v):
            self.stats.retries += 1
            self.emit("retry", n=trial.number, reason=v.reason)

    def best_value(self) -> float | None:
        cands = fin.candidates(self.trials())
        return float(cands[0].values[0]) if cands else None

    # ------------------------------------------------------------------------------------------ finalists

    def finalists(self) -> list[fin.FinalistVerdict]:
        """The race (search/race.py): rounds of reruns until the leader separates or the budget is spent."""
        cfg = self.prof.search.finalists
        if cfg.top_k == 0 or cfg.reruns == 0 or self.stats.retired:     # retired: no slot left to rerun on
            self.stats.verdicts = []
            return []
        while self._race_round(cfg.reruns, cfg.budget, cfg.noise) or self._others_racing():
            self.drain()
        while self._baseline_round(cfg.reruns, cfg.noise) or self._others_racing():
            self.drain()
        st = fin.standings(self.trials(), cfg.noise, self._pool())
        self.stats.verdicts = fin.verdicts(st)
        self.stats.race = {"rule": race.rule(st), "budget": cfg.budget, "spent": fin.spent(self.trials()),
                           "noise": st.noise, "noise_launches": st.noise_df,
                           "misfit": st.misfit if math.isfinite(st.misfit) else None,
                           **({"machines": st.machines} if st.machines else {})}
        return self.stats.verdicts

    def _pool(self) -> pooling.Pool | None:
        """The race's pooled ranking (search/pooling.py), None where the profile turns it off."""
        return pooling.pool_for(self.prof.search, admission(self.prof)) if self.prof.search.pool else None

    def _others_racing(self) -> bool:
        """Another worker's rerun is queued or still runs: wait for it (a queued one `drain` may run here), so every
        worker names the winner from the same launches (and prints the same number). A rerun queued by another
        worker between this worker's last round and this check is waiting, not running yet: without it, this worker
        closed its race one launch short of the other's. A dead worker's rerun is failed as stale and re-queued."""
        mine = set(getattr(self, "keys", None) or [self.host_key])
        trials = self.trials()
        if any(fin.role(t) == "finalist" and t.state == TrialState.WAITING for t in trials):
            return True
        busy = any(fin.role(t) == "finalist" and t.state == TrialState.RUNNING
                   and t.user_attrs.get(HOST_ATTR) not in mine for t in trials)
        if busy:
            time.sleep(min(1.0, self.heartbeat_s / 4))
            fail_stale(self.study, self.hostless)
        return busy

    def _baseline_round(self, reruns: int, prior: float) -> bool:
        """Queue the baseline's missing reruns (the gain's own launches: `fin.baseline_reruns`)."""
        picks, _ = self._queue(lambda st, trials: fin.baseline_reruns(st, trials, reruns), prior,
                               {fin.GAIN_BASE: True})
        if picks:
            self.emit("finalists", picks=[picks[0].trial], reruns=len(picks), leader=None, baseline=True)
        return bool(picks)

    def _race_round(self, reruns: int, budget: int, prior: float) -> bool:
        """Queue the next round's reruns (workers share the race and its budget)."""
        picks, st = self._queue(lambda st, trials: race.next_round(st, reruns, budget - fin.spent(trials)), prior)
        if picks:
            self.emit("finalists", picks=sorted({e.trial for e in picks}), reruns=len(picks),
                      leader=st.leader.trial if st.leader else None)
        return bool(picks)

    def _queue(self, pick: Callable[[race.Standings, list[FrozenTrial]], list[race.Entry]], prior: float,
               attrs: dict[str, Any] | None = None) -> tuple[list[race.Entry], race.Standings]:
        """Under the study-wide finalists lock: the standings now, the reruns `pick` chooses from them, queued."""
        lock = self.hooks.lock("finalists") if self.hooks.lock else None
        if lock:
            lock.acquire(blocking=True)
        try:
            trials = self.trials()
            st = fin.standings(trials, prior, self._pool())
            picks = pick(st, trials)
            fin.enqueue(self.study, picks, **(attrs or {}))
        finally:
            if lock:
                lock.release()
        return picks, st


def tell_verdict(study: optuna.Study, trial: optuna.trial.Trial, v: Verdict) -> bool:
    """Tell the study a trial's verdict (its evidence as user attributes, its constraints); a retry queues the
    same params again. True when it did. Also what a resume tells for a trial whose result was recorded but
    never told (its worker killed in between: `tunectl/wiring/study.py` `tell_recorded`)."""
    for k, val in v.user_attrs.items():
        trial.set_user_attr(k, val)
    trial.set_user_attr("reason", v.reason)
    if v.state == TrialState.COMPLETE:
        for k, val in v.constraints.items():
            trial.set_constraint(k, val)
        study.tell(trial, v.values)
    elif v.state == TrialState.PRUNED:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)
    if v.retry:
        bump = "infra_tries" if v.user_attrs.get("infra_fault") else "flaky_tries"
        requeue(study, study.trials[trial.number], v.reason, **{bump: 1})
    return v.retry
