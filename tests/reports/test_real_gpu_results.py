"""The search tunectl ran against real SGLang 0.5.17 on an H200 (docs/real-gpu.md, docs/real-gpu/results/):
what it recorded still reads the same through today's code: the crash classification of the real logs, the
winner's reproduction command, the finalist verdict, the report."""
from __future__ import annotations

import shlex
from pathlib import Path

from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.sglang.crashes.classifier import LogWatcher, classify
from tunectl.reports.data import load_study
from tunectl.store import StudyStore, read_json

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "real-gpu" / "results"


def test_every_real_log_classifies_as_recorded_and_every_healthy_start_reached_ready() -> None:
    store = StudyStore("h200-search", RESULTS)
    trials = store.trials()
    assert len(trials) == 9
    for t in trials:
        log = (store.trial_dir(t.trial) / "server.log").read_bytes()
        w = LogWatcher.read(log)
        if t.crash is None:
            assert w.ready and not w.crashed, t.trial
        else:                                               # re-read from the real log with today's catalog
            again = classify(log.decode(errors="replace"), t.crash.phase, t.crash.level, t.crash.exit_code)
            assert again is not None and (again.cls, again.signature) == (t.crash.cls, t.crash.signature)
    crashed = [t for t in trials if t.crash is not None]
    assert [(t.crash.signature, t.params["mem-fraction-static"]) for t in crashed] == [("cuda_oom_startup", 0.999)]


def test_the_winner_survived_its_rerun_and_its_command_is_what_was_launched() -> None:
    store = StudyStore("h200-search", RESULTS)
    best = store.read_best()
    n = best["best"]["trial"]
    runs = [t for t in store.trials() if t.params == store.trials()[n].params]
    assert len(runs) == 2 and all(t.crash is None for t in runs)          # search run + finalist rerun
    assert best["finalists"][0]["survived"] and best["finalists"][0]["trial"] == n
    baseline = store.trials()[0].best_output_throughput
    assert min(t.best_output_throughput for t in runs) > 1.5 * baseline   # measured on the H200: 2.1x
    res = CliRunner().invoke(app, ["best", "--study", "h200-search", "--results", str(RESULTS), "-f", "command"])
    assert res.exit_code == 0, res.output
    argv = read_json(store.trial_dir(n) / "launch.json")["argv"]
    words = shlex.split(res.stdout, comments=True)                     # the environment it needs, then argv
    assert words[-len(argv):] == argv and all("=" in w for w in words[:-len(argv)])


def test_the_report_of_the_real_search_has_no_foreign_reference_line(tmp_path: Path) -> None:
    data = load_study(StudyStore("h200-search", RESULTS))
    assert data.reference is None and len(data.trials) == 9
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", "--study", "h200-search", "--results", str(RESULTS), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "CUBLAS_STATUS_ALLOC_FAILED" in page and "K2-Thinking" not in page
