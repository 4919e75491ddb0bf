"""The report on what the real search writes: run_search on the stand-in's virtual model (seconds), with an
evaluate hook that records each trial through StudyStore the way the trial engine does. Catches drift between
best.json / study.db / trial files and what the report reads."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tunectl import knobs
from tunectl.cli import app
from tunectl.models import LaunchPlan, TrialResult
from tunectl.profile import Profile
from tunectl.reports.data import load_study
from tunectl.reports.render import compute, render
from tunectl.store import StudyStore, read_json

run_search = pytest.importorskip("tunectl.wiring.study").run_search
virtual = pytest.importorskip("tunectl.wiring.virtual")

PROFILE = {
    "name": "report-e2e", "model": {"path": "zai-org/GLM-5-NVFP4"},
    "server": {"engine": "sim",
               "flags": {"tp-size": 8, "kv-cache-dtype": "fp8_e4m3", "attention-backend": "nsa"}},
    "search": {"trials": 10, "finalists": {"top_k": 2, "reruns": 2}, "space": {
        "disable-cuda-graph": {"type": "bool", "default": False},
        "max-running-requests": {"type": "int", "choices": [64, 256, 1024, 2048], "default": 64},
        "moe-runner-backend": {"type": "categorical", "choices": ["flashinfer_cutlass", "triton"],
                               "default": "flashinfer_cutlass"},
        "mem-fraction-static": {"type": "float", "low": 0.8, "high": 0.94, "step": 0.02, "default": 0.88}}},
    "bench": {"levels": [1, 4, 16, 64, 256, 512]},
}


def _engine(prof: Profile, store: StudyStore):
    evaluate = virtual.VirtualEvaluator(prof)

    def run(n: int, params: dict, role: str, should_prune=None) -> TrialResult:
        flags, env, patches = knobs.merge(prof, params)
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", prof.model.path]
        for k, v in flags.items():
            argv += [f"--{k}"] if v is True else [] if v is False else [f"--{k}", str(v)]
        plan = LaunchPlan(argv=argv, config=flags, env=env, patches=patches, params=dict(params))
        store.write_launch(n, plan, yaml.safe_dump(flags))
        res = evaluate(n, params, role, should_prune)
        res.launch = plan
        for lv in res.levels:
            store.write_level(n, lv)
        store.write_log(n, res.crash.exception_line if res.crash else "")
        store.write_trial(res)
        return res

    return run


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StudyStore]:
    root = tmp_path_factory.mktemp("e2e")
    prof = Profile.model_validate(PROFILE)
    store = StudyStore(prof.name, root)
    run_search(prof, root=root, evaluate=_engine(prof, store))
    return root, store


def test_report_reads_what_the_search_wrote(searched):
    _, store = searched
    best_json = store.read_best()
    r = compute(load_study(store))
    assert r["summary"]["best"]["trial"] == best_json["best"]["trial"]
    assert r["importance"]["method"].startswith("pooled spread")
    assert set(r["importance"]["values"]) <= set(PROFILE["search"]["space"])
    picks = {f["trial"] for f in best_json["finalists"]}
    assert {g["search_trial"] for g in r["finalists"]} == picks
    assert {t["trial"] for t in r["trials"]} == set(store.trial_numbers())
    assert 'id="fig-throughput"' in render(r)


def test_best_command_is_the_winners_launch(searched):
    root, store = searched
    res = CliRunner().invoke(app, ["best", "--study", store.name, "--results", str(root)])
    assert res.exit_code == 0, res.output
    n = store.read_best()["best"]["trial"]
    words = shlex.split(res.stdout, comments=True)
    env = [w for w in words if "=" in w.split("/")[0] and not w.startswith("-")]
    assert words[len(env):] == read_json(store.trial_dir(n) / "launch.json")["argv"]


def test_one_winner_one_number_in_terminal_best_and_report(searched, monkeypatch, capsys):
    import io
    import re

    from rich.console import Console

    from tunectl.commands import _common
    from tunectl.commands import search as search_cmd
    from tunectl.reports.data import winner_number

    root, store = searched
    number = winner_number(load_study(store))
    assert number["n"] >= 3                                  # the search run and at least its two reruns
    shown = f"{number['value']:,.1f} output tok/s (mean of {number['n']} runs"
    term = Console(file=io.StringIO(), width=100, emoji=False)
    monkeypatch.setattr(search_cmd, "console", term)
    monkeypatch.setattr(_common, "console", term)
    search_cmd.show(store.read_best(), root)
    closing = term.file.getvalue() + capsys.readouterr().out
    assert shown in closing and f"{number['gain']:.2f}x the baseline" in closing
    best = CliRunner().invoke(app, ["best", "--study", store.name, "--results", str(root)])
    assert shown in best.stdout and f"{number['gain']:.2f}x the baseline" in best.stdout
    r = compute(load_study(store))
    assert shown in render(r)
    winner = next(g for g in r["finalists"] if g["search_trial"] == number["trial"])
    assert winner["mean_output_throughput"] == pytest.approx(number["value"])
    row = next(line for line in closing.splitlines() if re.match(rf"\W*{number['trial']}\s", line))
    assert f"{number['value']:,.0f}" in row                  # the terminal's finalists table: the same mean
