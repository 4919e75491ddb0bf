"""`tunectl search --warm-start OLD`: the old winner and top configs run first on the new setup (knobs translated),
the old trials then become the sampler's prior knowledge (role `prior`: never counted, never a finalist or the
winner), and the outcome says "old best on new version: X (was Y)" with the flags whose meaning changed."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from tests.search.conftest import SPACE, make_profile
from tunectl.cli import app
from tunectl.errors import UsageError
from tunectl.profile import default_profile_path
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

OLD = make_profile(search__finalists={"top_k": 1, "reruns": 1})
NEW = make_profile(search__finalists={"top_k": 1, "reruns": 1}, server__sglang_version="0.5.17",
                   search__space={k: v for k, v in SPACE.items() if k != "autotune-patch"})


def _study(root: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / name / 'study.db'}")


@pytest.fixture
def old_study(tmp_path: Path) -> Path:
    run_search(OLD, trials=12, root=tmp_path, evaluate=VirtualEvaluator(OLD), seed=0)
    return tmp_path


def test_the_old_winner_runs_first_and_old_trials_are_prior_knowledge_only(old_study: Path) -> None:
    out = run_search(NEW, trials=8, root=old_study, evaluate=VirtualEvaluator(NEW), seed=0, study_name="new",
                     warm_start="search-test")
    trials = _study(old_study, "new").trials
    first = trials[0]
    best_old = yaml.safe_load((old_study / "search-test" / "best.json").read_text())["best"]
    assert first.user_attrs["proposed_by"] == "warm-start" and first.user_attrs["warm_of"] == best_old["trial"]
    assert first.params == {k: v for k, v in best_old["params"].items() if k != "autotune-patch"}
    prior = [t for t in trials if t.user_attrs.get("role") == "prior"]
    assert prior and all(t.user_attrs["prior_of"].startswith("search-test:") for t in prior)
    assert out.trials == 8                                                  # priors use none of the budget
    assert out.best is not None and out.best["trial"] not in {t.number for t in prior}
    assert not (old_study / "new" / "trials" / str(prior[0].number)).exists()     # not a result on disk
    w = out.warm_start
    assert w is not None and w["from"] == "search-test" and w["sglang_version"] == "0.5.9"
    assert w["old_best_was"] == pytest.approx(best_old["confirmed_value"] or best_old["value"])
    assert w["old_best_trial"] == first.number and w["old_best_now"] == pytest.approx(first.values[0])
    assert any("autotune-patch" in c for c in w["changed_meaning"])


def test_a_rerun_resumes_without_adding_the_prior_twice(old_study: Path) -> None:
    run_search(NEW, trials=6, root=old_study, evaluate=VirtualEvaluator(NEW), seed=0, study_name="new",
               warm_start="search-test")
    count = sum(t.user_attrs.get("role") == "prior" for t in _study(old_study, "new").trials)
    out = run_search(NEW, trials=8, root=old_study, evaluate=VirtualEvaluator(NEW), seed=0, study_name="new",
                     warm_start="search-test")
    assert sum(t.user_attrs.get("role") == "prior" for t in _study(old_study, "new").trials) == count
    assert out.trials == 8


@pytest.mark.parametrize(("study", "old", "said"), [
    ("search-test", "search-test", "needs a name of its own"),
    ("new", "nothing-here", "no search study of that name"),
])
def test_a_wrong_warm_start_is_one_line(old_study: Path, study: str, old: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        run_search(NEW, trials=4, root=old_study, evaluate=VirtualEvaluator(NEW), seed=0, study_name=study,
                   warm_start=old)


def test_the_cli_says_old_best_on_new_version(tmp_path: Path) -> None:
    from tunectl.wiring.migrate import move_profile

    data = yaml.safe_load(default_profile_path().read_text())
    data["search"]["finalists"] = {"top_k": 0, "reruns": 0}
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data))
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(move_profile(data, "0.5.17")[0]))
    base = ["search", "--virtual", "--trials", "6", "--results", str(tmp_path / "r")]
    assert CliRunner().invoke(app, [*base, "-p", str(old)]).exit_code == 0
    res = CliRunner().invoke(app, [*base, "-p", str(new), "--study", "moved", "--warm-start", "sim-glm5"])
    assert res.exit_code == 0, res.output
    assert "old best on new version:" in res.output and "(was " in res.output and "on SGLang 0.5.9" in res.output
    assert "changed meaning: cuda-graph-max-bs: --cuda-graph-max-bs is deprecated in SGLang 0.5.17" in res.output
    listing = CliRunner().invoke(app, ["studies", "--results", str(tmp_path / "r")])
    row = next(line for line in listing.output.splitlines() if "moved" in line)
    assert "0.5.17 (warm from sim-glm5)" in row
    assert "0.5.9 +1 patch(es)" in next(line for line in listing.output.splitlines() if "sim-glm5 " in line)
    assert CliRunner().invoke(app, ["report", "--study", "moved", "--results", str(tmp_path / "r")]).exit_code == 0
    html = (tmp_path / "r" / "moved" / "report.html").read_text()
    assert "warm start from sim-glm5: old best on new version:" in html
