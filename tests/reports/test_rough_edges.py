"""The report's and the result commands' rough edges: one mark per crash (startup crashes too), top curves that read
apart, a reference column, a small page, integer columns that stay integers, a diff without per-run noise, and a
best command to paste on a GPU host."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pandas as pd
import pytest
from tunectl.reports import figures
from tunectl.reports.data import load_study, throughput_curves
from tunectl.reports.export import frames
from tunectl.reports.render import compute, flag_diff, render
from tunectl.reports.tables import crash_map
from typer.testing import CliRunner

from tests.reports.fixtures import build_search_study, write_trial
from tunectl.cli import app
from tunectl.models import TrialResult
from tunectl.profile import load_profile
from tunectl.store import StudyStore, read_json, write_json


@pytest.fixture(scope="module")
def data(results_root: Path):
    return load_study(StudyStore("glm5-search", results_root))


def _crash_marks(fig) -> list[tuple[str, str]]:
    return [(x, y) for tr in fig.data if tr.marker.symbol == "x" for x, y in zip(tr.x, tr.y)]


def test_one_crash_is_one_mark_and_a_startup_crash_is_on_the_map(data):
    cm = crash_map(data.trials)
    crashed = sorted(t.trial for t in data.trials if t.crash is not None)
    assert [r["trial"] for r in cm["rows"]] == crashed == [2, 4]
    assert {r["trial"]: r["at"] for r in cm["rows"]} == {2: "512", 4: "startup"}
    assert cm["levels"][0] == "startup" and cm["levels"][-1] == "512"
    marks = _crash_marks(figures.crash_map_figure(cm))
    assert len(marks) == len(crashed)                       # not one per parameter row
    assert ("startup", cm["rows"][1]["label"]) in marks
    assert "#4" in cm["rows"][1]["label"] and "moe-runner-backend=triton" in cm["rows"][1]["label"]


def test_top_curves_each_have_their_own_color_marker_and_legend(data):
    tc = throughput_curves(data)
    fig = figures.throughput_figure(tc)
    lines = [tr for tr in fig.data if tr.mode == "lines+markers"]
    assert len(lines) == len(tc["curves"]) >= 4
    looks = {(tr.line.color, tr.marker.symbol) for tr in lines}
    assert len(looks) == len(lines) and len({tr.line.color for tr in lines}) == len(lines)
    names = [tr.name for tr in lines]
    assert len(set(names)) == len(names)
    first = tc["curves"][0]["trial"]
    assert all(f"vs #{first}:" in n for n, c in zip(names[1:], tc["curves"][1:]) if c["role"] != "baseline")
    latency = figures.latency_figure(tc)                    # the same curve keeps its color in the latency figure
    assert {tr.legendgroup: tr.line.color for tr in latency.data} == \
        {c["label"]: tr.line.color for c, tr in zip(tc["curves"], lines)}


def test_vs_reference_table_has_a_reference_column_with_its_result(data):
    rows = flag_diff(data)
    assert rows[0]["flag"] == "result: output tok/s" and rows[0]["reference"] == 5816.0
    assert rows[0]["best"] == max(lv.output_throughput for lv in
                                  next(t for t in data.trials if t.trial == 3).stable_levels)
    assert all("reference" in r for r in rows)
    assert any(r["flag"] == "max-running-requests" for r in rows)  # a reference without flags hides no difference
    page = render(compute(data))
    section = page.split("<section id='flags'>", 1)[1].split("</section>", 1)[0]
    assert "<th>reference</th>" in section and "5,816.0" in section and "records no flags" in section


def test_report_is_small_and_carries_plotly_once(data):
    page = render(compute(data))
    assert len(page) < 2_300_000                             # plotly.js alone is 4.8 MB uncompressed
    assert page.count('id="plotly-gz"') == 1 and page.count("class=\"fig-data\"") == 6
    assert '"template"' not in page.split('id="plotly-template"', 1)[1].split("fig-data", 1)[1][:2000]


def test_export_keeps_integer_columns_integers(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    t = store.read_trial(6)
    t.params["cuda-graph-max-bs"] = 256                      # a conditional knob: set in one trial only
    store.write_trial(t)
    res = CliRunner().invoke(app, ["export", "--study", store.name, "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    trials = (store.dir / f"{store.name}-trials.csv").read_text().splitlines()
    head = trials[0].split(",")
    row6 = dict(zip(head, next(r for r in trials[1:] if r.split(",")[1] == "6").split(",")))
    row4 = dict(zip(head, next(r for r in trials[1:] if r.split(",")[1] == "4").split(",")))
    assert row6["param.cuda-graph-max-bs"] == "256" and row6["peak_concurrency"] == "512"
    assert row4["peak_concurrency"] == "" and row4["param.cuda-graph-max-bs"] == ""   # none, not NaN
    assert row6["param.max-running-requests"] == "512" and row6["crashed_level"] == ""
    levels = frames(load_study(store))["levels"]
    assert str(levels["completed"].dtype) == "Int64" and str(levels["concurrency"].dtype) == "Int64"
    crashes = pd.read_csv(store.dir / f"{store.name}-crashes.csv", dtype=str, keep_default_na=False)
    assert list(crashes["level"]) == ["512", ""] and list(crashes["exit_code"]) == ["137", "137"]


def test_diff_hides_per_run_environment_and_shows_a_patch_once(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    for n in (1, 3):
        path = store.trial_dir(n) / "launch.json"
        launch = read_json(path)
        launch["env"].update({"TMPDIR": f"/w/trials/{n}/tmp", "TUNECTL_RUN_ID": f"glm5-t{n}-abcd",
                              "no_proxy": "127.0.0.1", "TUNECTL_SIM_PATCHES": ",".join(launch["patches"])})
        write_json(path, launch)
    res = CliRunner().invoke(app, ["diff", f"{store.name}:1", f"{store.name}:3", "--results", str(tmp_path)],
                             terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "TMPDIR" not in res.stdout and "TUNECTL_RUN_ID" not in res.stdout and "no_proxy" not in res.stdout
    assert res.stdout.count("flashinfer-cutlass-autotune") == 1     # the patches section, not the env again
    res = CliRunner().invoke(app, ["diff", f"{store.name}:1", f"{store.name}:3", "--all", "--results",
                                   str(tmp_path)], terminal_width=200)
    assert "NCCL_DEBUG" in res.stdout and "TMPDIR" not in res.stdout  # --all: the config's env, no run noise
    rows = [r["flag"] for r in flag_diff(load_study(store))]      # the report's winner-vs-baseline table too
    assert "patch flashinfer-cutlass-autotune" in rows
    assert not [f for f in rows if f.startswith(("env TUNECTL", "env TMPDIR"))]


def _stand_in_study(root: Path) -> StudyStore:
    """A winner launched the way the stand-in's plan launches it (the embedded default through build_plan)."""
    from tunectl.profile import default_profile_path
    from tunectl.runners.server.plan import build_plan, config_yaml

    prof = load_profile(default_profile_path())
    store = build_search_study(root, name="on-stand-in", with_db=False)
    t = store.read_trial(3)
    t.launch = build_plan(prof, {"flashinfer-cutlass-autotune": True, "max-running-requests": 1024}, "run-3",
                          str(store.trial_dir(3)))
    store.write_launch(3, t.launch, config_yaml(t.launch))
    store.write_trial(t)
    return store


def test_best_command_of_a_stand_in_study_is_the_sglang_command_for_a_gpu_host(tmp_path):
    store = _stand_in_study(tmp_path)
    res = CliRunner().invoke(app, ["best", "--study", store.name, "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    paste = lines[-1]
    assert paste.startswith("python3 -m sglang.launch_server --model-path ")
    assert "--sim-" not in paste and sys.executable not in paste and "TUNECTL" not in paste
    assert "--max-running-requests 1024" in paste
    assert any(ln.startswith("# needs the SGLang patches") and "flashinfer-cutlass-autotune" in ln for ln in lines)
    own = next(ln for ln in lines if ln.startswith("# measured on the SGLang stand-in"))
    words = shlex.split(own.split(": ", 1)[1])
    assert words[0].startswith("TUNECTL_SIM_PATCHES=") and "tunectl.sim.launch_server" in words
    assert words[1:] == read_json(store.trial_dir(3) / "launch.json")["argv"]


def test_best_command_of_a_real_sglang_study_keeps_the_hosts_interpreter_and_gpus(tmp_path):
    store = build_search_study(tmp_path, name="real", with_db=False)
    t: TrialResult = store.read_trial(3)
    assert t.launch is not None
    t.launch.argv[0] = "/opt/sglang/.venv/bin/python"              # the profile's server.python on the GPU host
    t.launch.env.update({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "TMPDIR": "/w/t/3/tmp", "TUNECTL_RUN_ID": "real-t3"})
    write_trial(store, t)
    res = CliRunner().invoke(app, ["best", "--study", "real", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    words = shlex.split(res.stdout.strip().splitlines()[-1])
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in words and not any(w.startswith(("TMPDIR", "TUNECTL")) for w in words)
    assert words[words.index("/opt/sglang/.venv/bin/python"):] == t.launch.argv
