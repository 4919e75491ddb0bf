"""Trials as Slurm jobs, seen from the coordinator (`host.kind: slurm`, docs/slurm.md).

A trial is one batch job (tunectl/runners/hosts/slurm.py `SlurmRunner.submit`) that holds the trial's GPUs and
runs the whole trial on its node (tunectl/wiring/slurm_agent.py). The coordinator writes the job's `spec.json` into
`<shared_dir>/<study>/<run id>/`, submits, and watches the job with squeue/scontrol:
- queued: `pending` events with the time waited and Slurm's reason; no trial deadline runs (the trial's own
  clock starts inside the job);
- running: the job's progress events are relayed to the live view, its levels go to the pruner (a `prune` file
  tells the job to stop its ladder);
- ended: the trial's files are copied from the shared filesystem into `results/<study>/trials/<n>/`, with the
  job record `slurm.json` (job id, node, state, reason, pending and running seconds). A job that the scheduler or
  the machine ended (cancelled from outside, time limit, node failure, preemption) is an infra fault: retried,
  never told to the sampler as the config's. A crash or OOM of the server inside the job is the trial's own
  finding, classified from the server log as on any host.
Giving a trial up (Ctrl-C, SIGTERM) cancels its job by id; a rerun after a dead coordinator finds the dead run's
jobs again by their name and comment (`stop_job`), cancels the running ones (`on_resume: wait`: waits for them)
and reads back what they wrote. Nothing is ever cancelled by name.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunectl.models import CrashInfo, LevelResult, TrialResult
from tunectl.profile import Profile
from tunectl.runners.hosts import slurm_jobs as jobs
from tunectl.runners.hosts.slurm import SlurmRunner
from tunectl.runners.server.plan import make_run_id
from tunectl.store import StudyStore, read_json, write_json

Event = Callable[[str, dict[str, Any]], None]
Prune = Callable[[LevelResult], bool] | None
END_WAIT_S = 60.0                      # a cancelled job's teardown inside it (Slurm's KillWait and the trial's own)


def is_slurm(runner: Any) -> bool:
    return isinstance(runner, SlurmRunner)


def study_dir(runner: SlurmRunner, study: str) -> str:
    return f"{runner.spec.shared_dir}/{re.sub(r'[^A-Za-z0-9_.-]', '_', study)}"


def record_path(store: StudyStore, n: int) -> Path:
    return store.trial_dir(n) / "slurm.json"


class JobTrial:
    """One trial's job: submit, watch, collect."""

    def __init__(self, prof: Profile, runner: SlurmRunner, store: StudyStore, n: int, on_event: Event | None):
        self.prof, self.runner, self.store, self.n, self.on_event = prof, runner, store, n, on_event
        self.run_id = make_run_id(store.name, n)
        self.dir = f"{study_dir(runner, store.name)}/{self.run_id}"
        self.rec: dict[str, Any] = {"trial": n, "run_id": self.run_id, "dir": self.dir}
        self.events_at = 0

    def emit(self, kind: str, **data: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, {"n": self.n, **data})

    def submit(self, params: dict[str, Any], role: str, levels: list[int] | None) -> None:
        spec = {"profile": self.prof.model_dump(mode="json"), "source": str(Path(self.prof.source).resolve())
                if self.prof.source else "", "study": self.store.name, "n": self.n, "params": params,
                "role": role, "levels": levels, "workdir": self.prof.host.workdir}
        self.runner.makedirs(self.dir, 0o700)
        self.runner.write_file(f"{self.dir}/spec.json", json.dumps(spec, default=str).encode(), 0o600)
        python = self.prof.server.python or (f"{self.runner.spec.venv}/bin/python" if self.runner.spec.venv
                                             else sys.executable)
        handle = self.runner.submit([python, "-m", "tunectl.wiring.slurm_agent", f"{self.dir}/spec.json"], self.dir, {},
                                    self.run_id)
        self.job_id = handle.extra["job_id"]
        self.rec.update(job_id=self.job_id, submitted_at=time.time())
        self.save()
        self.emit("submitted", job_id=self.job_id)

    def save(self) -> None:
        write_json(record_path(self.store, self.n), self.rec)

    def watch(self, prune: Prune) -> jobs.JobInfo:
        """Until the job ends: pending shown, progress relayed, levels offered to the pruner."""
        while True:
            info = self.runner.state(self.job_id, fresh=True)
            now = time.time()
            if info.kind == "waiting":
                self.emit("pending", job_id=self.job_id, pending_s=round(now - self.rec["submitted_at"], 1),
                          reason=info.reason)
            elif info.kind == "running" and "started_at" not in self.rec:
                self.rec.update(started_at=now, node=info.node, pending_s=round(now - self.rec["submitted_at"], 2))
                self.save()
                self.emit("job_running", job_id=self.job_id, node=info.node, pending_s=self.rec["pending_s"])
            self.relay(prune)
            if info.kind not in ("waiting", "running"):
                self.relay(prune)
                return info
            time.sleep(self.runner.spec.poll_s)

    def relay(self, prune: Prune) -> None:
        raw = self.runner.read_file(f"{self.dir}/events.jsonl", self.events_at)
        complete = raw[:raw.rfind(b"\n") + 1]
        self.events_at += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            ev = json.loads(line)
            if ev["kind"] == "level" and prune is not None and prune(LevelResult.from_dict(ev["data"]["level"])):
                self.runner.write_file(f"{self.dir}/prune", b"", 0o600)
            self.emit(ev["kind"], **ev["data"])

    def ended(self, timeout: float = END_WAIT_S) -> jobs.JobInfo:
        deadline = time.monotonic() + timeout
        info = self.runner.state(self.job_id, fresh=True)
        while info.kind in ("waiting", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
            info = self.runner.state(self.job_id, fresh=True)
        return info

    def collect(self, info: jobs.JobInfo, params: dict[str, Any], role: str, ours: bool = False) -> TrialResult:
        """The trial's files into results/, and what the trial was: the job's own result, or an infra fault when
        the scheduler or the machine ended the job (`ours`: this run cancelled it: the trial is interrupted)."""
        copy_back(self.dir, self.store, self.n)
        self.rec.update(state=info.state, reason=info.reason, node=info.node or self.rec.get("node", ""),
                        start=info.start, end=info.end, exit_code=info.exit_code, finished_at=time.time())
        self.save()
        try:
            result = self.store.read_trial(self.n)
        except (OSError, ValueError):
            result = TrialResult(trial=self.n, status="infra", params=dict(params), host=self.runner.name,
                                 role=role, started_at=self.rec["submitted_at"], finished_at=time.time())
        ours = ours or self.job_id in jobs.CANCELLED_HERE     # (given up while this thread watched it)
        if ours and info.kind != "done":                 # whatever the trial saw of Slurm's SIGTERM to its server
            result.status, result.crash = "interrupted", None
        elif info.kind == "infra" or result.status in ("running", "interrupted", "infra") or info.kind == "gone":
            result = as_infra(result, info, self.rec, self.runner.read_file(f"{self.dir}/slurm.out")[-400:])
        result.host = f"{self.runner.name}/{self.rec.get('node') or '?'}"
        self.store.write_trial(result)
        if info.kind == "done" and result.status != "infra":
            shutil.rmtree(self.dir, ignore_errors=True)      # everything of it is in results/ now
        else:
            keep_evidence(self.dir)
        return result


def keep_evidence(job_dir: str) -> None:
    """A job the cluster ended keeps its directory (Slurm's slurm.out, the logs) but not the profile's secrets: its
    spec (the profile, server.env) and its env file go."""
    for name in ("spec.json", "env"):
        Path(job_dir, name).unlink(missing_ok=True)


def as_infra(result: TrialResult, info: jobs.JobInfo, rec: dict[str, Any], slurm_out: bytes) -> TrialResult:
    if result.status == "infra" and result.crash is not None and info.kind == "done":
        return result                                       # the job's own infra finding (a dirty node, ...)
    state = info.state.split()[0] if info.state else "GONE"
    result.status = "infra"
    why = f"job {rec.get('job_id')} ended {state}" + (f" ({info.reason})" if info.reason not in ("", "None") else "")
    tail = slurm_out.decode(errors="replace").strip().splitlines()[-1:] if slurm_out else []
    result.crash = CrashInfo(cls="infra", signature=f"slurm_{state.lower()}", phase="scheduler",
                             message=f"{why} on {rec.get('node') or '?'}: the scheduler's or the machine's doing, "
                                     f"not the config's" + (f"; {tail[0]}" if tail else ""))
    return result


def copy_back(job_dir: str, store: StudyStore, n: int) -> None:
    src = Path(job_dir) / "results" / store.name / "trials" / str(n)
    if not src.is_dir():
        return
    dst = store.trial_dir(n)
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, dirs_exist_ok=True)


def engine(prof: Profile, runner: SlurmRunner, store: StudyStore, on_event: Event | None,
           levels: list[int] | None = None) -> Callable[[int, dict[str, Any], str, Prune], TrialResult]:
    """The slot's trial engine: one job per trial. An exception while the job runs (Ctrl-C, the trial given up)
    cancels that job by its id, waits for its teardown and keeps what it wrote, then goes on up."""
    def evaluate(n: int, params: dict[str, Any], role: str, prune: Prune) -> TrialResult:
        job = JobTrial(prof, runner, store, n, on_event)
        job.submit(params, role, levels if role == "finalist" else None)
        try:
            info = job.watch(prune)
        except BaseException:
            jobs.cancel(job.job_id)
            job.collect(job.ended(), params, role, ours=True)
            raise
        return job.collect(job.ended(), params, role)

    return evaluate


def stop_job(runner: SlurmRunner, store: StudyStore, n: int) -> None:
    """What a dead or interrupted run left of trial n: its jobs, found by the record it wrote or else by the name
    and comment tunectl gave them (only jobs whose directory under this study's shared dir names their id), are
    cancelled by id (`on_resume: wait`: awaited) and what they wrote is copied into results/."""
    for job_id, job_dir in _jobs_of(runner, store, n):
        info = runner.state(job_id, fresh=True)
        if info.kind in ("waiting", "running") and runner.spec.on_resume == "cancel":
            jobs.cancel(job_id)
        while info.kind in ("waiting", "running"):
            time.sleep(runner.spec.poll_s if runner.spec.on_resume == "wait" else 0.5)
            info = runner.state(job_id, fresh=True)
        copy_back(job_dir, store, n)
        if (store.trial_dir(n) / "trial.json").exists():
            result = store.read_trial(n)
            if info.kind != "done":                       # stopped, not finished: its config runs again
                result.status, result.crash = "interrupted", None
            result.host = f"{runner.name}/{info.node or '?'}"
            store.write_trial(result)
        rec = read_json(record_path(store, n)) if record_path(store, n).exists() else {"trial": n}
        rec.update(job_id=job_id, dir=job_dir, state=info.state, reason=info.reason, node=info.node,
                   start=info.start, end=info.end, recovered=True)
        write_json(record_path(store, n), rec)
        if info.kind == "done":
            shutil.rmtree(job_dir, ignore_errors=True)    # everything of it is in results/ now
        else:
            keep_evidence(job_dir)


def read_back(study: Any, store: StudyStore, fleet: Any) -> None:
    """At a rerun, before the study's recorded results are told: each trial a dead coordinator left RUNNING on
    these job slots gets what its job wrote (`stop_job`). A job that finished, or that `on_resume: wait` awaited,
    leaves a final trial.json: its result is told, not run again; one cancelled is re-queued."""
    from optuna.trial import TrialState

    from tunectl.search.study import host_of

    runner = next((s.runner for s in fleet.slots if is_slurm(s.runner)), None)
    if runner is None:
        return
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if host_of(t) in fleet.keys:
            stop_job(runner, store, t.number)


def _jobs_of(runner: SlurmRunner, store: StudyStore, n: int) -> list[tuple[str, str]]:
    found: dict[str, str] = {}
    if record_path(store, n).exists():
        rec = read_json(record_path(store, n))
        if rec.get("job_id"):
            found[str(rec["job_id"])] = rec["dir"]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", store.name)[:40] or "study"
    for job_id, _state, name, comment in jobs.mine(f"tunectl.{safe}-t{n}-"):
        run_id = name[len("tunectl."):]
        job_dir = f"{study_dir(runner, store.name)}/{run_id}"
        if comment == f"tunectl:{run_id}" and runner.read_file(f"{job_dir}/job_id").decode().strip() == job_id:
            found.setdefault(job_id, job_dir)
    return list(found.items())


def make_runner(prof: Profile) -> SlurmRunner:
    """The cluster's runner; every job asks for one trial's GPUs (`host.slurm.gpus_per_trial`, else
    `server.gpus_per_trial`, else tp x pp x dp; the stand-in too: it honours the CUDA_VISIBLE_DEVICES Slurm sets)."""
    from tunectl.wiring.slots import gpus_per_trial

    spec = prof.host.slurm
    assert spec is not None
    gpus = spec.gpus_per_trial if spec.gpus_per_trial is not None else gpus_per_trial(prof)
    return SlurmRunner(prof.host, python=prof.server.python, gpus=gpus)


def job_slots(prof: Profile, runner: SlurmRunner, width: int | None) -> list[Any]:
    """`--parallel N`: N jobs in flight (default 1), each slot a place in the queue, not a GPU group: Slurm
    decides where each job runs and which GPUs it holds."""
    from tunectl.wiring.slots import Slot

    class JobSlot(Slot):
        @property
        def key(self) -> str:
            return f"{self.runner.name}:job={self.index}"

        def record(self) -> dict[str, Any]:
            return {"host": self.runner.name, "slot": self.index, "gpus": None, "port": self.port}

    return [JobSlot(0, i, None, prof.server.port, prof, runner) for i in range(max(1, width or 1))]
