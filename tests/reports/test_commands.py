"""tunectl report / trials / best / diff / export on fixture studies, through the real typer app."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
from tunectl.reports.data import load_study
from tunectl.reports.export import frames
from typer.testing import CliRunner

from tests.reports.fixtures import build_search_study
from tunectl.cli import app
from tunectl.profile import load_profile
from tunectl.store import StudyStore, read_json, write_json

REPO = Path(__file__).resolve().parents[2]
K2 = REPO / "profiles" / "k2-thinking-reference.yaml"


def run(root: Path, *args: str):
    res = CliRunner().invoke(app, [*args, "--results", str(root)])
    return res


def test_best_command_reproduces_launch_json_argv_exactly(results_root):
    res = run(results_root, "best", "--format", "command")
    assert res.exit_code == 0, res.output
    store = StudyStore("glm5-search", results_root)        # the most recent study is the default
    launch = read_json(store.trial_dir(store.read_best()["best"]["trial"]) / "launch.json")
    argv = launch["argv"]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("# glm5-search: trial") and "x the baseline (" in lines[0]   # its one number
    assert "needs the SGLang patches flashinfer-cutlass-autotune" in lines[-2]          # and its patch
    assert "not yet confirmed against SGLang's own choice" in lines[1]                 # and how to confirm it
    assert "tunectl confirm --study glm5-search" in lines[1]
    words = shlex.split(lines[-1])
    assert words[:2] == ["SGLANG_API_KEY=${SGLANG_API_KEY}", "NCCL_DEBUG=WARN"]         # the secret stays out
    assert words[2:] == argv
    assert any(" " in a for a in argv) and any('"' in a for a in argv)  # quoting is exercised


def test_best_yaml_is_the_config_file_as_launched_and_json_parses(results_root):
    store = StudyStore("glm5-search", results_root)
    n = store.read_best()["best"]["trial"]
    res = run(results_root, "best", "--study", "glm5-search", "--format", "yaml")
    assert res.exit_code == 0 and res.stdout == (store.trial_dir(n) / "config.yaml").read_text()
    doc = json.loads(run(results_root, "best", "-f", "json").stdout)
    assert doc["trial"] == n and doc["argv"] == read_json(store.trial_dir(n) / "launch.json")["argv"]
    assert doc["env"]["SGLANG_API_KEY"] == "<redacted>"


def test_bad_format_and_unknown_study_are_one_line_errors(results_root):
    res = run(results_root, "best", "--format", "xml")
    assert res.exit_code == 2 and "command, yaml, json" in res.output and "Traceback" not in res.output
    res = run(results_root, "trials", "--study", "nope")
    assert res.exit_code == 2 and "glm5-search" in res.output and len(res.output.strip().splitlines()) == 1


def test_trials_lists_every_trial_with_status(results_root):
    res = CliRunner().invoke(app, ["trials", "--results", str(results_root)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for t in StudyStore("glm5-search", results_root).trials():
        assert f"│ {t.trial:>2} │" in res.stdout or f"│ {t.trial} │" in res.stdout
    assert "load_crash @c=512" in res.stdout and "pruned" in res.stdout
    assert "config_error @startup" in res.stdout and "@c=None" not in res.stdout


def test_diff_two_trials_shows_differing_flags_and_the_crash(results_root):
    res = CliRunner().invoke(app, ["diff", "glm5-search:0", "glm5-search:2", "--results", str(results_root)],
                             terminal_width=250)
    assert res.exit_code == 0, res.output
    assert "max-running-requests" in res.stdout and "flashinfer_cutlass" in res.stdout
    assert "page_table_1_flattened" in res.stdout
    assert "kv-cache-dtype" not in res.stdout          # equal flags hidden without --all
    assert "3 flag(s) differ" in res.stdout


def test_diff_best_against_the_reference_profile(results_root):
    res = CliRunner().invoke(app, ["diff", "glm5-search", str(K2), "--results", str(results_root)],
                             terminal_width=250)
    assert res.exit_code == 0, res.output
    assert "k2-thinking-reference" in res.stdout and "5,816.0" in res.stdout
    assert "2048" in res.stdout and "1024" in res.stdout   # max-running-requests differs


def test_diff_bad_sides_are_one_line_errors(results_root):
    for a in ("glm5-search:99", "missing-study", "glm5-search:x", "nothere.yaml"):
        res = run(results_root, "diff", a, "glm5-search")
        assert res.exit_code == 2 and "Traceback" not in res.output, (a, res.output)


def test_reference_profile_loads_with_its_reported_result():
    prof = load_profile(K2)
    assert prof.reference is not None and prof.reference.output_throughput == 5816
    assert prof.server.flags["disable-cuda-graph"] is True
    assert prof.server.flags["max-running-requests"] == 2048
    assert prof.server.flags["moe-runner-backend"] == "flashinfer_cutlass"
    assert "flashinfer-cutlass-autotune" in prof.server.patches


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_round_trips(results_root, tmp_path, fmt):
    res = run(results_root, "export", "--format", fmt, "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    want = frames(load_study(StudyStore("glm5-search", results_root)))
    for name, df in want.items():
        got = pd.read_csv(tmp_path / f"glm5-search-{name}.csv") if fmt == "csv" else \
            pd.read_parquet(tmp_path / f"glm5-search-{name}.parquet")
        assert list(got.columns) == list(df.columns)
        if fmt == "csv":   # CSV has one spelling for "missing" and no types: compare values
            got, df = (x.astype(object).where(x.notna(), None) for x in (got, df))
        pd.testing.assert_frame_equal(got, df, check_dtype=fmt == "parquet", check_exact=False)
    levels = want["levels"]
    assert set(levels["status"]) >= {"ok", "crashed", "pruned"}
    assert len(levels) == sum(len(t.levels) for t in StudyStore("glm5-search", results_root).trials())


def test_report_writes_a_page_with_working_log_links(results_root, tmp_path):
    out = tmp_path / "elsewhere" / "r.html"
    out.parent.mkdir()
    res = run(results_root, "report", "--study", "glm5-search", "--out", str(out))
    assert res.exit_code == 0, res.output
    page = out.read_text()
    hrefs = [h.split('"', 1)[0] for h in page.split('<a class="log" href="')[1:]]
    assert len(hrefs) == len(StudyStore("glm5-search", results_root).trials())
    assert all((out.parent / h).resolve().is_file() for h in hrefs)
    res = run(results_root, "report", "--study", "sweep-1")
    assert res.exit_code == 0 and (results_root / "sweep-1" / "report.html").is_file()


def test_report_reference_line_only_from_the_study_or_when_asked(results_root, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "sweep.html"
    res = run(results_root, "report", "--study", "sweep-1", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "K2-Thinking" not in out.read_text()      # a reference from another setup is not drawn unasked
    res = run(results_root, "report", "--study", "sweep-1", "--out", str(out), "--reference", str(K2))
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "K2-Thinking reference (5,816 tok/s, as reported)" in page
    flags_section = page.split("<section id='flags'>", 1)[1].split("</section>", 1)[0]
    assert "<th>reference</th>" in flags_section and "flashinfer_cutlass" in flags_section


def test_no_studies_is_one_line(tmp_path):
    res = run(tmp_path / "results", "report")
    assert res.exit_code == 2 and "no studies yet" in res.output and "Traceback" not in res.output
    listed = run(tmp_path / "results", "studies")          # listing none is an answer: exit 0, one line
    assert listed.exit_code == 0 and listed.output.strip().endswith("no studies yet (run `tunectl search` or "
                                                                    "`tunectl sweep` first)"), listed.output


def test_an_api_key_in_the_winners_argv_stays_out_of_the_report(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    n = store.read_best()["best"]["trial"]
    launch = read_json(store.trial_dir(n) / "launch.json")
    launch["argv"] += ["--api-key", "s3cret"]
    write_json(store.trial_dir(n) / "launch.json", launch)
    res = run(tmp_path, "report", "--study", store.name)
    assert res.exit_code == 0, res.output
    page = (store.dir / "report.html").read_text()
    assert "s3cret" not in page and "--api-key &lt;redacted&gt;" in page


def test_export_defaults_to_the_study_folder_and_concurrency_is_the_level(tmp_path, monkeypatch):
    from tests.reports.fixtures import build_sweep

    root, cwd = tmp_path / "results", tmp_path / "cwd"
    store = build_sweep(root, name="s")
    t = store.read_trial(0)
    for lv in t.levels:
        lv.metrics["concurrency"] = lv.concurrency * 0.9            # SGLang's measured concurrency
        store.write_level(0, lv)
    store.write_trial(t)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    res = run(root, "export")
    assert res.exit_code == 0, res.output
    assert not list(cwd.iterdir())                                    # nothing in the current directory
    levels = pd.read_csv(root / "s" / "s-levels.csv")
    assert list(levels["concurrency"]) == [lv.concurrency for lv in t.levels]
    assert list(levels["measured_concurrency"]) == pytest.approx([lv.concurrency * 0.9 for lv in t.levels])


def test_report_open_without_a_browser_says_so(results_root, tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER", "")
    monkeypatch.setattr("webbrowser.open", lambda url, *a, **k: False)
    res = CliRunner().invoke(app, ["report", "--study", "glm5-search", "--out", str(tmp_path / "r.html"), "--open",
                                   "--results", str(results_root)])
    assert res.exit_code == 0 and "no browser found here" in res.output and str(tmp_path / "r.html") in res.output
