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
