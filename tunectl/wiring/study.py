"""The one function that wires profile + runner + store + search: `run_search`.

Library code: reports through `on_event(kind, data)`, never prints. The CLI (tunectl/commands/search.py) owns
the console.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tunectl import knobs, redact
from tunectl.wiring import identity, recovery, warmstart
from tunectl.sglang import scopes, versions
from tunectl.sglang.crashes.catalog import CATALOG_VERSION
from tunectl.sglang.crashes.classifier import repairs_for
from tunectl.errors import UsageError
from tunectl.models import TrialResult
from tunectl.objective import value_metric
from tunectl.profile import Profile
from tunectl.runners.checks.readiness import CONFIG_CHECKS, STEPS, Check
from tunectl.search import finalists as fin
from tunectl.search import policy
from tunectl.wiring.parallel import Fleet
from tunectl.search.loop import RETIRE_AFTER_INFRA, Evaluate, Hooks, SearchLoop
from tunectl.search.sampler import make_sampler
from tunectl.search.study import (
    HEARTBEAT_S,
    HostState,
    WorkerLock,
    default_storage_url,
    fail_hostless_at_resume,
    host_of,
    open_storage,
    recover,
)
from tunectl.wiring.storage import held_in_memory, storage_errors, storage_url_for
from tunectl.wiring.slots import hosts_of
from tunectl.store import DEFAULT_ROOT, UNREADABLE, StudyStore, check_name, read_json, running, searching

Event = Callable[[str, dict[str, Any]], None]
HOST_CHECKS = tuple(step.__name__.strip("_") for step in STEPS)


@dataclass
class SearchOutcome:
    study: str
    storage: str
    results_dir: str
    wall_s: float
    trials: int                                    # search trials finished in the study (all workers)
    evaluated: int                                 # trials this worker ran (search + finalists)
    crashed: int
    pruned: int
    duplicates: int
    retries: int
    saved_s: float
    best: dict[str, Any] | None                    # the winner: trial, params, value, ladder, argv, config
    finalists: list[dict[str, Any]] = field(default_factory=list)
    trials_to_best: int | None = None              # search trials until the winner's config was first seen
    exhausted: bool = False
    stopped: str | None = None                     # why the search stopped early: every slot failed as infra
    warm_start: dict[str, Any] | None = None       # tunectl/wiring/warmstart.py: the old study, old best now and before
    slots: int = 1                                 # trials at once (tunectl/wiring/slots.py)
    policy: dict[str, Any] | None = None           # the proposers and vetoes it ran with (search/policy.py)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_runner(prof: Profile) -> Any:
    if prof.host.kind == "ssh":
        from tunectl.runners.hosts.ssh import SSHRunner

        return SSHRunner(prof.host, python=prof.server.python)
    if prof.host.kind == "slurm":
        from tunectl.wiring.slurm_trials import make_runner as slurm_runner

        return slurm_runner(prof)
    from tunectl.runners.hosts.local import LocalRunner

    return LocalRunner()


def gpu_sm(prof: Profile, gpu: str) -> int | None:
    """The GPU's compute capability x 10: the stand-in's card says it; a real host, by its GPU's model name
    (`identity.host_gpu`, as in the study's fingerprint; None when unknown or mixed)."""
    if prof.server.engine == "sim":
        from tunectl.sim.model import load_card

        return load_card(prof.server.sim.card).gpu.sm
    return scopes.sm_of(gpu)


def backend_check(prof: Profile, runner: Any) -> Check:
    """`tunectl check`'s row for the GPU's kernels: fails when the baseline (trial 0) runs a backend this GPU has
    no kernels for (tunectl/sglang/scopes.py `GPU_NEEDS`; it would crash at startup); else names the search space's
    choices the search will never run here (the GPU veto drops them unrun)."""
    from tunectl.search.space import baseline_params

    gpu = identity.host_gpu(prof, runner)[0]
    sm = gpu_sm(prof, gpu)
    if sm is None:
        return Check("backends", True, f"{gpu}: compute capability not known to tunectl, no backend skipped")
    here = f"{gpu} (compute capability {sm // 10}.{sm % 10})"
    base = scopes.flags_lack(knobs.merge(prof, baseline_params(prof))[0], sm)
    if base:
        return Check("backends", False, f"{here}: the baseline (trial 0) would crash: " + "; ".join(base),
                     "set a backend this GPU has in server.flags or as the knob's default")
    skipped = [f"{name} {choice}" for name, spec in prof.search.space.items() for choice in spec.choices or []
               if scopes.gpu_lacks(prof, {name: choice}, sm)]
    return Check("backends", True, f"{here}: " + (f"never runs {', '.join(skipped)} (no kernels for this GPU)"
                                                  if skipped else "every backend choice has kernels"))


def check_same_space(study: optuna.Study, prof: Profile) -> None:
    """A study resumed with an edited search space: one line naming the knob (Optuna would stop mid-trial)."""
    from optuna.distributions import check_distribution_compatibility

    from tunectl.search.space import distribution

    now = {name: distribution(spec) for name, spec in prof.search.space.items()}
    for t in study.get_trials(deepcopy=False):
        for name, old in t.distributions.items():
            if name not in now:
                continue
            try:
                check_distribution_compatibility(old, now[name])
            except ValueError:
                raise UsageError(f"{prof.source or prof.name}: search.space.{name}: changed since study "
                                 f"{study.study_name!r} began (was {old}, now {now[name]}); give this space a new "
                                 "--study NAME, or restore the knob to resume") from None


def close_interrupted(store: StudyStore, n: int, study: optuna.Study | None = None) -> None:
    """A trial a dead worker left `running` in its trial.json is `interrupted` (its config is run again). One killed
    before its first trial.json (its slot or launch record already written) gets an `interrupted` record from the
    study's trial, so every trial that left files is in `trials`, the report and `export`."""
    try:
        t = store.read_trial(n)
    except UNREADABLE:
        d = store.trial_dir(n)
        frozen = next((ft for ft in study.get_trials(deepcopy=False) if ft.number == n), None) if study else None
        if frozen is None or not d.is_dir() or not any(d.iterdir()):
            return
        slot = d / "slot.json"
        host = read_json(slot).get("host") if slot.exists() else None
        now = time.time()
        store.write_trial(TrialResult(trial=n, status="interrupted", params=dict(frozen.params),
                                      host=host or host_of(frozen) or "local", role=fin.role(frozen),
                                      started_at=frozen.datetime_start.timestamp() if frozen.datetime_start else now,
                                      finished_at=now))
        return
    if t.status == "running":
        t.status, t.finished_at = "interrupted", time.time()
        store.write_trial(t)


def resume_info(study: optuna.Study, requeued: list[int], before: int | None, n_trials: int) -> dict[str, Any]:
    """What this run does with the study it opened: new, resumed (kept/re-queued), extended, or already done."""
    from tunectl.search.steps import finished

    kept = len(finished(study.get_trials(deepcopy=False)))
    if not kept and not requeued:
        mode = "new"
    elif kept >= n_trials and not requeued:
        mode = "finished"
    elif before is not None and n_trials > before:
        mode = "extending"
    else:
        mode = "resuming"
    return {"mode": mode, "kept": kept, "requeued": requeued, "trials": n_trials, "before": before}


def preflight(prof: Profile, runner: Any, on_event: Event | None = None,
              only: tuple[str, ...] | None = None) -> None:
    """`tunectl check` before a study or sweep: a missing engine, a renamed flag or an unpatchable install fails
    now, not at trial 17. Leftover processes are not fatal here: recovery has just stopped this study's own, and
    every launch is gated on a clean host anyway (other workers may share a host with their own GPUs)."""
    from tunectl.runners.checks.readiness import ChecksFailed, run_checks

    checks = run_checks(prof, runner, only)
    failed = [c for c in checks if not c.ok and c.name != "leftovers"]
    if on_event:
        on_event("checks", {"passed": sum(c.ok for c in checks), "failed": [c.name for c in failed]})
    if failed:
        raise ChecksFailed(failed)


def run_search(prof: Profile, trials: int | None = None, study_name: str | None = None,
               storage_url: str | None = None, seed: int | None = None, on_event: Event | None = None,
               root: Path | str = DEFAULT_ROOT, evaluate: Evaluate | None = None, runner: Any = None,
               heartbeat_s: int = HEARTBEAT_S, warm_start: str | None = None,
               in_memory: bool = False, parallel: int | None = None) -> SearchOutcome:
    """The study, run to its winner. Runners it makes itself (none given, no `evaluate`: one per host of the
    profile) are closed on every path out (SSH connections, port forwards); a runner given is the caller's to
    close. `parallel`: at most this many trials at once (default: one per GPU slot of the hosts, docs/parallel.md;
    with an `evaluate`, 1). `in_memory`: the study (on its default SQLite file) is held in memory while it runs and
    written once at the end (virtual-clock studies: one worker, thousands of writes in seconds)."""
    args = (prof, trials, study_name, storage_url, seed, on_event, root, evaluate)
    if evaluate is not None or runner is not None:
        return _run_search(*args, [runner] if runner is not None else [], heartbeat_s, warm_start, in_memory,
                           parallel, None)
    own: list[Any] = []
    try:
        for spec in hosts_of(prof):
            own.append(make_runner(prof if spec is prof.host else prof.model_copy(update={"host": spec})))
        return _run_search(*args, own, heartbeat_s, warm_start, in_memory, parallel, make_runner)
    finally:
        for r in own:
            r.close()


def _run_search(prof: Profile, trials: int | None, study_name: str | None, storage_url: str | None,
                seed: int | None, on_event: Event | None, root: Path | str, evaluate: Evaluate | None,
                runners: list[Any], heartbeat_s: int, warm_start: str | None, in_memory: bool,
                parallel: int | None, spawn: Callable[[Profile], Any] | None) -> SearchOutcome:
    started = time.monotonic()
    name = check_name(study_name or prof.name, "--study" if study_name else f"{prof.source or prof.name}: name")
    if warm_start is not None:
        check_name(warm_start, "--warm-start")
    store = StudyStore(name, root)
    ws = _load_warm(warm_start, name, prof, root, storage_url)
    fleet = Fleet(prof, runners, store, evaluate, on_event, parallel, spawn)
    try:
        if evaluate is None:                     # the profile's own mistakes: before a study (or its folder) exists
            for host_prof, runner in fleet.hosts():
                preflight(host_prof, runner, on_event, CONFIG_CHECKS)
        # running: `tunectl check` asks it (this study's servers are not leftovers); searching: a study held in
        # memory (--virtual) runs alone
        with running(store), searching(store, alone=in_memory and storage_url is None):
            return _search(fleet, prof, trials, name, store, ws, storage_url, seed, evaluate, heartbeat_s,
                           in_memory, started)
    finally:
        fleet.close()


def _search(fleet: Fleet, prof: Profile, trials: int | None, name: str, store: StudyStore,
            ws: warmstart.WarmStart | None, storage_url: str | None, seed: int | None, evaluate: Evaluate | None,
            heartbeat_s: int, in_memory: bool, started: float) -> SearchOutcome:
    on_event, runners = fleet.on_event, fleet.runners
    url = storage_url_for(storage_url) if storage_url is not None else default_storage_url(store.dir)
    seed = prof.search.seed if seed is None else seed
    n_trials = trials or prof.search.trials
    fp = identity.of_profile(*fleet.first())
    recorded = store.read_study()        # a damaged study.json: one line before the storage is opened or written
    lock_dir = store.dir / "locks"
    with storage_errors(url):
        host_locks = fleet.claim(url, lock_dir, name)
    try:
        memory_of = store.dir / "study.db" if in_memory and not storage_url else None
        with _open_study(prof, url, store, seed, heartbeat_s, memory_of) as study:
            done = sum(t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL
                       for t in study.get_trials(deepcopy=False))
            if identity.guard(study, recorded, prof, fp, done):
                check_same_space(study, prof)
            before = recorded.get("trials")
            store.write_study({"kind": "search", "storage": redact.url(url), "profile": redact.profile(prof),
                               "trials": n_trials, "seed": seed, "sampler": prof.search.sampler, "identity": fp,
                               "slots": fleet.width})
            hooks = Hooks(evaluate=lambda *a: fleet.evaluate_on(fleet.keys[0], *a),
                          cleanup=fleet.cleanup if runners else None,
                          on_event=on_event, lock=lambda lname: WorkerLock(url, lock_dir, name, lname),
                          repairs=lambda sig, text: versions.resolve_repairs(repairs_for(sig, text),
                                                                             CATALOG_VERSION,
                                                                             prof.server.sglang_version),
                          gpu_sm=gpu_sm(prof, str(fp.get("gpu", ""))))
            states = _resume(study, store, fleet, hooks, (before, n_trials))
            if evaluate is None:                 # the host's state, once this study's leftovers are gone
                for host_prof, runner in fleet.hosts():
                    preflight(host_prof, runner, on_event, tuple(n for n in HOST_CHECKS if n not in CONFIG_CHECKS))
            loop = fleet.loop(study, hooks, states, heartbeat_s, seed)
            if ws is not None:
                warmstart.begin(study, ws, hooks.lock)
            loop.ensure_baseline()
            if ws is not None and not warmstart.has_prior(study):
                loop.search(1)                   # the queue: the old winner and top-k, the baseline, try_first
                added = warmstart.learn(study, ws, prof, hooks.lock)
                if on_event and added:
                    on_event("prior", {"from": ws.study, "trials": added})
            loop.search(n_trials)
            loop.finalists()
            loop.close()
            outcome = summarize(study, prof, loop, store, url, time.monotonic() - started)
            outcome.warm_start, outcome.slots = warmstart.summary(study), fleet.width
        store.write_best(outcome.to_dict())
        return outcome
    finally:
        for lock in host_locks:
            lock.release()


def _load_warm(old: str | None, name: str, prof: Profile, root: Path | str,
               storage_url: str | None) -> warmstart.WarmStart | None:
    if old is None:
        return None
    if old == name:
        raise UsageError(f"--warm-start {old}: the new study needs a name of its own (--study {old}-2)")
    return warmstart.load(old, prof, root, storage_url_for(storage_url) if storage_url is not None else None)


@contextlib.contextmanager
def _open_study(prof: Profile, url: str, store: StudyStore, seed: int, heartbeat_s: int,
                memory_of: Path | None) -> Iterator[optuna.Study]:
    """The study on its storage; with `memory_of` (a SQLite file) held in memory and written there once at the
    end (tunectl/wiring/storage.py `held_in_memory`). A storage that lacks trials the study's files record (an empty or
    corrupt study.db) is refused before anything is written (tunectl/wiring/recovery.py)."""
    name = store.name
    with contextlib.ExitStack() as stack:
        with storage_errors(url), WorkerLock(url, store.dir / "locks", name, "setup"):
            recovery.check_file(url, store, name)
            if memory_of is not None:
                storage = stack.enter_context(held_in_memory(lambda: open_storage(url), name, memory_of))
            else:
                storage = open_storage(url, heartbeat_s)           # one worker creates the schema
            recovery.guard_records(storage, name, store, redact.url(url))
            study = optuna.create_study(
                study_name=name, storage=storage, load_if_exists=True,
                sampler=make_sampler(prof.search, seed, prof.objective.multi_objective),
                directions=["maximize", "minimize"] if prof.objective.multi_objective else ["maximize"])
        yield study


def _resume(study: optuna.Study, store: StudyStore, fleet: Fleet, hooks: Hooks,
            planned: tuple[int | None, int]) -> dict[str, HostState]:
    """Recover what a dead worker left on each slot and say what this run does with the study."""
    states, recovered = {}, []
    if fleet.prof.host.kind == "slurm":                # what the dead run's jobs wrote, first (docs/slurm.md)
        from tunectl.wiring.slurm_trials import read_back

        read_back(study, store, fleet)
    told = set(recovery.tell_recorded(study, store, fleet.prof, fleet.keys))   # finished, killed before telling
    for key in fleet.keys:
        states[key] = HostState(store.dir / "hosts", key)
        recovered += recover(study, key, states[key], fleet.cleanup_for(key))
    recovered += fail_hostless_at_resume(study)         # asked by a worker that died before it named the host
    recovered = [n for n in recovered if n not in told]
    for n in recovered:
        close_interrupted(store, n, study)
    if hooks.on_event:
        hooks.on_event("resume", resume_info(study, sorted(recovered), *planned))
    return states


def _launch_of(store: StudyStore, n: int) -> dict[str, Any]:
    try:
        plan = store.launch(store.read_trial(n)) or {}
    except UNREADABLE:                       # its trial.json too (named by the CLI): best.json without a launch
        plan = {}
    cfg = store.trial_dir(n) / "config.yaml"
    return {"argv": plan.get("argv"), "exec_argv": plan.get("exec_argv"), "config": plan.get("config"),
            "config_file": str(cfg) if cfg.exists() else None, "env": plan.get("env"),
            "patches": plan.get("patches")}


def summarize(study: optuna.Study, prof: Profile, loop: SearchLoop, store: StudyStore, url: str,
              wall_s: float) -> SearchOutcome:
    trials = study.get_trials(deepcopy=False)
    search = [t for t in trials if fin.role(t) in fin.SEARCH_ROLES and "duplicate_of" not in t.user_attrs
              and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    verdicts = loop.stats.verdicts
    win = fin.winner(verdicts)
    cands = fin.candidates(trials)
    best_t = next((t for t in cands if win and t.number == win.trial), None)
    if best_t is None and not verdicts and cands:
        best_t = cands[0]                           # finalists disabled: the best search trial
    best = None
    if best_t is not None:
        measured = win.interval if win else fin.trial_interval(best_t)
        best = {"trial": best_t.number, "params": dict(best_t.params), "value": best_t.values[0],
                "confirmed_value": win.score if win else None,
                "metric": "capacity" if prof.objective.mode == "goodput" else value_metric(prof),
                "ci95": [measured.low, measured.high], "launches": measured.n,
                "launch_spread": win.launch_spread if win else None,
                "ties": fin.ties(verdicts, win) if win else [],
                "runs": [win.trial, *(r["trial"] for r in win.runs if r["feasible"])] if win else [best_t.number],
                "run_values": ([win.search_value, *(r["value"] for r in win.runs if r["feasible"])] if win
                               else [best_t.values[0]]),
                "race": loop.stats.race or None,
                "gain": fin.gain_over(measured, fin.baseline_interval(trials, prof.search.finalists.noise)),
                "ladder": best_t.user_attrs.get("ladder"), "best_concurrency": best_t.user_attrs.get(
                    "best_concurrency"), **_launch_of(store, best_t.number)}
    order = sorted(search, key=lambda t: t.number)
    to_best = next((i + 1 for i, t in enumerate(order) if best and t.params == best["params"]), None)
    return SearchOutcome(
        study=study.study_name, storage=redact.url(url), results_dir=str(store.dir), wall_s=round(wall_s, 2),
        trials=len(search), evaluated=loop.stats.evaluated,
        crashed=sum(t.user_attrs.get("crash_class") is not None for t in search),
        pruned=sum(t.state == optuna.trial.TrialState.PRUNED for t in search),
        duplicates=loop.stats.duplicates, retries=loop.stats.retries, saved_s=round(loop.stats.saved_s, 2),
        best=best, finalists=[v.to_dict() for v in verdicts], trials_to_best=to_best,
        exhausted=loop.stats.exhausted, policy=policy.as_dict(prof.search.policy),
        stopped=(f"every slot ended {RETIRE_AFTER_INFRA} trials in a row as infra faults (the host, not the "
                 f"config): {loop.retired_why}") if loop.stats.retired else None)
