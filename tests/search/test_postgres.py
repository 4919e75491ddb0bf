"""Two workers share one study through a real PostgreSQL (started here: initdb into a temp dir, pg_ctl on a free
port on 127.0.0.1 as a non-root user) with no duplicate trials and never two trials on one host at once."""
from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers.ports import free_port
from tunectl.reports.data import load_study, winner_number
from tunectl.search.study import host_of
from tunectl.store import StudyStore

ROOT = Path(__file__).resolve().parents[2]
NAME = "search-test"


def pg_bin(tool: str) -> str | None:
    found = shutil.which(tool) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"))), None)
    return found


def as_db_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    if shutil.which("runuser") is None:
        pytest.skip("running as root and no runuser to drop to the postgres user")
    return ["runuser", "-u", "postgres", "--", *argv]


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    base = Path(tempfile.mkdtemp(prefix="tunectl-pg-"))
    data, port = base / "data", free_port()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    run = lambda argv: subprocess.run(as_db_user(argv), check=True, capture_output=True, timeout=120)
    run([initdb, "-D", str(data), "-U", "tunectl", "--auth=trust", "-E", "UTF8"])
    run([pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "-o",
         f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={base}", "start"])
    try:
        subprocess.run(as_db_user([pg_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(port),
                                   "-U", "tunectl", "optuna"]), check=True, capture_output=True, timeout=60)
        yield f"postgresql+psycopg2://tunectl@127.0.0.1:{port}/optuna"
    finally:
        subprocess.run(as_db_user([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True,
                       check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.postgres
@pytest.mark.slow
def test_two_workers_share_one_study_without_duplicates(postgres: str, tmp_path: Path) -> None:
    budget = 12
    workers = [subprocess.Popen([sys.executable, "-m", "tests.search._harness", str(tmp_path / f"w{gpu}"),
                                 str(budget), postgres, str(gpu)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for gpu in (0, 1)]
    outs = [w.communicate(timeout=240) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [o[1][-1500:] for o in outs]

    trials = optuna.load_study(study_name=NAME, storage=postgres).trials
    hosts = {host_of(t) for t in trials if t.state != TrialState.WAITING}
    assert len(hosts) == 2, "both workers ran trials of the one study"
    searched = [t for t in trials if t.user_attrs.get("role") in ("search", "baseline")
                and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    keys = [str(sorted(t.params.items())) for t in searched]
    assert len(keys) == len(set(keys)), "no config evaluated twice across workers"
    assert budget <= len(searched) <= budget + 1   # one in-flight trial may finish after the other saw the budget
    assert sum(t.user_attrs.get("role") == "baseline" for t in trials) == 1
    # one winner, one number: each worker's results folder holds only its own trials, yet both name the same winner
    # with the same confirmed value (from the study's storage, after every rerun of the race finished)
    numbers = [winner_number(load_study(StudyStore(NAME, tmp_path / f"w{gpu}"))) for gpu in (0, 1)]
    assert numbers[0] is not None and numbers[0]["n"] >= 2
    assert [(n["trial"], n["value"], n["runs"]) for n in numbers if n] == [(numbers[0]["trial"], numbers[0]["value"],
                                                                            numbers[0]["runs"])] * 2
    for host in hosts:   # never two trials on one host at once
        spans = sorted((t.datetime_start, t.datetime_complete) for t in trials
                       if host_of(t) == host and t.datetime_complete)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


@pytest.mark.postgres
def test_the_readmes_postgresql_url_works_as_written(postgres: str, tmp_path: Path) -> None:
    url = postgres.replace("postgresql+psycopg2://", "postgresql://")       # no driver named, as the README writes it
    res = subprocess.run([sys.executable, "-m", "tunectl", "search", "--virtual", "--trials", "2", "--json",
                          "--study", "readme-url", "--storage", url, "--results", str(tmp_path)],
                         capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert optuna.load_study(study_name="readme-url", storage=postgres).trials


@pytest.mark.postgres
@pytest.mark.slow
def test_a_worker_killed_mid_trial_has_its_trial_taken_over_by_the_other(postgres: str, tmp_path: Path) -> None:
    """kill -9 of one worker mid-trial: its trial stops beating, and the other worker (another host, same study)
    fails it once the heartbeat is stale, runs its params again and finishes the budget; it leaves the dead worker's
    server alone (another host's process group), which the dead worker's own rerun tears down."""
    from tests.search.test_resume import harness, kill_9_at_trial, leftover
    from tunectl.runners.hosts.local import LocalRunner
    from tunectl.store import StudyStore

    port = postgres.rsplit(":", 1)[1].split("/")[0]
    subprocess.run(as_db_user([pg_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", port, "-U", "tunectl",
                               "takeover"]), check=True, capture_output=True, timeout=60)
    postgres = postgres.rsplit("/", 1)[0] + "/takeover"      # a database of its own: the study name is the harness's
    budget, runner = 8, LocalRunner()
    store_a = StudyStore(NAME, tmp_path / "a")
    running = kill_9_at_trial(store_a, harness(tmp_path / "a", budget, postgres, "0"), 2)
    orphan = leftover(store_a, running)
    assert runner.group_processes(orphan)
    time.sleep(3.5)                             # past the grace period (3 heartbeats of 1 s): the trial is stale
    b = subprocess.run(harness(tmp_path / "b", budget, postgres, "1"), cwd=ROOT, capture_output=True, text=True,
                       check=False, timeout=240)
    assert b.returncode == 0, b.stderr[-2000:]

    trials = optuna.load_study(study_name=NAME, storage=postgres).trials
    killed = trials[running]
    assert killed.state == TrialState.FAIL and killed.user_attrs.get("role") in ("search", "baseline")
    retry = [t for t in trials if t.user_attrs.get("retry_of") == running]
    assert len(retry) == 1 and retry[0].params == killed.params
    assert retry[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert host_of(retry[0]) != host_of(killed)          # the other worker ran it
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    searched = [t for t in trials if t.user_attrs.get("role") in ("search", "baseline")
                and "duplicate_of" not in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(searched) == budget
    assert runner.group_processes(orphan), "a worker never kills another host's server"

    again = subprocess.run(harness(tmp_path / "a", budget, postgres, "0"), cwd=ROOT, capture_output=True, text=True,
                           check=False, timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not runner.group_processes(orphan), "the dead worker's rerun tears its own server down"
