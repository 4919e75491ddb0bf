"""A results folder that is damaged (a study.json or best.json emptied or cut short, a launch.json that is not one, the
winner's trial.json unreadable) or read through a pipe that closes (`| head`): every reader gives one line or a
named warning, never a traceback, never another trial's numbers under the winner's name. The folders are a real
virtual search on the stand-in's model."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bad_input import assert_one_line, invoke

STUDY = "s"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("searched")
    res = invoke("search", "--virtual", "--trials", "12", "--study", STUDY, "--results", str(root))
    assert res.exit_code == 0, res.output
    return root


@pytest.fixture()
def root(searched: Path, tmp_path: Path) -> Path:
    shutil.copytree(searched, tmp_path / "r")
    return tmp_path / "r"


def _best(root: Path) -> dict:
    return json.loads((root / STUDY / "best.json").read_text())["best"]


READERS = [["trials"], ["best"], ["best", "--format", "json"], ["report"], ["export"], ["diff", f"{STUDY}:1", STUDY],
           ["confirm", "--dry-run"], ["search", "--virtual", "--trials", "13", "--study", STUDY]]


@pytest.mark.parametrize("name, damage", [("study.json", ""), ("study.json", "[]"), ("best.json", '{"schema": 1, "be'),
                                          ("best.json", "null")])
def test_a_damaged_study_or_best_record_is_one_line_naming_it(root: Path, name: str, damage: str) -> None:
    """Each reader (and a resumed search) ended in a JSONDecodeError or AttributeError traceback."""
    (root / STUDY / name).write_text(damage)
    before = {p: p.read_bytes() for p in (root / STUDY).rglob("*") if p.is_file()}
    for cmd in READERS:
        if name == "best.json" and cmd[0] == "search":       # the search writes best.json again: nothing to refuse
            continue
        line = assert_one_line(invoke(*cmd, "--results", str(root)), codes=(1,))
        assert f"{root / STUDY / name}: not a readable record" in line, (cmd, line)
    assert {p: p.read_bytes() for p in (root / STUDY).rglob("*") if p.is_file()} == before   # nothing written over
    if name == "best.json":                  # as the line says: the same search writes it again
        assert invoke("search", "--virtual", "--trials", "12", "--study", STUDY, "--results", str(root)).exit_code == 0
        assert invoke("best", "--results", str(root)).exit_code == 0


def test_studies_names_a_damaged_study_and_lists_the_others(root: Path) -> None:
    assert invoke("search", "--virtual", "--trials", "2", "--study", "other", "--results", str(root)).exit_code == 0
    (root / STUDY / "study.json").write_text("{")
    res = invoke("studies", "--results", str(root))
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert f"warning: {root / STUDY / 'study.json'}: not a readable record" in res.stderr
    rows = {ln.split("│")[1].split()[0]: ln for ln in res.stdout.splitlines() if ln.startswith("│")}
    assert set(rows) == {STUDY, "other"} and "?" in rows[STUDY] and "?" not in rows["other"]


def test_studies_names_a_trial_record_its_count_leaves_out(root: Path) -> None:
    (root / STUDY / "trials" / "1" / "trial.json").write_text("{")
    res = invoke("studies", "--results", str(root))
    assert res.exit_code == 0
    assert f"warning: {root / STUDY / 'trials' / '1' / 'trial.json'}: not a trial record" in res.stderr, res.stderr


def test_a_damaged_launch_record_is_named_and_its_trial_records_copy_used(root: Path) -> None:
    """The winner's launch.json emptied: every reader and the resumed search's closing summary raised a traceback
    (the search after running all its trials: no best.json written)."""
    winner = _best(root)["trial"]
    launch = root / STUDY / "trials" / str(winner) / "launch.json"
    launch.write_text("")
    (root / STUDY / "best.json").unlink()
    res = invoke("search", "--virtual", "--trials", "12", "--study", STUDY, "--results", str(root))
    assert res.exit_code == 0, res.output
    assert _best(root)["argv"], "best.json written with the launch from the trial record"
    res = invoke("best", "--results", str(root))
    assert res.exit_code == 0, res.output
    assert f"warning: {launch}: not a launch record (JSONDecodeError" in res.stderr
    assert "--model-path zai-org/GLM-5-NVFP4" in res.stdout.splitlines()[-1]
    assert launch.read_text() == ""


def test_the_winner_unreadable_never_lends_its_numbers_to_another_trial(root: Path) -> None:
    """best.json's winner with its trial.json cut short: `best` named another trial (of another config) with the
    winner's mean, interval and gain, and 'a tie with' a list holding that trial itself."""
    info = _best(root)
    trials = root / STUDY / "trials"
    same = sorted(int(p.parent.name) for p in trials.glob("*/trial.json")
                  if json.loads(p.read_text())["params"] == info["params"])
    assert len(same) > 1, "the race reran the winner"
    (trials / str(info["trial"]) / "trial.json").write_text('{"trial": ')
    doc = json.loads(invoke("best", "--format", "json", "--results", str(root)).stdout)
    assert doc["params"] == info["params"] and doc["trial"] in same       # a rerun of the winner's config
    for n in same:                                                         # no launch of that config readable
        (trials / str(n) / "trial.json").write_text("")
    doc = json.loads(invoke("best", "--format", "json", "--results", str(root)).stdout)
    assert doc["params"] != info["params"]
    number = doc["confirmed"]
    assert number["trial"] == doc["trial"] and doc["trial"] not in number["ties"]
    assert number["value"] != info["confirmed_value"]


def test_diff_names_a_trial_record_it_cannot_read(root: Path) -> None:
    (root / STUDY / "trials" / "3" / "trial.json").write_text("")
    line = assert_one_line(invoke("diff", f"{STUDY}:3", f"{STUDY}:1", "--results", str(root)), codes=(1,))
    assert f"{STUDY}:3: {root / STUDY / 'trials' / '3' / 'trial.json'}: not a trial record" in line, line
    n = max(int(p.name) for p in (root / STUDY / "trials").iterdir())
    line = assert_one_line(invoke("diff", f"{STUDY}:999", f"{STUDY}:1", "--results", str(root)), codes=(2,))
    assert line.endswith(f"has no trial 999; valid: 0-2, 4-{n}"), line      # not every number of a long study


def _into_closed_pipe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe whose reader has already gone (`tunectl ... | head -1` once head exits)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "tunectl", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=300, cwd=cwd, check=False, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    finally:
        os.close(w)


@pytest.mark.parametrize("cmd", [["best"], ["best", "--format", "json"], ["trials"], ["studies"],
                                 ["diff", f"{STUDY}:1", f"{STUDY}:2"]])
def test_a_reader_into_a_closed_pipe_ends_quietly(root: Path, cmd: list[str]) -> None:
    """`tunectl best | head -1` printed "error: Broken pipe" (exit 1): the reader going is not an error."""
    res = _into_closed_pipe(*cmd, "--results", str(root), cwd=root)
    assert res.returncode == 141, (res.returncode, res.stderr)
    assert [ln for ln in res.stderr.splitlines() if not ln.startswith("study: ")] == [], res.stderr


def test_a_search_into_a_closed_pipe_stops_as_on_a_signal_and_resumes(tmp_path: Path) -> None:
    """It stopped in silence with exit 1 (rich's own broken-pipe exit), as if it had failed."""
    res = _into_closed_pipe("search", "--virtual", "--trials", "6", "--study", STUDY, "--results", str(tmp_path),
                            cwd=tmp_path)
    assert res.returncode == 141 and "Traceback" not in res.stderr, (res.returncode, res.stderr)
    kept = len(list((tmp_path / STUDY / "trials").glob("*/trial.json")))
    assert 0 < kept < 6
    res = invoke("search", "--virtual", "--trials", "6", "--study", STUDY, "--results", str(tmp_path))
    assert res.exit_code == 0 and f"{kept} of 6 search trials kept" in res.output, res.output


def test_confirm_dry_run_json_prints_json(root: Path) -> None:
    res = invoke("confirm", "--dry-run", "--json", "--results", str(root))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["dry_run"] and doc["order"] == ["winner", "baseline", "baseline", "winner", "winner", "baseline"]
    assert doc["winner"] == _best(root)["params"] and not (root / f"{STUDY}-confirm").exists()
