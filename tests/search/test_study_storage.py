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
             f"sqlite:///{tmp_path}/no/such/dir/x.db": (1, "cannot connect")}
    for url, (code, said) in cases.items():
        res = subprocess.run([sys.executable, "-m", "tunectl", "search", "--virtual", "--trials", "2", "--study", "s",
                              "--storage", url, "--results", str(tmp_path / "r")], capture_output=True, text=True,
                             timeout=120, check=False)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == code and len(lines) == 1 and said in lines[0], (url, res.stderr)
        assert "pw" not in res.stderr                     # the password never printed
