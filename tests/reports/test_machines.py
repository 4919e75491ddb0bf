"""A winner whose launches ran on more than one machine says so: the same config read 20% apart on two H100s of one
model at their power limits (docs/real-gpu.md), so a study resumed on another machine mixes machines as well as
configs. Each trial records its machine (TrialResult.machine, from nvidia-smi on the host); the stand-in records
none, so the test writes what a resume on a second GPU host would have recorded into a real virtual study."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunectl.reports.data import load_study, winner_number
from tunectl.store import StudyStore

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
A = "NVIDIA H100 80GB HBM3 x1, 700 W, gpu-1a2b3c4d"
B = "NVIDIA H100 80GB HBM3 x1, 700 W, gpu-9f8e7d6c"


def tunectl(root: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tunectl", *args, "--results", str(root)], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def set_machine(store: StudyStore, n: int, machine: str) -> None:
    path = store.trial_dir(n) / "trial.json"
    rec = json.loads(path.read_text())
    rec["machine"] = machine
    path.write_text(json.dumps(rec))


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StudyStore]:
    root = tmp_path_factory.mktemp("machines")
    tunectl(root, "search", "--virtual", "--trials", "10")
    return root, StudyStore("sim-glm5", root)


def test_launches_on_one_machine_say_nothing(study: tuple[Path, StudyStore]) -> None:
    root, store = study
    for t in load_study(store).trials:
        set_machine(store, t.trial, A)
    number = winner_number(load_study(store))
    assert number is not None and "mixed_machines" not in number
    assert "machines" not in tunectl(root, "best").splitlines()[0]


def test_a_winner_confirmed_on_two_machines_says_which_launch_ran_where(study: tuple[Path, StudyStore]) -> None:
    root, store = study
    runs = store.read_best()["best"]["runs"]
    assert len(runs) >= 2
    for t in load_study(store).trials:
        set_machine(store, t.trial, A)
    set_machine(store, runs[-1], B)                   # the race's last launch, after a resume on another host
    number = winner_number(load_study(store))
    assert number is not None and number["mixed_machines"][B] == [runs[-1]]
    assert runs[0] in number["mixed_machines"][A]
    head = tunectl(root, "best").splitlines()[0]
    assert f"these launches ran on 2 machines ({A}: trial " in head
    assert f"{B}: trial {runs[-1]}): readings from different machines are not comparable" in head
    assert json.loads(tunectl(root, "best", "--format", "json"))["confirmed"]["mixed_machines"][B] == [runs[-1]]


def test_a_baseline_from_before_machines_were_recorded_counts_as_unknown(study: tuple[Path, StudyStore]) -> None:
    root, store = study
    data = load_study(store)
    base = next(t for t in data.trials if t.role == "baseline")
    for t in data.trials:
        set_machine(store, t.trial, "" if t.params == base.params else A)
    number = winner_number(load_study(store))
    assert number is not None and base.trial in number["mixed_machines"]["not recorded"]


def test_the_machine_is_in_the_export_and_beside_the_winner_in_the_report(study: tuple[Path, StudyStore]) -> None:
    from tunectl.reports.export import frames
    from tunectl.reports.render import compute, render

    root, store = study
    best = store.read_best()["best"]["trial"]
    for t in load_study(store).trials:
        set_machine(store, t.trial, B if t.trial == best else A)
    data = load_study(store)
    trials = frames(data)["trials"]
    assert trials.set_index("trial").loc[best, "machine"] == B
    assert (trials["machine"] == A).sum() == len(trials) - 1
    assert f"host virtual, {B}, SGLang" in render(compute(data))
