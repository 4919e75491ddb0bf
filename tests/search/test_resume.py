"""kill -9 of the harness mid-trial, then the same command again: no completed trial lost, the interrupted trial
re-queued with the same params, and the server it left behind torn down."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tunectl.runners.hosts.base import ProcHandle
from tunectl.runners.hosts.local import LocalRunner
from tunectl.store import StudyStore, read_json

ROOT = Path(__file__).resolve().parents[2]
NAME = "search-test"


def harness(root: Path, trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.search._harness", str(root), str(trials), *extra]


def leftover(store: StudyStore, n: int) -> ProcHandle:
    """Trial n's server (its host directory may be gone: a resume removes a dead worker's once its server is)."""
    plan = read_json(store.trial_dir(n) / "launch.json")
    h = ProcHandle.for_dir(plan["run_id"], plan["trial_dir"])
    pgid = Path(h.pgid_path)
    h.pgid = int(pgid.read_text()) if pgid.exists() else None
    return h


def _read(path: Path) -> str:
    """A host file the worker may remove between the listing and the read (its trial just ended)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def wait_for_trial(store: StudyStore, n: int, limit: float = 60.0) -> None:
    host_files = store.dir / "hosts"
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        running = [text for p in (host_files.glob("*.json") if host_files.is_dir() else []) if (text := _read(p))]
        if running and int(running[0]) >= n and (store.trial_dir(int(running[0])) / "launch.json").exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"trial {n} never started")


def kill_9_at_trial(store: StudyStore, argv: list[str], n: int) -> int:
    """Start the harness, kill -9 it once trial `n` or later has started; the trial it was running."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for_trial(store, n)
        running = int(next((store.dir / "hosts").glob("*.json")).read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return running


@pytest.mark.slow
def test_kill_9_mid_trial_then_rerun_resumes(tmp_path: Path) -> None:
    store = StudyStore(NAME, tmp_path)
    running = kill_9_at_trial(store, harness(tmp_path, 8), 4)
    storage = f"sqlite:///{store.dir / 'study.db'}"
    before = {t.number: t.values for t in optuna.load_study(study_name=NAME, storage=storage).trials
              if t.state == TrialState.COMPLETE}
    orphan = leftover(store, running)
    runner = LocalRunner()
    assert runner.group_processes(orphan), "kill -9 of the harness leaves its server running"

    done = subprocess.run(harness(tmp_path, 8), cwd=ROOT, capture_output=True, text=True, check=False, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]

    assert not runner.group_processes(orphan), "the rerun tears down the server the dead harness left"
    assert not Path(orphan.dir).exists(), "and removes its host directory (its `env` holds secrets in clear)"
    said = re.search(rf"resuming: (\d+) of 8 search trials kept, trial {running} re-queued", done.stdout)
    assert said and int(said.group(1)) >= len(before), done.stdout
    study = optuna.load_study(study_name=NAME, storage=storage)
    trials = study.trials
    assert {n: trials[n].values for n in before} == before                   # no completed trial lost
    killed = trials[running]
    assert killed.state == TrialState.FAIL
    retry = [t for t in trials if t.user_attrs.get("retry_of") == running]
    assert len(retry) == 1 and retry[0].params == killed.params and retry[0].state == TrialState.COMPLETE
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    searched = [t for t in trials if t.user_attrs.get("role") in ("search", "baseline")
                and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(searched) == 8
    for t in trials:   # every server any trial started is gone
        if (store.trial_dir(t.number) / "launch.json").exists():
            assert not runner.group_processes(leftover(store, t.number))


def test_second_worker_on_the_same_host_is_refused(tmp_path: Path) -> None:
    store = StudyStore(NAME, tmp_path)
    first = subprocess.Popen(harness(tmp_path, 6), cwd=ROOT)
    try:
        wait_for_trial(store, 1)
        second = subprocess.run(harness(tmp_path, 6), cwd=ROOT, capture_output=True, text=True, check=False, timeout=60)
        assert second.returncode != 0
        assert "already has a worker" in second.stderr
        assert first.wait(120) == 0
    finally:
        if first.poll() is None:
            first.kill()


def test_a_rerun_says_what_it_does_and_closes_the_interrupted_trial(tmp_path: Path) -> None:
    from tests.search.conftest import make_profile
    from tunectl.models import TrialResult
    from tunectl.wiring.study import close_interrupted, run_search
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = make_profile(search__finalists={"top_k": 1, "reruns": 1})
    said: list[dict] = []

    def run(trials: int) -> None:
        run_search(prof, trials=trials, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0,
                   on_event=lambda kind, d: said.append(d) if kind == "resume" else None)

    run(3)
    run(3)
    run(5)
    assert [(d["mode"], d["kept"]) for d in said] == [("new", 0), ("finished", 3), ("extending", 3)]
    assert said[2]["before"] == 3
    store = StudyStore(prof.name, tmp_path)
    store.write_trial(TrialResult(trial=99, status="running", params={}))
    close_interrupted(store, 99)
    assert store.read_trial(99).status == "interrupted"


def test_a_trial_killed_before_its_first_record_is_closed_from_the_study(tmp_path: Path) -> None:
    """kill -9 between a trial's slot record and its first trial.json: recovery writes it `interrupted` with the
    study's params, so `trials`, the report and `export` list every trial that left files; a trial that left none
    stays out."""
    import optuna

    from tunectl.store import write_json
    from tunectl.wiring.study import close_interrupted

    store = StudyStore("killed", tmp_path)
    study = optuna.create_study(study_name="killed")
    dist = {"chunked_prefill_size": optuna.distributions.CategoricalDistribution([2048, 4096])}
    left, bare = study.ask(dist), study.ask(dist)
    left.set_user_attr("role", "search")
    write_json(store.trial_dir(left.number) / "slot.json", {"trial": left.number, "host": "ssh:box1"})
    for n in (left.number, bare.number):
        close_interrupted(store, n, study)
    assert store.trial_numbers() == [left.number]
    t = store.read_trial(left.number)
    assert (t.status, t.params, t.host, t.role) == ("interrupted", left.params, "ssh:box1", "search")
    assert t.finished_at >= t.started_at > 0


def test_a_rerun_with_an_edited_space_is_one_line_and_leaves_nothing_running(tmp_path: Path) -> None:
    from tests.search.conftest import SPACE, make_profile
    from tunectl.errors import UsageError
    from tunectl.wiring.study import run_search
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = make_profile(search__finalists={"top_k": 1, "reruns": 1})
    run_search(prof, trials=3, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    edited = make_profile(search__finalists={"top_k": 1, "reruns": 1},
                          search__space={**SPACE, "moe-runner-backend": {"type": "categorical",
                                                                         "choices": ["triton", "cutlass"]}})
    with pytest.raises(UsageError, match=r"search.space changed since study .*moe-runner-backend: "
                                         r"choices removed 'flashinfer_cutlass'"):
        run_search(edited, trials=5, root=tmp_path, evaluate=VirtualEvaluator(edited), seed=0)
    storage = f"sqlite:///{tmp_path / prof.name / 'study.db'}"
    states = {t.state for t in optuna.load_study(study_name=prof.name, storage=storage).trials}
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states


def test_a_study_held_in_memory_is_on_disk_after_ctrl_c_and_resumes(tmp_path: Path) -> None:
    """`search --virtual` keeps its study in memory and writes study.db once: on Ctrl-C too, and a rerun resumes
    it as it would a study written trial by trial."""
    from tests.search.conftest import make_profile
    from tunectl.wiring.study import run_search
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = make_profile(search__finalists={"top_k": 1, "reruns": 1})
    said: list[dict] = []

    def on_event(kind: str, d: dict) -> None:
        said.append(d) if kind == "resume" else None
        if kind == "trial_start" and d["n"] == 3:
            raise KeyboardInterrupt                       # Ctrl-C as the fourth trial starts

    with pytest.raises(KeyboardInterrupt):
        run_search(prof, trials=6, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0, on_event=on_event,
                   in_memory=True)
    db = tmp_path / prof.name / "study.db"
    on_disk = optuna.load_study(study_name=prof.name, storage=f"sqlite:///{db}").trials
    assert [t.number for t in on_disk if t.state != TrialState.RUNNING] == [0, 1, 2]
    assert [t.number for t in on_disk if t.state == TrialState.RUNNING] == [3]
    assert not list(db.parent.glob(".study.db.*"))                                     # no scratch file left
    out = run_search(prof, trials=6, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0, in_memory=True,
                     on_event=lambda kind, d: said.append(d) if kind == "resume" else None)
    assert [(d["mode"], d["requeued"]) for d in said] == [("new", []), ("resuming", [3])]
    assert out.trials == 6
    done = optuna.load_study(study_name=prof.name, storage=f"sqlite:///{db}").trials
    assert len(done) > len(on_disk) and not {TrialState.RUNNING, TrialState.WAITING} & {t.state for t in done}
