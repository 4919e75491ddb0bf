"""The ask/tell loop over free slots: one trial per free slot at a time, at any width.

The search's only loop (the sequential search is this loop with one slot); what it shares with every worker
(baseline, local and repair steps, vetoes, duplicates, retries, the finalists' race) is search/loop.py's
`SearchLoop`. With one slot the trial runs on the calling thread (`_Inline`: no pool, an interrupt reaches the
trial engine as it would without a loop). Asks and tells happen on the calling thread only; each trial runs on a thread
of its own (it mostly waits on a server), under its heartbeat. While trials are in flight the sampler (TPE with
constant liar) sees them as RUNNING and proposes away from them; a proposal equal to a config in flight is told
FAIL as a duplicate and never runs twice; the local steps skip configs in flight.

A slot is a key (the host and its GPUs, tunectl/wiring/slots.py): the trial records it as its host, so a later run finds
the trials a dead coordinator left on each slot. `evaluate_on(key, n, params, role, should_prune)` runs trial n
on that slot; it must not raise for a failure of the server or host (the trial engine never does). A slot whose
trials end as infra faults RETIRE_AFTER_INFRA times in a row (its port held by a stranger, its GPUs dirty) takes no
more trials in this run; the search goes on on the others (with every slot retired it stops).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import optuna
from tunectl.search.loop import MAX_DUPLICATES, Hooks, SearchLoop
from tunectl.search.sampler import MAX_VETOES
from tunectl.search.steps import counted
from tunectl.search.study import HostState, fail_running, fail_stale, queued

from tunectl.models import LevelResult, TrialResult
from tunectl.profile import Profile

EvaluateOn = Callable[[str, int, dict[str, Any], str, Callable[[LevelResult], bool] | None], TrialResult]


class _Inline:
    """One slot: `submit` runs the trial on the calling thread and hands back its finished future. An exception,
    an interrupt included, goes to the caller at once, before the trial counts as in flight."""

    def submit(self, fn: Callable[..., TrialResult], *args: Any) -> Future[TrialResult]:
        fut: Future[TrialResult] = Future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


@dataclass
class Flight:
    trial: optuna.trial.Trial
    params: dict[str, Any]
    role: str
    pruner: Any
    key: str


class ParallelLoop(SearchLoop):
    def __init__(self, study: optuna.Study, prof: Profile, hooks: Hooks, states: dict[str, HostState],
                 evaluate_on: EvaluateOn, heartbeat_s: float = 10.0, seed: int | None = 0):
        keys = list(states)
        super().__init__(study, prof, hooks, keys[0], states[keys[0]], heartbeat_s=heartbeat_s, seed=seed)
        self.keys, self.states, self.evaluate_on = keys, states, evaluate_on
        self.free = list(keys)
        self.flights: dict[Future[TrialResult], Flight] = {}
        self.pool: ThreadPoolExecutor | _Inline = (
            ThreadPoolExecutor(max_workers=len(keys), thread_name_prefix="tunectl-slot") if len(keys) > 1
            else _Inline())

    @property
    def width(self) -> int:
        return len(self.keys)

    def search(self, n_trials: int) -> None:
        def more() -> bool:
            return sum(counted(t) for t in self.trials()) < n_trials or self._waiting()

        dup_run = veto_run = 0
        with self._interruptible():
            while True:
                while self.free and more():
                    fail_stale(self.study, self.hostless)
                    self._maybe_local_step()
                    trial = self._ask(self.free[0])
                    if self._veto(trial):
                        veto_run = (veto_run + 1) % MAX_VETOES
                        stuck = veto_run == 0       # the sampler keeps proposing what the vetoes drop
                    else:
                        veto_run = 0
                        if self._launch(trial):
                            dup_run = 0
                            continue
                        dup_run += 1
                        stuck = dup_run >= MAX_DUPLICATES   # ... or what ran or is in flight
                    if not stuck or self._step_off():
                        continue
                    if not self.flights:
                        self._exhausted()
                        return
                    break                          # wait for a result: it changes what the sampler proposes
                if not self.flights:
                    self.stats.retired = not self.free      # every slot out of the run: no finalist can run either
                    return
                self._land()

    def drain(self) -> None:
        """The finalists' reruns, as many at once as there are slots."""
        with self._interruptible():
            while True:
                while self.free and self._waiting():
                    fail_stale(self.study, self.hostless)
                    trial = self._ask(self.free[0])
                    if not queued(trial):
                        trial.set_user_attr("unused", True)
                        fail_running(self.study, self.study.trials[trial.number])
                        continue
                    self._launch(trial)
                if not self.flights:
                    return
                self._land()

    def _launch(self, trial: optuna.trial.Trial) -> bool:
        """Start the trial on the first free slot; False for a duplicate (told, not run)."""
        begun = self.begin(trial)
        if begun is None:
            return False
        params, role = begun
        key = self.free.pop(0)
        pruner = self.pruner(trial, role)
        self.states[key].set(trial.number)
        fut = self.pool.submit(self.evaluate, trial, params, role, pruner, functools.partial(self.evaluate_on, key))
        self.flights[fut] = Flight(trial, params, role, pruner, key)
        return True

    def _land(self) -> None:
        """Wait for the first trial in flight to end; tell it and free its slot."""
        done, _ = wait(list(self.flights), return_when=FIRST_COMPLETED)
        for fut in sorted(done, key=lambda f: self.flights[f].trial.number):
            f = self.flights.pop(fut)
            result = fut.result()
            self.states[f.key].clear()
            if not self._retires(f.key, result):  # a retired slot takes no more trials: the others go on
                self.free = [k for k in self.keys if k in self.free or k == f.key]
            self.finish(f.trial, f.params, f.role, result, f.pruner)

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Interrupted (Ctrl-C, an error): tear down every trial in flight (hooks.cleanup) and leave them RUNNING
        in the study, as a dead coordinator would; the next run re-queues them."""
        for f in list(self.flights.values()):
            if self.hooks.cleanup is not None:
                self.hooks.cleanup(f.trial.number)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
