"""`tunectl search` end to end on the real stand-in (server processes, built-in client): the JSON result, and
kill -9 of the harness mid-trial followed by the same command: no completed trial lost, no orphan server."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.helpers.ports import free_port
from tunectl.runners.hosts.base import ProcHandle
from tunectl.runners.hosts.local import LocalRunner
from tunectl.store import StudyStore, read_json

ROOT = Path(__file__).resolve().parents[2]


def small_profile(tmp: Path) -> Path:
    """The embedded default with a short ladder, one finalist rerun, its own port and work dir."""
    data = yaml.safe_load((ROOT / "profiles" / "sim-glm5.yaml").read_text())
    data["bench"]["levels"] = [4, 32, 256]
    data["search"]["finalists"] = {"top_k": 1, "reruns": 1}
    data["server"]["port"] = free_port()
    data["host"]["workdir"] = str(tmp / "hostwork")
    path = tmp / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def search_cmd(profile: Path, trials: int) -> list[str]:
    return [sys.executable, "-c", "from tunectl.cli import app; app()", "search", "--trials", str(trials),
            "--profile", str(profile),
            "--study", "clitest", "--json"]


def server_of(store: StudyStore, n: int) -> ProcHandle:
    plan = read_json(store.trial_dir(n) / "launch.json")
    h = ProcHandle.for_dir(plan["run_id"], plan["trial_dir"])
    raw = Path(h.pgid_path).read_text().strip() if Path(h.pgid_path).exists() else ""
    h.pgid = int(raw) if raw else None
    return h


def wait_mid_ladder(store: StudyStore, proc: subprocess.Popen[bytes], limit: float = 120.0) -> int:
    """The first search trial caught between two ladder levels (a config that crashes at startup has none)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        for n in store.trial_numbers():
            levels = store.trial_dir(n) / "levels"
            if n >= 1 and levels.is_dir() and any(levels.iterdir()) and \
                    read_json(store.trial_dir(n) / "trial.json").get("status") == "running":
                return n
        time.sleep(0.02)
    raise AssertionError(f"no trial caught mid-ladder (harness exit {proc.poll()})")


@pytest.mark.slow
def test_kill_9_mid_trial_on_the_stand_in_then_resume(tmp_path: Path) -> None:
    profile = small_profile(tmp_path)
    store = StudyStore("clitest", tmp_path / "results")
    proc = subprocess.Popen(search_cmd(profile, 3), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        victim = wait_mid_ladder(store, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    runner = LocalRunner()
    orphan = server_of(store, victim)
    assert runner.group_processes(orphan), "the stand-in server outlives the killed harness"
    storage = f"sqlite:///{store.dir / 'study.db'}"
    before = {t.number: t.values for t in optuna.load_study(study_name="clitest", storage=storage).trials
              if t.state == TrialState.COMPLETE}

    done = subprocess.run(search_cmd(profile, 3), cwd=tmp_path, capture_output=True, text=True, check=False,
                          timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)

    assert not runner.group_processes(orphan)
    trials = optuna.load_study(study_name="clitest", storage=storage).trials
    assert {n: trials[n].values for n in before} == before
    assert trials[victim].state == TrialState.FAIL
    retry = [t for t in trials if t.user_attrs.get("retry_of") == victim]
    assert len(retry) == 1 and retry[0].params == trials[victim].params
    assert out["trials"] == 3 and out["best"] is not None
    assert isinstance(out["best"]["argv"], list) and "--max-running-requests" in out["best"]["argv"]
    cfg = Path(out["best"]["config_file"])
    assert (cfg if cfg.is_absolute() else tmp_path / cfg).is_file()
    assert (store.dir / "best.json").exists()
    assert out["finalists"] and out["finalists"][0]["runs"]
    for t in trials:
        if (store.trial_dir(t.number) / "launch.json").exists():
            assert not runner.group_processes(server_of(store, t.number))


def test_a_virtual_study_is_visible_to_best_trials_and_report(tmp_path: Path) -> None:
    def tunectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tunectl", *args, "--results", str(tmp_path)],
                              capture_output=True, text=True, timeout=300, check=False)

    done = tunectl("search", "--virtual", "--trials", "4", "--study", "virt", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    winner = json.loads(done.stdout)["best"]["trial"]
    best = tunectl("best")
    assert best.returncode == 0 and best.stdout.startswith(f"# virt: trial {winner}, "), best.stderr
    trials = tunectl("trials")
    assert trials.returncode == 0 and "virt: " in trials.stdout and "baseline" in trials.stdout
    report = tunectl("report")
    assert report.returncode == 0 and (tmp_path / "virt" / "report.html").is_file(), report.stderr


def test_a_knob_with_no_base_value_is_left_to_sglang_in_the_baseline_and_its_reruns(tmp_path: Path) -> None:
    """A profile that gives a knob no base value: the baseline passes no flag for it (SGLang picks its own), on its
    first launch and on the race's relaunches alike, and `search` says so before it starts; the proposals still
    draw it. With every knob's base value given (the shipped profile) nothing is said."""
    from typer.testing import CliRunner

    from tunectl.cli import app

    data = yaml.safe_load((ROOT / "profiles" / "sim-glm5.yaml").read_text())
    del data["search"]["space"]["chunked-prefill-size"]["default"]
    assert "chunked-prefill-size" not in data["server"]["flags"]
    prof = tmp_path / "unset.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))

    def run(*args: str) -> str:
        res = CliRunner().invoke(app, [*args, "--results", str(tmp_path / "results")], env={"COLUMNS": "250"})
        assert res.exit_code == 0, res.output
        return res.output

    searched = run("search", "--virtual", "--trials", "6", "--profile", str(prof), "--study", "unset")
    assert "baseline: chunked-prefill-size (no `default:` in search.space, no base flag): left to SGLang" in \
        " ".join(searched.split())
    store = StudyStore("unset", tmp_path / "results")
    done = [store.read_trial(int(d.name)) for d in (store.dir / "trials").iterdir()]
    first = store.read_trial(0)
    assert first.role == "baseline" and "chunked-prefill-size" not in first.params
    assert sum(t.params == first.params for t in done) >= 2     # the race relaunched it as it was: no draw
    assert any("chunked-prefill-size" in t.params for t in done if t.role == "search")
    finished = run("best", "--study", "unset")
    assert "drawn by the sampler" not in finished and "has not named a winner" not in finished

    shipped = run("search", "--virtual", "--trials", "3", "--study", "given")
    assert "no `default:`" not in shipped
