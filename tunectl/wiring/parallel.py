"""The trial engine on every slot of every host: what `run_search` drives, one trial per slot at a time.

`Fleet(prof, runners, store, evaluate, on_event, width)`:
- with real runners (no `evaluate`): the slots of tunectl/wiring/slots.py, at most `width`; each slot's trials run
  through tunectl/wiring/trial.py with the slot's profile (its GPUs, port) on its host's runner, and write a launch
  record `trials/<n>/slot.json` (host, slot, GPUs, port, when the server started and stopped);
- with an `evaluate` (the virtual model, tests): `width` slots that all call it.
Every trial's files are written by this process into its own results/<study>/ as the trial runs (the server's log
is read through the host's runner), so a study over many hosts has one place for all results.

`loop(...)` is search/parallel.py's `ParallelLoop` over the slots, one slot included (the sequential search).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tunectl.errors import TunectlError
from tunectl.models import LevelResult, TrialResult
from tunectl.profile import Profile
from tunectl.search.loop import Evaluate, Hooks
from tunectl.search.parallel import ParallelLoop
from tunectl.search.study import HostState, WorkerLock, claim_host
from tunectl.wiring.slots import Slot, gpus_per_trial, host_key, make_slots
from tunectl.store import StudyStore, read_json, write_json

Event = Callable[[str, dict[str, Any]], None]
Prune = Callable[[LevelResult], bool] | None


def trial_engine(prof: Profile, runner: Any, store: StudyStore, on_event: Event | None) -> Evaluate:
    from tunectl.wiring.trial import TrialContext, run_trial

    if prof.host.kind == "slurm":                       # a job per trial, the trial inside it (docs/slurm.md)
        from tunectl.wiring import slurm_trials

        levels = prof.bench.levels
        return slurm_trials.engine(prof, runner, store, on_event, levels[len(levels) // 2:] if len(levels) > 3
                                   else None)
    ctx = TrialContext(prof, runner, store)
    # A finalist's rerun is a fresh launch driven through the upper half of the ladder: where load-dependent
    # crashes fire and where the best level lies; the low levels confirm nothing new.
    levels = prof.bench.levels
    confirm = TrialContext(prof, runner, store, levels=levels[len(levels) // 2:] if len(levels) > 3 else None)

    def evaluate(n: int, params: dict[str, Any], role: str, should_prune: Prune) -> TrialResult:
        relay = (lambda kind, data: on_event(kind, {"n": n, **data})) if on_event else None
        return run_trial(confirm if role == "finalist" else ctx, n, params, role, relay, should_prune)

    return evaluate


def stop_leftover(runner: Any, store: StudyStore, n: int, grace_s: float = 5.0, remove: bool = False) -> None:
    """Tear down the server trial n left behind (by its recorded process group and run id, never by name) and
    bring its whole server log into results/ (a dead coordinator kept only what it had read). `remove` (a dead
    worker's trial, at resume): then remove its host trial directory, once its server is gone."""
    from tunectl.runners.checks import hostcheck
    from tunectl.runners.hosts.base import ProcHandle
    from tunectl.wiring.slurm_trials import is_slurm, stop_job

    if is_slurm(runner):                                # its job, cancelled by id; its files read back
        return stop_job(runner, store, n)
    launch = store.trial_dir(n) / "launch.json"
    if not launch.exists():
        return
    plan = read_json(launch)
    if not plan.get("run_id") or not plan.get("trial_dir"):
        return
    handle = ProcHandle.for_dir(plan["run_id"], plan["trial_dir"])
    raw = runner.read_file(handle.pgid_path).strip()
    handle.pgid = int(raw) if raw.isdigit() else None
    hostcheck.terminate(runner, {n: handle}, grace_s)
    log = runner.read_file(handle.log_path)            # the whole log, into results/ (it may be on another host)
    if len(log) > (store.log_path(n).stat().st_size if store.log_path(n).exists() else 0):
        store.write_log(n, log.decode(errors="replace"))
    if remove and not runner.group_processes(handle):  # its server is gone: so is what it left on the host (its
        with contextlib.suppress(ValueError, TunectlError):        # `env` holds the profile's secrets in clear)
            # the launch wrapper's last write (its exit code) can land just after the group first looked empty,
            # as in the teardown: once more if the tree was still being written to while it went
            for _ in range(2):
                runner.remove_tree(plan["trial_dir"])
                if not runner.exists(plan["trial_dir"]):
                    break
                time.sleep(0.5)


class Abandoned(Exception):
    """Raised inside a trial's thread once the coordinator gave the trial up (Ctrl-C): its teardown runs."""


def slot_path(store: StudyStore, n: int) -> Path:
    return store.trial_dir(n) / "slot.json"


class Fleet:
    def __init__(self, prof: Profile, runners: list[Any], store: StudyStore, evaluate: Evaluate | None,
                 on_event: Event | None, width: int | None, spawn: Callable[[Profile], Any] | None = None):
        """`spawn(slot_profile)`: a runner of its own for each further slot of a host (its own SSH link, so one
        slot's link trouble or traffic never stalls another's); closed by `close()`. None: slots share their
        host's runner."""
        self.prof, self.runners, self.store, self.on_event = prof, runners, store, on_event
        self.slots: list[Slot] = []
        self.spawned: list[Any] = []
        self._by_trial: dict[int, Any] = {}        # trial -> the runner its server is on
        self._abandoned: set[int] = set()
        self._lock = threading.Lock()
        if evaluate is not None or not runners:
            name = runners[0].name if runners else "virtual"
            n = max(1, width or 1)
            self.keys = [host_key(prof, name)] if n == 1 else [f"{name}:slot={i}" for i in range(n)]
            self._evaluate = {k: evaluate for k in self.keys}
            self._runner = {k: (runners[0] if runners else None) for k in self.keys}
        else:
            if prof.host.kind == "slurm":
                from tunectl.wiring.slurm_trials import job_slots

                self.slots = job_slots(prof, runners[0], width)
            else:
                self.slots = make_slots(prof, runners, width)
            for slot in self.slots:
                if spawn is not None and slot.index > 0:
                    slot.runner = spawn(slot.profile)
                    self.spawned.append(slot.runner)
            self.keys = [s.key for s in self.slots]
            self._evaluate = {s.key: self._on_slot(s) for s in self.slots}
            self._runner = {s.key: s.runner for s in self.slots}
            if width is not None and width > len(self.slots) and on_event is not None:   # said, not silent
                on_event("parallel_capped", {"asked": width, "slots": len(self.slots),
                                             "gpus_per_trial": gpus_per_trial(prof)})

    def close(self) -> None:
        for r in self.spawned:
            r.close()

    @property
    def width(self) -> int:
        return len(self.keys)

    def first(self) -> tuple[Profile, Any]:
        """The profile and runner the study's identity is taken from (the first host)."""
        return (self.slots[0].profile, self.slots[0].runner) if self.slots else (
            self.prof, self.runners[0] if self.runners else None)

    def hosts(self) -> list[tuple[Profile, Any]]:
        """One (slot profile, runner) per host, for the checks before a study."""
        seen: dict[int, tuple[Profile, Any]] = {}
        for s in self.slots:
            seen.setdefault(s.host, (s.profile, s.runner))
        return list(seen.values()) or [(self.prof, r) for r in self.runners[:1]]

    def claim(self, url: str, lock_dir: Path, study: str) -> list[WorkerLock]:
        locks: list[WorkerLock] = []
        try:
            for key in self.keys:
                locks.append(claim_host(url, lock_dir, study, key))
        except BaseException:
            for lock in locks:
                lock.release()
            raise
        return locks

    def cleanup_for(self, key: str) -> Callable[[int], None] | None:
        runner = self._runner[key]
        return None if runner is None else (lambda n: stop_leftover(runner, self.store, n, remove=True))

    def cleanup(self, n: int) -> None:
        """Give trial n up: its thread stops at its next step (tearing its server down), and a server it left is
        stopped by its process group now."""
        self._abandoned.add(n)
        runner = self._by_trial.get(n) or self._runner[self.keys[0]]
        if runner is not None:
            stop_leftover(runner, self.store, n)

    def evaluate_on(self, key: str, n: int, params: dict[str, Any], role: str, prune: Prune) -> TrialResult:
        with self._lock:
            self._by_trial[n] = self._runner[key]
        evaluate = self._evaluate[key]
        assert evaluate is not None
        return evaluate(n, params, role, prune)

    def _on_slot(self, slot: Slot) -> Evaluate:
        """The slot's trial engine, writing each trial's launch record as its server starts and stops."""
        records: dict[int, dict[str, Any]] = {}

        def relay(kind: str, data: dict[str, Any]) -> None:
            if data.get("n") in self._abandoned:
                raise Abandoned(f"trial {data['n']} given up")
            rec = records.get(data.get("n", -1))
            if rec is not None and kind in ("launch", "teardown"):
                rec["server_started_at" if kind == "launch" else "server_stopped_at"] = time.time()
                write_json(slot_path(self.store, rec["trial"]), rec)
            if self.on_event is not None:
                self.on_event(kind, {**data, "slot": slot.label})

        engine = trial_engine(slot.profile, slot.runner, self.store, relay)

        def evaluate(n: int, params: dict[str, Any], role: str, prune: Prune) -> TrialResult:
            if n in self._abandoned:
                raise Abandoned(f"trial {n} given up")
            rec = records[n] = {"trial": n, **slot.record(), "key": slot.key, "started_at": time.time()}
            write_json(slot_path(self.store, n), rec)
            try:
                result = engine(n, params, role, prune)
            finally:
                records.pop(n, None)
            rec.update(finished_at=time.time(), status=result.status)
            write_json(slot_path(self.store, n), rec)
            return result

        return evaluate

    def loop(self, study: optuna.Study, hooks: Hooks, states: dict[str, HostState], heartbeat_s: float,
             seed: int | None) -> ParallelLoop:
        """The search's loop over every slot (one slot: the sequential search, trials on the calling thread)."""
        return ParallelLoop(study, self.prof, hooks, states, self.evaluate_on, heartbeat_s=heartbeat_s, seed=seed)
