"""GPU slots and many trials at once: the slots a profile gives, the stand-in refusing a GPU in use, a study on
8 simulated GPUs at 2 per trial running 4 servers at once and never two on one GPU (from the launch records),
proposals in flight never run twice, and kill -9 of the coordinator with 4 trials in flight."""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.helpers.ports import free_port
from tests.search.conftest import make_profile
from tunectl import REPO_ROOT
from tunectl.errors import UsageError
from tunectl.profile import Profile, load_profile
from tunectl.runners.hosts.base import ProcHandle
from tunectl.runners.hosts.local import LocalRunner
from tunectl.search.space import config_key
from tunectl.wiring.slots import gpus_per_trial, make_slots
from tunectl.store import StudyStore, read_json

SLOTS_PROFILE = Path(REPO_ROOT) / "profiles" / "parallel-sim-llama70b-8xh100.yaml"


def fast_profile(tmp_path: Path, **over: Any) -> Path:
    """The shipped 8-GPU slots profile on free ports, a short ladder, one finalist rerun."""
    data = yaml.safe_load(SLOTS_PROFILE.read_text())
    data["host"]["workdir"] = str(tmp_path / "host")
    data["server"]["port"] = free_port()
    data["bench"]["levels"] = [1, 32]
    data["search"]["finalists"] = {"top_k": 1, "reruns": 1}
    data.update(over)
    path = tmp_path / "slots.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def overlaps(records: list[dict[str, Any]]) -> int:
    """The most servers alive at one instant, from the launch records' start and stop times."""
    edges = sorted([(r["server_started_at"], 1) for r in records] + [(r["server_stopped_at"], -1) for r in records],
                   key=lambda e: (e[0], e[1]))
    return max(itertools.accumulate(d for _, d in edges), default=0)


def records(store: StudyStore) -> list[dict[str, Any]]:
    out = []
    for p in sorted(store.dir.glob("trials/*/slot.json")):
        rec = read_json(p)
        if "server_started_at" in rec and "server_stopped_at" in rec:
            out.append(rec)
    return out


def told(store: StudyStore, name: str) -> int:
    """Trials the coordinator has told COMPLETE so far (0 before the study exists)."""
    if not (store.dir / "study.db").exists():
        return 0
    try:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{store.dir / 'study.db'}")
    except KeyError:
        return 0
    return sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))


# ---------------------------------------------------------------------------------------------- slots


def test_eight_gpus_at_tp_2_are_four_slots_with_their_own_gpus_and_ports() -> None:
    prof = load_profile(SLOTS_PROFILE)
    slots = make_slots(prof, [LocalRunner()])
    assert [s.gpus for s in slots] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    base = prof.server.port
    assert [s.port for s in slots] == [base, base + 10, base + 20, base + 30] or all(
        base + 10 * i <= s.port < base + 10 * (i + 1) for i, s in enumerate(slots))   # moved up if taken
    assert [s.profile.host.gpus for s in slots] == [s.gpus for s in slots]
    assert len({s.key for s in slots}) == 4
    assert len(make_slots(prof, [LocalRunner()], limit=2)) == 2


def test_the_trial_size_comes_from_the_parallel_flags_or_the_profile() -> None:
    assert gpus_per_trial(make_profile(server__flags={"tp-size": 4, "dp-size": 2})) == 8
    assert gpus_per_trial(make_profile(server__flags={"tp-size": 4, "dp-size": 2, "enable-dp-attention": True})) == 4
    spaced = make_profile(server__flags={}, search__space={"tp-size": {"type": "int", "choices": [1, 2, 4]}})
    assert gpus_per_trial(spaced) == 4                         # a slot must fit the largest the search may pick
    assert gpus_per_trial(make_profile(server__gpus_per_trial=3)) == 3


def test_too_few_gpus_is_one_line_naming_the_field() -> None:
    prof = make_profile(host__gpus=[0, 1], server__flags={"tp-size": 4})
    with pytest.raises(UsageError, match=r"host.gpus: local offers 2 GPUs \(\[0, 1\]\) but a trial needs 4"):
        make_slots(prof, [LocalRunner()])


def test_a_profile_without_gpus_is_one_slot_unchanged() -> None:
    prof = make_profile()                                      # the GLM-5 card: 8 GPUs, tp-size 8
    [slot] = make_slots(prof, [LocalRunner()])
    assert slot.gpus is None and slot.profile.host.gpus is None and slot.port == prof.server.port


# ---------------------------------------------------------------------------------------------- the stand-in


def _sim(tmp_path: Path, name: str, gpus: str, tp: int = 2) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "TUNECTL_SIM_GPU_DIR": str(tmp_path / "gpus")}
    argv = [sys.executable, "-m", "tunectl.sim.launch_server", "--model-path", "m", "--tp-size", str(tp),
            "--port", str(free_port()), "--sim-card", "llama33-70b-fp8-2x-h100", "--sim-time-scale", "0.01"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "wb"),
                            start_new_session=True)


def test_the_stand_in_refuses_a_gpu_another_server_holds(tmp_path: Path) -> None:
    first = _sim(tmp_path, "first", "2,3")
    try:
        deadline = time.monotonic() + 60
        while "Init torch distributed begin" not in (tmp_path / "first.log").read_text():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        second = _sim(tmp_path, "second", "3,4")
        assert second.wait(60) != 0
        log = (tmp_path / "second.log").read_text()
        assert f"GPU 3 is in use: process {first.pid}" in log
        third = _sim(tmp_path, "third", "5", tp=2)               # fewer GPUs than the server spans
        assert third.wait(60) != 0
        assert "invalid device ordinal" in (tmp_path / "third.log").read_text()
        assert first.poll() is None                             # the first server is untouched
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)


# ---------------------------------------------------------------------------------------------- a study


def search_cli(prof: Path, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tunectl", "search", "-p", str(prof), "--results", str(root), "--study", "par",
            "--json", *extra]


@pytest.mark.slow
def test_eight_gpus_run_four_trials_at_once_never_two_on_one_gpu(tmp_path: Path) -> None:
    done = subprocess.run(search_cli(fast_profile(tmp_path), tmp_path / "r", "-n", "8"), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    store = StudyStore("par", tmp_path / "r")
    recs = records(store)
    assert len(recs) >= 9                                       # 8 search trials and a finalist's rerun
    assert overlaps(recs) == 4                                  # 4 slots, all busy at once
    for gpu in range(8):                                        # never two servers on one GPU
        assert overlaps([r for r in recs if gpu in r["gpus"]]) <= 1
    for r in recs:                                              # each launch was given its slot's GPUs and port
        launch = read_json(store.trial_dir(r["trial"]) / "launch.json")
        assert launch["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, r["gpus"]))
        assert launch["port"] == r["port"]
        assert "fired up" in (store.trial_dir(r["trial"]) / "server.log").read_text()
    assert {r["slot"] for r in recs} == {0, 1, 2, 3}


def test_a_proposal_equal_to_one_in_flight_never_runs_twice(tmp_path: Path) -> None:
    from tunectl.wiring.study import run_search
    from tunectl.wiring.virtual import VirtualEvaluator

    prof: Profile = make_profile(search__finalists={"top_k": 0, "reruns": 0})
    virtual = VirtualEvaluator(prof)
    in_flight: list[int] = []
    most = [0]
    four_up = threading.Event()                               # the first fill: four asked before any is told

    def slow(n: int, params: dict[str, Any], role: str, prune: Any) -> Any:
        in_flight.append(n)
        most[0] = max(most[0], len(in_flight))
        if len(in_flight) == 4:
            four_up.set()
        four_up.wait(timeout=60)
        time.sleep(0.05)
        try:
            return virtual(n, params, role, prune)
        finally:
            in_flight.remove(n)

    out = run_search(prof, trials=24, root=tmp_path, evaluate=slow, parallel=4, heartbeat_s=1)
    study = optuna.load_study(study_name=prof.name, storage=out.storage.replace("<redacted>", ""))
    ran = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
           and "duplicate_of" not in t.user_attrs and t.user_attrs.get("role") in ("search", "baseline")]
    assert len(ran) == 24 and most[0] == 4
    keys = [config_key(t.params) for t in ran]
    assert len(set(keys)) == len(keys)                          # no config run twice
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_of_the_coordinator_with_four_in_flight_requeues_them_and_keeps_the_rest(tmp_path: Path) -> None:
    prof, root = fast_profile(tmp_path), tmp_path / "r"
    store = StudyStore("par", root)
    proc = subprocess.Popen(search_cli(prof, root, "-n", "10"), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:                                             # two trials done, four servers up
            recs = [read_json(p) for p in store.dir.glob("trials/*/slot.json")]
            live = [r for r in recs if "server_started_at" in r and "server_stopped_at" not in r]
            if len(live) == 4 and told(store, "par") >= 2:
                break
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    storage = f"sqlite:///{store.dir / 'study.db'}"
    kept = {t.number: t.values for t in optuna.load_study(study_name="par", storage=storage).trials
            if t.state == TrialState.COMPLETE}
    running = [t.number for t in optuna.load_study(study_name="par", storage=storage).trials
               if t.state == TrialState.RUNNING]
    assert kept and running
    again = subprocess.run(search_cli(prof, root, "-n", "10"), cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    trials = optuna.load_study(study_name="par", storage=storage).trials
    assert {n: trials[n].values for n in kept} == kept          # nothing that finished is lost
    assert any(trials[n].state == TrialState.FAIL for n in running)
    for n in running:                                           # each trial in flight ran again with its params,
        retry = [t for t in trials if t.user_attrs.get("retry_of") == n]
        record = read_json(store.trial_dir(n) / "trial.json")
        if trials[n].state == TrialState.COMPLETE:              # unless its final record was written before the
            assert record["status"] != "interrupted" and not retry     # kill: then it is told from that record
            continue                                            # (tunectl/wiring/recovery.py `tell_recorded`)
        assert trials[n].state == TrialState.FAIL and len(retry) == 1 and retry[0].params == trials[n].params
        assert record["status"] == "interrupted"
        if (store.trial_dir(n) / "launch.json").exists():   # its server's whole log, fetched as it was stopped
            assert "Init torch distributed begin" in (store.trial_dir(n) / "server.log").read_text()
    runner = LocalRunner()
    for p in store.dir.glob("trials/*/launch.json"):            # every server any trial started is gone
        plan = json.loads(p.read_text())
        h = ProcHandle.for_dir(plan["run_id"], plan["trial_dir"])
        raw = Path(h.pgid_path).read_text().strip() if Path(h.pgid_path).exists() else ""
        h.pgid = int(raw) if raw.isdigit() else None
        assert not runner.group_processes(h)


def test_a_slot_whose_launches_keep_failing_is_retired_and_the_others_go_on(tmp_path: Path) -> None:
    from tunectl.models import CrashInfo, TrialResult
    from tunectl.search.loop import RETIRE_AFTER_INFRA, Hooks
    from tunectl.search.parallel import ParallelLoop
    from tunectl.search.sampler import make_sampler
    from tunectl.search.steps import finished
    from tunectl.search.study import HostState
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = make_profile(search__finalists={"top_k": 0, "reruns": 0})
    virtual, used, events = VirtualEvaluator(prof), {"good": 0, "bad": 0}, []

    def evaluate_on(key: str, n: int, params: dict[str, Any], role: str, prune: Any) -> TrialResult:
        used[key] += 1
        time.sleep(0.1)
        if key == "bad":                                      # e.g. its port is held by someone else's server
            return TrialResult(trial=n, status="infra", params=params, crash=CrashInfo(
                cls="infra", signature="HostDirtyError", phase="startup", message="port 30010 is held by pid 1"))
        return virtual(n, params, role, prune)

    study = optuna.create_study(sampler=make_sampler(prof.search, 0))
    states = {k: HostState(tmp_path / "hosts", k) for k in ("bad", "good")}
    loop = ParallelLoop(study, prof, Hooks(evaluate=virtual, on_event=lambda k, d: events.append((k, d))),
                        states, evaluate_on, heartbeat_s=1)
    loop.ensure_baseline()
    loop.search(6)
    loop.close()
    assert used["bad"] == RETIRE_AFTER_INFRA                  # retired after its third infra fault in a row
    assert [d["slot"] for k, d in events if k == "slot_retired"] == ["bad"]
    assert len(finished(study.trials)) == 6                  # the good slot ran the whole budget, retries included


def test_the_live_view_lists_every_trial_in_flight() -> None:
    from rich.console import Console

    from tunectl.commands.search import Progress

    view = Progress(10)
    for n, gpus in ((3, "0,1"), (4, "2,3")):
        view.on_event("trial_start", {"n": n, "role": "search", "params": {"max-running-requests": n * 64},
                                      "slot": f"local:gpus={gpus}", "done": 1})
    view.on_event("level", {"n": 4, "slot": "local#1", "level": {"concurrency": 8, "status": "ok",
                                                                 "metrics": {"output_throughput": 512.0}}})

    def shown() -> str:
        out = Console(record=True, width=100)
        out.print(view.render())
        return out.export_text()

    text = shown()
    assert "1/10 done, 2 running" in text
    assert "trial 3" in text and "on local gpus 0,1" in text and "max-running-requests=192" in text
    assert "trial 4" in text and "on local gpus 2,3  c=8 ok 512 tok/s" in text
    view.on_event("trial_end", {"n": 3, "role": "search", "reason": "ok", "values": [700.0], "feasible": True,
                                "best": 700.0})
    text = shown()
    assert "2/10 done, 1 running" in text and "trial 3" not in text and "best     700 output tok/s" in text
