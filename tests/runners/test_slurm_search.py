"""Searches whose trials are Slurm jobs, on a real Slurm (slurmctld + slurmd started by the tests, a node with 4
fake GPUs) running the stand-in: two jobs at a time, kill -9 of the coordinator, Ctrl-C, a crash inside a job.
Overlap and counts come from the job records (Slurm's own start and end times), not from timings. Jobs ended by the
cluster (scancel, time limit, a downed node): test_slurm_faults.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from tests.runners.slurm_cluster import PARTITION
from tunectl import REPO_ROOT
from tunectl.cli import app
from tunectl.profile import load_profile
from tunectl.store import StudyStore, read_json
from tunectl.wiring.study import run_search

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def slurm_profile(tmp_path: Path, **slurm_kw) -> Path:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "parallel-sim-llama70b-8xh100.yaml").read_text())
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    data["host"] = {"kind": "slurm", "workdir": str(tmp_path / "node"),
                    "slurm": {"shared_dir": str(shared), "partition": PARTITION, "time_limit": "10:00",
                              "poll_s": 0.3, **slurm_kw}}
    data["server"]["port"] = 32000
    data["server"]["sim"]["time_scale"] = 0.01
    data["bench"]["levels"] = [1, 32]
    data["search"]["finalists"] = {"top_k": 0, "reruns": 0}
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def records(store: StudyStore) -> dict[int, dict]:
    return {int(p.parent.name): read_json(p) for p in store.dir.glob("trials/*/slurm.json")}


def spans(recs: dict[int, dict]) -> list[tuple[datetime, datetime]]:
    """Each job's run as Slurm recorded it (StartTime, EndTime)."""
    return [(datetime.fromisoformat(r["start"]), datetime.fromisoformat(r["end"])) for r in recs.values()
            if r.get("start", "Unknown") not in ("Unknown", "", "None") and r.get("end") not in (None, "Unknown", "")]


def most_at_once(runs: list[tuple[datetime, datetime]]) -> int:
    edges = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs], key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def ours_left(slurm, study: str) -> list[str]:
    """The study's jobs still in the queue (by the name tunectl gives them: tunectl.<study>-t<n>-...)."""
    return [r for r in slurm.jobs() if f"|tunectl.{study}-t" in r]


def job_pids(job_id: str) -> list[int]:
    """This machine's processes of a job (SLURM_JOB_ID in their environment): the test freezes them by pid."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job_id}".encode() in env:
                out.append(int(name))
    return out


def ready_to_kill(store: StudyStore) -> list[int]:
    """The two trials whose jobs run while two others are done, else []."""
    recs = records(store)
    running = sorted(n for n, r in recs.items() if "started_at" in r and "state" not in r)
    done = sum(r.get("state") == "COMPLETED" for r in recs.values())
    return running if done >= 2 and len(running) == 2 else []


def default_sigint() -> None:
    """Ctrl-C as a terminal gives it: a suite started in the background of a shell without job control inherits
    SIGINT ignored, and a Python started so never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_six_trials_two_jobs_at_a_time_then_kill_9_and_rerun(tmp_path: Path, slurm) -> None:
    """The dead coordinator's two jobs run on; the rerun (`on_resume: wait`) awaits them and tells the study what
    they wrote: nothing finished is lost, nothing runs twice, no job is left."""
    root, prof = tmp_path / "results", slurm_profile(tmp_path, on_resume="wait")
    store = StudyStore("six", root)
    args = ["search", "-p", str(prof), "-n", "6", "--parallel", "2", "--json", "--study", "six",
            "--results", str(root)]
    err = tmp_path / "coordinator.err"
    proc = subprocess.Popen([sys.executable, "-m", "tunectl", *args], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=open(err, "wb"))
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while True:                                  # two trials done, two jobs running: kill -9
            in_flight = ready_to_kill(store)
            if in_flight:                            # hold the two jobs still so neither ends before the kill
                jobs = [read_json(store.trial_dir(n) / "slurm.json")["job_id"] for n in in_flight]
                frozen = [pid for job in jobs for pid in job_pids(str(job))]
                signal_all(frozen, signal.SIGSTOP)
                if ready_to_kill(store) == in_flight and len(ours_left(slurm, "six")) == 2:
                    break
                signal_all(frozen, signal.SIGCONT)   # one ended meanwhile: wait for the next moment
                frozen = []
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()[-2000:] + slurm.log_tail()
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        signal_all(frozen, signal.SIGCONT)
    storage = f"sqlite:///{store.dir / 'study.db'}"
    kept = {t.number: t.values for t in optuna.load_study(study_name="six", storage=storage).trials
            if t.state == TrialState.COMPLETE}
    assert len(ours_left(slurm, "six")) == 2                      # the dead coordinator's two jobs still run
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, (res.output[-3000:], res.exception)
    assert json.loads(res.stdout[res.stdout.index("{"):])["trials"] == 6
    trials = optuna.load_study(study_name="six", storage=storage).trials
    assert {n: trials[n].values for n in kept} == kept     # nothing finished is lost
    for n in in_flight:                                    # awaited and read back: told, not run again
        assert trials[n].state == TrialState.COMPLETE and not [t for t in trials if t.user_attrs.get("retry_of") == n]
        assert read_json(store.trial_dir(n) / "slurm.json")["recovered"]
    assert ours_left(slurm, "six") == []                   # no job left
    recs = records(store)
    assert most_at_once(spans(recs)) == 2                  # two jobs at a time, never more
    assert all(r["node"] == "n1" and r["job_id"] for r in recs.values())
    for n, r in recs.items():
        if r["state"] == "COMPLETED":
            trial = read_json(store.trial_dir(n) / "trial.json")
            assert trial["status"] == "ok" and "fired up" in (store.trial_dir(n) / "server.log").read_text()
            assert len(list((store.trial_dir(n) / "levels").glob("*.json"))) == 2
            for lv in map(read_json, (store.trial_dir(n) / "levels").glob("*.json")):   # GPU power, read in the job
                power = (lv.get("witness") or {}).get("power") or {}
                assert lv["metrics"].get("gpu_power_w") and power.get("source") == "stand-in", lv.get("witness")


def test_ctrl_c_cancels_its_own_jobs_and_nothing_else(tmp_path: Path, slurm) -> None:
    foreign = slurm.cmd("sbatch", "--parsable", "--job-name=tunectl.someone-else", "--output=/dev/null",
                        "--wrap", "sleep 120").strip()
    root = tmp_path / "results"
    store = StudyStore("intr", root)
    proc = subprocess.Popen([sys.executable, "-m", "tunectl", "search", "-p", str(slurm_profile(tmp_path)), "-n",
                             "4", "--parallel", "2", "--study", "intr", "--results", str(root)], cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while True:                                  # two jobs running: held still so neither ends before Ctrl-C
            running = sorted(n for n, r in records(store).items() if "started_at" in r and "state" not in r)
            if len(running) == 2:
                frozen = [pid for n in running for pid in job_pids(str(records(store)[n]["job_id"]))]
                signal_all(frozen, signal.SIGSTOP)
                if sorted(n for n, r in records(store).items() if "state" not in r) == running:
                    break
                signal_all(frozen, signal.SIGCONT)
                frozen = []
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        in_flight = running
        jobs = {str(records(store)[n]["job_id"]) for n in running}
        proc.send_signal(signal.SIGINT)
        # released once Slurm has the cancel (no longer RUNNING): a cancelled job cannot finish as COMPLETED, and a
        # held server in its own session would not see Slurm's signals
        until = time.monotonic() + 30
        while time.monotonic() < until and any(row.split("|")[0] in jobs and row.split("|")[1] == "RUNNING"
                                               for row in slurm.jobs()):
            time.sleep(0.1)
        signal_all(frozen, signal.SIGCONT)
        assert proc.wait(90) == 130, proc.stderr.read() if proc.stderr else ""
        recs = records(store)
        assert in_flight and all(recs[n]["state"].startswith("CANCELLED") for n in in_flight), recs
        status = {n: read_json(store.trial_dir(n) / "trial.json")["status"] for n in in_flight
                  if (store.trial_dir(n) / "trial.json").exists()}
        assert set(status.values()) <= {"interrupted"}, (status, recs)
        mine = [r["job_id"] for r in recs.values()]
        assert mine and not [j for j in mine if any(row.startswith(f"{j}|") for row in slurm.jobs())]
        assert any(row.startswith(f"{foreign}|RUNNING") for row in slurm.jobs())   # someone else's: untouched
    finally:
        if proc.poll() is None:
            proc.kill()
        signal_all(frozen, signal.SIGCONT)
        slurm.cmd("scancel", foreign, check=False)


def test_a_crash_inside_the_job_is_the_configs_finding(tmp_path: Path, slurm) -> None:
    """A startup OOM of the server inside its job is classified from the server log, as on any host: a crash of
    the config (told to the sampler), not an infra fault; the job itself ended COMPLETED."""
    path = slurm_profile(tmp_path)
    data = yaml.safe_load(path.read_text())
    oom = {"mem-fraction-static": 0.96, "cuda-graph-max-bs": 256}
    data["search"]["try_first"] = [oom]
    path.write_text(yaml.safe_dump(data))
    out = run_search(load_profile(path), trials=2, study_name="oom", root=tmp_path / "results")
    store = StudyStore("oom", tmp_path / "results")
    study = optuna.load_study(study_name="oom", storage=f"sqlite:///{store.dir / 'study.db'}")
    crashed = [t for t in study.trials if oom.items() <= t.params.items()]
    assert len(crashed) == 1 and crashed[0].state == TrialState.COMPLETE and not crashed[0].user_attrs.get(
        "infra_fault")
    n = crashed[0].number
    trial = read_json(store.trial_dir(n) / "trial.json")
    assert trial["status"] == "crashed" and trial["crash"]["signature"] == "cuda_oom_startup"
    assert trial["crash"]["cls"] == "config_error"
    assert "out of memory" in (store.trial_dir(n) / "server.log").read_text().lower()
    assert read_json(store.trial_dir(n) / "slurm.json")["state"] == "COMPLETED"
    assert out.crashed == 1 and ours_left(slurm, "oom") == []


@pytest.mark.parametrize("on_resume,state", [("wait", "COMPLETED"), ("cancel", "CANCELLED")])
def test_a_dead_runs_job_is_found_by_name_and_comment(tmp_path: Path, slurm, on_resume: str, state: str) -> None:
    """Resume finds a job that a dead coordinator submitted but never recorded (no slurm.json): by its name among
    this user's jobs, trusted only when its comment and its directory's job_id agree; awaited or cancelled as the
    profile says, what it wrote read back. A job of the same name that is not the study's is left alone."""
    from tunectl.wiring.slurm_trials import JobTrial, make_runner, record_path, stop_job

    prof = load_profile(slurm_profile(tmp_path, on_resume=on_resume))
    store = StudyStore("dead", tmp_path / "results")
    runner = make_runner(prof)
    job = JobTrial(prof, runner, store, 3, None)
    job.submit({}, "baseline", None)
    record_path(store, 3).unlink()                       # killed before it wrote down its job
    deadline = time.monotonic() + 60
    while b'"launch"' not in Path(job.dir, "events.jsonl").read_bytes() if Path(job.dir, "events.jsonl").exists() \
            else True:                                   # its server is up inside the job
        assert time.monotonic() < deadline
        time.sleep(0.2)
    decoy = slurm.cmd("sbatch", "--parsable", "--job-name=tunectl.dead-t3-decoy", "--comment=tunectl:other",
                      "--output=/dev/null", "--wrap", "sleep 60").strip()
    try:
        stop_job(runner, store, 3)
        rec = read_json(record_path(store, 3))
        assert rec["job_id"] == job.job_id and rec["state"].startswith(state) and rec["recovered"]
        trial = read_json(store.trial_dir(3) / "trial.json")
        assert trial["status"] == ("ok" if on_resume == "wait" else "interrupted")
        assert any(row.startswith(f"{decoy}|") for row in slurm.jobs())
    finally:
        slurm.cmd("scancel", decoy, check=False)
