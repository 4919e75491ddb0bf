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
    assert "machine" not in tunectl(root, "trials").split("\n", 3)[2]      # no machine column: nothing to tell apart


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


def test_a_race_that_took_the_machines_levels_out_says_so_instead(study: tuple[Path, StudyStore]) -> None:
    """Where the race put the machines on one scale (search/race.py `machine_terms`: its levels in best.json's
    race record), the line names the levels instead of calling the readings not comparable."""
    root, store = study
    runs = store.read_best()["best"]["runs"]
    for t in load_study(store).trials:
        set_machine(store, t.trial, A)
    set_machine(store, runs[-1], B)
    path = store.dir / "best.json"
    saved = path.read_text()
    try:
        doc = json.loads(saved)
        doc["best"]["race"]["machines"] = {A: 0.0, B: -0.1}
        path.write_text(json.dumps(doc))
        head = tunectl(root, "best").splitlines()[0]
        assert f"{B}: trial {runs[-1]}): the race put them on one machine's scale (gpu-9f8e7d6c -9.5% against " \
            "gpu-1a2b3c4d)" in head
        assert "not comparable" not in head
    finally:
        path.write_text(saved)


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
    page = render(compute(data))
    assert f"host virtual, {B}, SGLang" in page
    # the trial tables name each trial's machine (its GPUs' id) once the trials ran on more than one
    assert "<th>machine</th>" in page and page.count("<td>gpu-9f8e7d6c</td>") == 1
    assert page.count("<td>gpu-1a2b3c4d</td>") == sum(1 for t in data.trials if t.trial != best and (t.levels or t.crash))
    table = tunectl(root, "trials")
    row = next(ln for ln in table.splitlines() if ln.split("│")[1:2] and ln.split("│")[1].strip() == str(best))
    assert "machine" in table and "gpu-9f8e7d6c" in row and "gpu-1a2b3c4d" not in row


def test_a_search_resumed_on_another_machine_says_so_once_and_records_each_trials_machine(tmp_path: Path) -> None:
    """The loop records each trial's machine on the study; the first trial on a machine none of the finished
    trials ran on is announced (with which trials ran where), the next ones on it are not. The evaluator is the
    stand-in's virtual clock with the machine a GPU host would report set on its result."""
    import optuna

    from tunectl.profile import load_profile
    from tunectl.search.study import open_storage
    from tunectl.wiring.study import run_search
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = load_profile(REPO / "profiles" / "sim-glm5.yaml")
    prof.search.finalists.top_k = 0
    model = VirtualEvaluator(prof, 0)

    def on(machine: str) -> object:
        def run(n: int, params: dict, role: str, prune: object) -> object:
            res = model(n, params, role, prune)
            res.machine = machine
            return res
        return run

    url = f"sqlite:///{tmp_path / 'study.db'}"
    events: list[tuple[str, dict]] = []
    run_search(prof, trials=4, root=tmp_path, evaluate=on(A), storage_url=url, seed=0,
               on_event=lambda k, d: events.append((k, d)))
    assert not [d for k, d in events if k == "machine_changed"]            # one machine: nothing to say
    run_search(prof, trials=7, root=tmp_path, evaluate=on(B), storage_url=url, seed=0,
               on_event=lambda k, d: events.append((k, d)))
    changed = [d for k, d in events if k == "machine_changed"]
    assert len(changed) == 1 and changed[0]["machine"] == B and list(changed[0]["before"]) == [A]
    study = optuna.load_study(study_name=prof.name, storage=open_storage(url))
    machines = [t.user_attrs.get("machine") for t in study.trials if t.state.is_finished()
                and "duplicate_of" not in t.user_attrs]
    assert machines.count(A) >= 4 and machines.count(B) >= 3 and set(machines) <= {A, B}


def test_the_search_prints_the_machine_change_as_one_line() -> None:
    from tunectl.commands.search import Progress
    from tunectl.commands._common import console

    with console.capture() as cap:
        Progress(10)._on_event("machine_changed", {"n": 19, "machine": B, "before": {A: [0, 1, 2, 3, 5]}})
    line = " ".join(cap.get().split())
    assert line == (f"trial 19 ran on {B}, the study's earlier trials on {A}: trials 0-3, 5: readings from "
                    "different machines are compared (two cards of one model can differ by 20%)")
