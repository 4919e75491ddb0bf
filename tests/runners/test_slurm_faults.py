"""Jobs the cluster ends, not their config, on a real Slurm (slurmctld + slurmd started by the tests): cancelled
from outside (`scancel`), killed by its time limit, on a node taken down and drained. Each is an infra fault,
retried with the same params (its retry waits in the queue while the node is drained: pending shown), never told
to the sampler as the config's. Slow by nature: Slurm's time limits are whole minutes, checked every 30 s."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.runners.test_slurm_search import job_pids, ours_left, records, slurm_profile
from tunectl.profile import load_profile
from tunectl.store import StudyStore, read_json
from tunectl.wiring.study import run_search

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_scancel_time_limit_and_a_downed_node_are_infra_and_retried(tmp_path: Path, slurm) -> None:
    """Three jobs ended by the cluster, not by their config: each trial is an infra fault, retried with the same
    params; its retry waits in the queue while the node is drained (pending shown) and then runs."""
    prof = load_profile(slurm_profile(tmp_path))
    seen: dict[str, str] = {}
    pending: list[dict] = []
    lock = threading.Lock()

    def on_event(kind: str, data: dict) -> None:
        with lock:
            if kind == "pending" and "down" in seen and "resumed" not in seen:
                pending.append(data)
                if len(pending) >= 3:
                    slurm.set_node("resume")
                    seen["resumed"] = ""
            if kind != "job_running":
                return
            job = data["job_id"]
            if "limit" not in seen:                        # the first job: frozen, then its time limit ends it
                seen["limit"] = job
                slurm.cmd("scontrol", "update", f"jobid={job}", "TimeLimit=1")
                threading.Timer(1.0, lambda: [os.kill(p, signal.SIGSTOP) for p in job_pids(job)]).start()
            elif "cancel" not in seen:                     # the second: cancelled from outside
                seen["cancel"] = job
                threading.Timer(1.0, lambda: slurm.cmd("scancel", job)).start()
            elif "down" not in seen and "timed_out" in seen:   # after the time limit: the node goes down
                seen["down"] = job                             # and stays drained until the retry has waited
                threading.Timer(1.0, lambda: (slurm.set_node("down"), slurm.set_node("drain"))).start()

    def on_all(kind: str, data: dict) -> None:
        if kind == "trial_end" and data["result"].crash and data["result"].crash.signature == "slurm_timeout":
            seen["timed_out"] = ""
        on_event(kind, data)

    try:
        out = run_search(prof, trials=4, study_name="faults", root=tmp_path / "results", parallel=2,
                         on_event=on_all)
    finally:
        slurm.set_node("resume")
    store = StudyStore("faults", tmp_path / "results")
    by_job = {r["job_id"]: (n, r) for n, r in records(store).items()}
    study = optuna.load_study(study_name="faults", storage=f"sqlite:///{store.dir / 'study.db'}")
    for what, state in (("limit", "TIMEOUT"), ("cancel", "CANCELLED"), ("down", "NODE_FAIL")):
        n, rec = by_job[seen[what]]
        assert rec["state"].startswith(state), rec
        trial = read_json(store.trial_dir(n) / "trial.json")
        assert trial["status"] == "infra" and trial["crash"]["cls"] == "infra"
        assert trial["crash"]["signature"] == f"slurm_{state.lower()}"
        kept = sorted(p.name for p in Path(rec["dir"]).iterdir())        # the evidence, not the secrets
        assert "slurm.out" in kept and "server.log" in kept and not {"spec.json", "env"} & set(kept)
        t = study.trials[n]
        assert t.state == TrialState.FAIL and t.user_attrs.get("infra_fault")      # never told as the config's
        while t.state == TrialState.FAIL and t.user_attrs.get("infra_fault"):    # (the node's fall may end
            retry = [r for r in study.trials if r.user_attrs.get("retry_of") == t.number]   # a retry too)
            assert len(retry) == 1 and retry[0].params == t.params
            t = retry[0]
        assert t.state == TrialState.COMPLETE, t
    assert len(pending) >= 3 and all(p["pending_s"] >= 0 and p["reason"] not in ("", "None") for p in pending)
    assert out.trials == 4 and ours_left(slurm, "faults") == []
