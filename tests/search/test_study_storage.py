"""Storage-level resume pieces: a trial whose worker stopped beating is failed and its params queued again."""
from __future__ import annotations

import time
from pathlib import Path

import optuna
from optuna.trial import TrialState
from tunectl.search.study import Heartbeat, default_storage_url, open_storage


def test_stale_heartbeat_fails_the_trial_and_requeues_its_params(tmp_path: Path) -> None:
    storage = open_storage(default_storage_url(tmp_path), heartbeat_s=1)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    trial = study.ask()
    trial.suggest_int("max-running-requests", 64, 2048, log=True)
    trial.set_user_attr("role", "search")
    with Heartbeat(storage, trial._trial_id, interval=0.2):
        time.sleep(0.5)                       # a live worker: beating, not stale
    optuna.storages.fail_stale_trials(study)
    assert study.trials[0].state == TrialState.RUNNING
    time.sleep(4.5)                           # the worker died: no beat for longer than the grace period
    optuna.storages.fail_stale_trials(study)
    first, retry = study.trials
    assert first.state == TrialState.FAIL
    assert retry.state == TrialState.WAITING and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["role"] == "search"
    nxt = study.ask()                         # the next ask takes the queued retry, same params
    assert nxt.suggest_int("max-running-requests", 64, 2048, log=True) == first.params["max-running-requests"]


def test_bad_storage_urls_are_one_line(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]                       # nothing listens here once the socket is closed
    cases = {f"postgresql://u:pw@127.0.0.1:{closed}/db": (1, "cannot connect"), "notaurl": (2, "not a database URL"),
             "bogus://x": (2, "cannot open this kind of database"),
             f"sqlite:///{tmp_path}/no/such/dir/x.db": (2, "no/such/dir does not exist; create it first")}
    for url, (code, said) in cases.items():
        res = subprocess.run([sys.executable, "-m", "tunectl", "search", "--virtual", "--trials", "2", "--study", "s",
                              "--storage", url, "--results", str(tmp_path / "r")], capture_output=True, text=True,
                             timeout=120, check=False)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == code and len(lines) == 1 and said in lines[0], (url, res.stderr)
        assert "pw" not in res.stderr                     # the password never printed


def test_a_trial_no_host_claimed_is_failed_and_queued_again(tmp_path: Path) -> None:
    """A worker killed between the ask and recording the trial's host leaves a RUNNING trial no resume finds by
    host and no heartbeat marks stale; the budget counted it forever (a 6-trial search ended with 5). It is failed
    and its params queued again, once older than a live worker's ask takes; a trial with a host is left alone."""
    from tunectl.search.steps import counted
    from tunectl.search.study import HOST_ATTR, fail_hostless

    storage = open_storage(default_storage_url(tmp_path), heartbeat_s=1)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.enqueue_trial({"max-running-requests": 256}, user_attrs={"role": "search", "proposed_by": "repair"})
    orphan = study.ask()                                    # the queued trial, popped; its worker died here
    owned = study.ask()
    owned.set_user_attr(HOST_ATTR, "local:0")
    assert fail_hostless(study, min_age_s=60) == []          # too young: maybe another worker's ask in progress
    running = study.get_trials(deepcopy=False)
    assert not counted(running[orphan.number]) and counted(running[owned.number])
    time.sleep(0.1)
    assert fail_hostless(study, min_age_s=0.05) == [orphan.number]
    trials = study.get_trials(deepcopy=False)
    assert trials[orphan.number].state == TrialState.FAIL and trials[owned.number].state == TrialState.RUNNING
    retry = [t for t in trials if t.user_attrs.get("retry_of") == orphan.number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    assert retry[0].user_attrs["role"] == "search" and retry[0].user_attrs["proposed_by"] == "repair"
    nxt = study.ask()                                       # the retry, with the orphan's queued params
    assert nxt.suggest_int("max-running-requests", 64, 2048, log=True) == 256


def test_a_hostless_trial_is_aged_on_the_worker_s_own_clock(tmp_path: Path) -> None:
    """A trial's start time is stamped on the clock of the worker that asked for it: from a machine whose clock runs
    behind, a trial asked a moment ago looks old. A worker that keeps its own record (`first_seen`) fails a hostless
    trial only once it has itself seen it without a host for `min_age_s`, however old its stamp looks; one whose
    host came in the meantime is left alone, and the record forgets it."""
    from tunectl.search.study import HOST_ATTR, fail_hostless

    storage = open_storage(default_storage_url(tmp_path), heartbeat_s=1)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    orphan, claimed = study.ask(), study.ask()
    time.sleep(0.2)                                         # both stamps look 0.2 s old
    first_seen: dict[int, float] = {}
    assert fail_hostless(study, min_age_s=0.1, first_seen=first_seen) == []      # first seen now: too young
    assert set(first_seen) == {orphan._trial_id, claimed._trial_id}
    claimed.set_user_attr(HOST_ATTR, "local:1")             # its worker named the host after all
    time.sleep(0.15)
    assert fail_hostless(study, min_age_s=0.1, first_seen=first_seen) == [orphan.number]
    assert set(first_seen) == set()                           # the orphan failed, the other claimed
    assert study.get_trials(deepcopy=False)[claimed.number].state == TrialState.RUNNING


def test_a_rerun_after_a_kill_right_after_the_ask_still_runs_the_whole_budget(tmp_path: Path) -> None:
    from tests.search.conftest import make_profile
    from tunectl.wiring.study import run_search
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = make_profile(search__finalists={"top_k": 0})
    run_search(prof, trials=2, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    url = default_storage_url(tmp_path / prof.name)
    orphan = optuna.load_study(study_name=prof.name, storage=url).ask()     # asked, then the worker died
    time.sleep(1.1)
    out = run_search(prof, trials=4, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    assert out.trials == 4
    trials = optuna.load_study(study_name=prof.name, storage=url).trials
    assert trials[orphan.number].state == TrialState.FAIL
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
