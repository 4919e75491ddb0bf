"""An adversarial user of resuming and concurrent use: a search killed at a moment the other tests do not kill it
(the baseline's relaunch after the race), two searches on one study at once (a --virtual one, which replaces
study.db at its end, beside one that writes it as it goes), and --storage URLs a parser or the redaction did not
expect. Real processes on the SGLang stand-in where a process matters."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers.profiles import fast_default
from tests.test_bad_input import assert_one_line, invoke

REPO = Path(__file__).resolve().parents[1]
STUDY = "s"


def _profile(tmp_path: Path, **finalists: int) -> Path:
    """The embedded default on a free port and a private host workdir, at its own clock, on a short ladder."""
    path, _ = fast_default(tmp_path, time_scale=None)
    data = yaml.safe_load(path.read_text())
    data["bench"]["levels"] = [1, 16, 64, 256]
    data["search"]["finalists"] = finalists or {"reruns": 1, "budget": 2}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _search(prof: Path, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tunectl", "search", "-p", str(prof), "--study", STUDY, "--results", str(root),
            *extra]


def _record(root: Path, n: int) -> dict:
    try:
        return json.loads((root / STUDY / "trials" / str(n) / "trial.json").read_text())
    except (OSError, ValueError):                 # not written yet, or being replaced
        return {}


def _wait(proc: subprocess.Popen, cond, limit: float = 240.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if (found := cond()) is not None:
            return found
        assert proc.poll() is None, f"the search ended (exit {proc.returncode}) before the moment came"
        time.sleep(0.1)
    raise AssertionError("the moment never came")


def _study(root: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{root / STUDY / 'study.db'}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def _leftovers(host: Path) -> list[int]:
    """Process groups recorded under the host workdir that still have a process."""
    alive = []
    for f in host.glob("*/pgid") if host.is_dir() else []:
        try:
            pgid = int(f.read_text())
            os.killpg(pgid, 0)
        except (OSError, ValueError):
            continue
        alive.append(pgid)
    return alive


@pytest.fixture(autouse=True)
def _no_server_left(tmp_path: Path):
    """A failing test (the old code) leaves its servers: stop them by their recorded process group."""
    yield
    for pgid in _leftovers(tmp_path / "host"):
        os.killpg(pgid, signal.SIGKILL)


@pytest.mark.slow
def test_a_baseline_relaunch_killed_mid_run_stays_outside_the_race_budget(tmp_path: Path) -> None:
    """kill -9 during the baseline's relaunch for the gain (after the race), then the same command: the re-queued
    relaunch lost its `gain_baseline` mark, so the race counted it as one of its reruns ("race: 3 of 2 reruns")."""
    prof, root = _profile(tmp_path), tmp_path / "r"
    argv = _search(prof, root, "--trials", "3")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def baseline_relaunch() -> int | None:
            base = _record(root, 0).get("params")
            for d in (root / STUDY / "trials").glob("*") if (root / STUDY / "trials").is_dir() else []:
                rec = _record(root, int(d.name))
                if (rec.get("role") == "finalist" and rec.get("status") == "running" and rec.get("params") == base
                        and (d / "launch.json").exists()):
                    return int(d.name)
            return None
        killed = _wait(proc, baseline_relaunch)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        _stop(proc)
    assert _study(root).trials[killed].user_attrs.get("gain_baseline")
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trials = _study(root).trials
    again = [t for t in trials if t.user_attrs.get("retry_of") == killed]
    assert again and all(t.user_attrs.get("gain_baseline") for t in again), [t.user_attrs for t in again]
    race = json.loads((root / STUDY / "best.json").read_text())["best"]["race"]
    reruns = sum(t.user_attrs.get("role") == "finalist" and t.state != optuna.trial.TrialState.FAIL
                 and not t.user_attrs.get("gain_baseline") for t in trials)
    assert race["spent"] == reruns <= race["budget"], (race, reruns)
    assert not _leftovers(tmp_path / "host")       # the killed relaunch's server was stopped at resume


@pytest.mark.slow
def test_a_virtual_search_refuses_to_run_beside_a_search_of_its_study(tmp_path: Path) -> None:
    """A --virtual search (the study in memory, study.db replaced at its end) on a study a real search was running:
    it ran, wrote trial folders over the other's and replaced study.db under it; the real search then died with a
    traceback ("attempt to write a readonly database") and its trials were gone from the study."""
    prof, root = _profile(tmp_path), tmp_path / "r"
    proc = subprocess.Popen(_search(prof, root, "--trials", "2"), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait(proc, lambda: True if (root / STUDY / "trials" / "1" / "launch.json").exists() else None)
        line = assert_one_line(invoke("search", "--virtual", "--trials", "4", "-p", str(prof), "--study", STUDY,
                                      "--results", str(root)), codes=(2,))
        assert f"study {STUDY!r} has another search running" in line, line
        _, err = proc.communicate(timeout=600)
    finally:
        _stop(proc)
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    records = [_record(root, int(d.name)) for d in (root / STUDY / "trials").iterdir()]
    assert records and all(r.get("status") not in (None, "running", "interrupted") for r in records), records
    complete = [t.number for t in _study(root).trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(_record(root, n).get("status") for n in complete)
    assert (root / STUDY / "best.json").exists() and not _leftovers(tmp_path / "host")


def test_a_search_refuses_to_run_beside_a_virtual_search_of_its_study(tmp_path: Path) -> None:
    prof, root = _profile(tmp_path), tmp_path / "r"
    proc = subprocess.Popen(_search(prof, root, "--virtual", "--trials", "5000"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(proc, lambda: True if _record(root, 2) else None)
        for extra in ((), ("--virtual",)):
            line = assert_one_line(invoke("search", *extra, "--trials", "2", "-p", str(prof), "--study", STUDY,
                                          "--results", str(root)), codes=(2,))
            assert f"study {STUDY!r} has another search running" in line, (extra, line)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 143
    assert not _leftovers(tmp_path / "host")


@pytest.mark.parametrize("url", ["postgresql://tune:S3cr3tPw@[::1", "postgresql://tune:S3cr3tPw@127.0.0.1:abc/db",
                                 "postgresql://tune@127.0.0.1:1/db?password=S3cr3tPw"])
def test_a_storage_url_that_does_not_parse_or_hides_its_password_in_the_query_is_one_line(
        tmp_path: Path, url: str) -> None:
    """A port that is not a number ended in a ValueError traceback (with the password in it); a password given as
    libpq's `?password=` query parameter was printed in clear."""
    line = assert_one_line(invoke("search", "--virtual", "--trials", "2", "--study", STUDY, "--storage", url,
                                  "--results", str(tmp_path)))
    assert "S3cr3tPw" not in line and "--storage" in line, line


def test_a_changed_base_flag_is_refused_at_resume_naming_it(tmp_path: Path) -> None:
    """`server.flags` edited under an existing study (tp-size 8 -> 4: every trial launches with it) extended the
    study silently, ranking TP-4 readings against TP-8 ones under one winner."""
    prof, root = _profile(tmp_path), tmp_path / "r"
    args = ("search", "--virtual", "--trials", "3", "--study", STUDY, "--results", str(root))
    assert invoke(*args, "-p", str(prof)).exit_code == 0
    before = len(_study(root).trials)
    data = yaml.safe_load(prof.read_text())
    data["server"]["flags"]["tp-size"] = 4
    moved = tmp_path / "tp4.yaml"
    moved.write_text(yaml.safe_dump(data, sort_keys=False))
    line = assert_one_line(invoke(*args[:2], "--trials", "5", *args[4:], "-p", str(moved)), codes=(2,))
    assert "base flags tp-size=8 -> tp-size=4" in line and f"--warm-start {STUDY}" in line, line
    assert len(_study(root).trials) == before
    assert invoke(*args[:2], "--trials", "4", *args[4:], "-p", str(prof)).exit_code == 0   # restored: it resumes
