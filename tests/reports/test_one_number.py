"""One number for the winner in every view: the search's closing lines, `best`, `studies`, `trials`, `diff` and the
report (summary, trial table, finalists) print the same value: the study's objective, the mean over the fresh
launches the finalists' race confirmed the winner on (a real virtual search with the stand-in's noise on)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunectl.reports.data import load_study, winner_number
from tunectl.reports.render import compute, render
from tunectl.store import StudyStore

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}


def tunectl(root: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tunectl", *args, "--results", str(root)], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("one-number")
    closing = tunectl(root, "search", "--virtual", "--trials", "16")
    return root, closing


def test_every_view_prints_the_winners_confirmed_value(searched: tuple[Path, str]) -> None:
    root, closing = searched
    store = StudyStore("sim-glm5", root)
    best = store.read_best()["best"]
    assert best["launches"] >= 2 and best["race"]["spent"] <= best["race"]["budget"]
    one = f"{best['confirmed_value']:,.1f}"
    single = f"{best['value']:,.1f}"
    assert one != single                      # noise on: the search's single reading is not the winner's number
    assert f"best: trial {best['trial']}, {one} output tok/s" in closing
    assert f"# sim-glm5: trial {best['trial']}, {one} output tok/s" in tunectl(root, "best")
    assert f"{one} output tok/s" in tunectl(root, "studies")
    assert one in tunectl(root, "trials")
    assert f"{one} output tok/s (mean of" in tunectl(root, "diff", "sim-glm5", "sim-glm5:0")
    data = load_study(store)
    number = winner_number(data)
    assert number is not None and f"{number['value']:,.1f}" == one
    r = compute(data)
    page = render(r)
    assert f"<b>{one} output tok/s" in page                                  # the summary
    assert any(row["confirmed"] == number["value"] for row in r["trials"] if row["trial"] == best["trial"])
    assert next(g for g in r["finalists"] if g["search_trial"] == best["trial"])["mean_output_throughput"] == \
        number["value"]
    assert f"<td>{one}</td>" in page                                         # trial table and finalists


def test_the_closing_lines_name_the_race(searched: tuple[Path, str]) -> None:
    _, closing = searched
    assert "race:" in closing and "reruns" in closing


def test_the_baseline_has_one_number_too(searched: tuple[Path, str]) -> None:
    """The baseline is relaunched after the race: the gain's denominator, the race table and `diff` all give the mean
    of its launches, not its first reading."""
    root, closing = searched
    best = StudyStore("sim-glm5", root).read_best()
    base = next(v for v in best["finalists"] if v["trial"] == 0)
    assert base["launches"] >= 2
    mean = f"{base['score']:,.1f}"
    assert f"the baseline ({mean})" in closing
    assert f"{mean} output tok/s (mean of {base['launches']} launches)" in tunectl(root, "diff", "sim-glm5",
                                                                                   "sim-glm5:0")


def test_a_capacity_studys_finalists_read_in_its_objective(tmp_path: Path) -> None:
    """A goodput study: every finalist run, its mean and its range are capacities in req/s, as the headline says
    (they were each run's peak tok/s beside a mean in req/s), and the winner's probes are listed by request rate
    (they all read "concurrency 0")."""
    prof = str(REPO / "profiles" / "sim-glm5-goodput.yaml")
    closing = tunectl(tmp_path, "search", "--virtual", "--trials", "6", "-p", prof)
    data = load_study(StudyStore("sim-glm5-goodput", tmp_path))
    number = winner_number(data)
    assert number is not None and number["unit"] == "req/s capacity"
    group = next(g for g in compute(data)["finalists"] if g["search_trial"] == number["trial"])
    runs = [r["output_throughput"] for r in group["runs"] if r["status"] == "ok"]
    assert len(runs) == number["n"] and abs(sum(runs) / len(runs) - number["value"]) < 1e-6
    assert (min(runs), max(runs)) == (number["min"], number["max"]) and max(runs) < 100     # req/s, not tok/s
    assert "reruns on fresh launches (req/s capacity)" in closing
    assert f"{number['min']:.3g}-{number['max']:.3g}" in closing
    assert "the request rates probed" in closing and "┃ req/s ┃" in closing
    done = [ln for ln in closing.splitlines() if ln.startswith("  trial ") and ": ok, " in ln]
    assert done and all(ln.endswith(" req/s capacity") for ln in done)       # each trial's value as it ended
