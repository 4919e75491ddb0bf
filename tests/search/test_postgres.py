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
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers.ports import free_port
from tunectl.search.study import host_of

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
