"""The report's data for fixture studies written through StudyStore: completed, crashed, pruned, finalists."""
from __future__ import annotations

import shutil
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tunectl.reports.data import (
    best_trial,
    fmt_cell,
    history,
    load_study,
    pareto,
    summary,
    throughput_curves,
)
from tunectl.reports.importance import importance
from tunectl.reports.render import compute, render
from tunectl.reports.tables import crash_map, finalists, trial_rows

from tests.reports.fixtures import BEST_TRIAL, PAGE_TABLE_LINE, build_search_study
from tunectl.store import StudyStore, read_json


@pytest.fixture(scope="module")
def data(results_root: Path):
    return load_study(StudyStore("glm5-search", results_root))


def _level_files(store: StudyStore, n: int) -> list[dict]:
    return [read_json(p) for p in sorted((store.trial_dir(n) / "levels").glob("*.json"))]


def test_summary_names_best_json_winner_with_its_peak_and_command(data, results_root):
    s = summary(data)["best"]
    store = StudyStore("glm5-search", results_root)
    assert s["trial"] == store.read_best()["best"]["trial"] == BEST_TRIAL
    levels = [lv for lv in _level_files(store, BEST_TRIAL) if lv["status"] == "ok"]
    peak = max(levels, key=lambda lv: lv["metrics"]["output_throughput"])
    assert s["output_throughput"] == peak["metrics"]["output_throughput"]
    assert s["concurrency"] == peak["concurrency"]
    assert s["latencies"]["p99_ttft_ms"] == peak["metrics"]["p99_ttft_ms"]
    assert s["argv"] == read_json(store.trial_dir(BEST_TRIAL) / "launch.json")["argv"]
    assert s["sglang_version"] == "0.5.9" and s["host"] == "gpu-box-1"
    assert s["patch_hashes"] and all(len(h) == 64 for h in s["patch_hashes"].values())
    reruns = [t.best_output_throughput for t in data.trials
              if t.role == "finalist" and t.params == s["params"]]
    runs = [s["output_throughput"], *reruns]                # one number: the search run and its reruns
    assert len(reruns) == 2 and s["confirmed_value"] == pytest.approx(statistics.fmean(runs))
    assert (s["confirmed"]["min"], s["confirmed"]["max"]) == (min(runs), max(runs))
    base = summary(data)["baseline"]
    assert s["speedup_vs_baseline"] == pytest.approx(s["confirmed_value"] / base["output_throughput"])


def test_a_flat_best_json_is_read_too(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    store.write_best({"trial": 7})
    assert best_trial(load_study(store)).trial == 7


def test_without_best_json_the_winner_is_the_best_trial_that_finished_ok(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    (store.dir / "best.json").unlink()
    d = load_study(store)
    winner = best_trial(d)
    assert winner is not None and winner.status == "ok"
    ok = [t.best_output_throughput for t in d.trials if t.status == "ok"]
    assert winner.best_output_throughput == max(ok)
    crashed = [t for t in d.trials if t.status == "crashed"]
    assert crashed  # a crashed trial's stable levels never make it the winner


def test_curves_cover_top_configs_and_baseline_and_stop_before_the_crash(data):
    tc = throughput_curves(data, top=4)
    roles = [c["role"] for c in tc["curves"]]
    assert "baseline" in roles
    params = [repr(sorted(next(t for t in data.trials if t.trial == c["trial"]).params.items()))
              for c in tc["curves"]]
    assert len(params) == len(set(params)), "reruns of one config collapse into one curve"
    crashed = [c for c in tc["curves"] if c["crashed_at"]]
    assert crashed, "the page_table crash at 512 is among the top configs"
    for c in crashed:
        assert max(c["concurrency"]) < c["crashed_at"]
    for c in tc["curves"]:
        assert c["concurrency"] == sorted(c["concurrency"])
        assert len(c["p99_ttft_ms"]) == len(c["concurrency"])
    assert tc["reference"]["output_throughput"] == 5816.0


def test_history_marks_crashes_and_keeps_a_running_best(data):
    rows = history(data.trials)
    assert [r["trial"] for r in rows] == sorted(t.trial for t in data.trials)
    best = [r["running_best"] for r in rows]
    assert best == sorted(best)
    assert {r["crash_class"] for r in rows if r["status"] == "crashed"} == {"load_crash", "config_error"}
    pruned = [r for r in rows if r["status"] == "pruned"]
    assert pruned and all(r["running_best"] >= r["output_throughput"] for r in pruned)


def test_crash_map_places_the_exception_at_its_level_and_values(data):
    cm = crash_map(data.trials)
    hits = [r for r in cm["rows"] if r["class"] == "load_crash"]
    assert [r["at"] for r in hits] == ["512"]
    assert {"moe-runner-backend": "flashinfer_cutlass", "disable-cuda-graph": True}.items() <= hits[0]["params"].items()
    assert hits[0]["exception_line"] == PAGE_TABLE_LINE and max(hits[0]["passed"]) == 256
    startup = [c for c in cm["crashes"] if c["phase"] == "startup"]
    assert startup and startup[0]["class"] == "config_error"
    assert "OutOfMemoryError" in startup[0]["exception_line"]


def test_pareto_front_is_exactly_the_non_dominated_points(data):
    p = pareto(data.trials)

    def dominated(q):
        return any(o["output_throughput"] >= q["output_throughput"] and o["p99_ttft_ms"] <= q["p99_ttft_ms"]
                   and (o["output_throughput"], o["p99_ttft_ms"])
                   != (q["output_throughput"], q["p99_ttft_ms"])
                   for o in p["points"])

    assert p["front"] and all(not dominated(q) for q in p["front"])
    front_ids = {(q["trial"], q["concurrency"]) for q in p["front"]}
    for q in p["points"]:
        if (q["trial"], q["concurrency"]) not in front_ids:
            assert dominated(q) or any(f["output_throughput"] == q["output_throughput"]
                                       and f["p99_ttft_ms"] == q["p99_ttft_ms"] for f in p["front"])


def test_finalists_group_reruns_with_their_search_trial(data):
    fin = finalists(data.trials)
    assert len(fin) == 2
    top = fin[0]
    origin = next(t for t in data.trials if t.trial == top["search_trial"])
    assert origin.role == "search" and origin.params == top["params"]
    runs = [origin, *(t for t in data.trials if t.role == "finalist" and t.params == top["params"])]
    assert [r["trial"] for r in top["runs"]] == [t.trial for t in runs]
    want = statistics.fmean(t.best_output_throughput for t in runs)
    assert top["mean_output_throughput"] == pytest.approx(want)
    values = [t.best_output_throughput for t in runs]
    low, high = top["ci95"]                              # pooled over the launches: never narrower than their spread
    assert low < want < high and (len(runs) > 3 or (low <= min(values) and high >= max(values)))
    assert top["launch_spread"] == pytest.approx((max(values) - min(values)) / want)


def test_importance_ranks_pooled_values_or_names_the_knobs_inside_the_noise(data):
    got = importance(data.trials)
    assert got["method"].startswith("pooled spread")
    names = {k for t in data.trials for k in t.params}
    assert set(got["values"]) | set(got["swamped"]) == names and not set(got["values"]) & set(got["swamped"])
    assert not got["values"] or sum(got["values"].values()) == pytest.approx(1.0)


def test_trial_table_has_every_trial_and_links_to_existing_logs(data, results_root):
    rows = trial_rows(data)
    assert [r["trial"] for r in rows] == sorted(t.trial for t in data.trials)
    for r in rows:
        assert (results_root / "glm5-search" / r["log"]).is_file()
    base = next(t for t in data.trials if t.role == "baseline")
    for r in rows:
        if r["role"] != "baseline":
            assert r["key_flags"] == {k: v for k, v in r["params"].items() if base.params.get(k) != v}
    assert next(r for r in rows if r["trial"] == 1)["key_flags"] == {"max-running-requests": 256}
    crashed = next(r for r in rows if r["crash_class"] == "load_crash")
    assert crashed["max_stable_concurrency"] == 256 and crashed["crashed_at"] == 512
    pruned = next(r for r in rows if r["status"] == "pruned")
    assert pruned["levels_done"] == 4 and pruned["max_stable_concurrency"] == 4


def test_running_study_reads_level_files_ahead_of_trial_json(results_root):
    store = StudyStore("in-progress", results_root)
    d = load_study(store)
    running = next(t for t in d.trials if t.status == "running")
    assert len(store.read_trial(running.trial).levels) < len(running.levels) == len(_level_files(store, 1))
    page = render(compute(d))
    assert "fig-throughput" in page and "No finalists yet" in page


def test_sweep_renders_with_its_single_trial(results_root):
    d = load_study(StudyStore("sweep-1", results_root))
    r = compute(d)
    assert r["summary"]["kind"] == "sweep" and r["summary"]["best"]["trial"] == 0
    assert r["crash_map"]["crashes"] == [] and r["finalists"] == []
    page = render(r)
    assert "No crashes." in page and 'id="fig-crashmap"' not in page
    assert "solid mean, dashed p99" in page    # no median in these results: the mean stands in, labelled
    assert "no TPOT in these results" in page and 'id="fig-history"' not in page


def _external_refs(page: str) -> list[str]:
    """src/href attributes of tags (script bodies are not parsed as markup) that leave the page."""
    found: list[str] = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(v for k, v in attrs if k in ("src", "href") and v and "://" in v)

    P().feed(page)
    return found


def test_page_is_self_contained_and_escapes_text(data):
    page = render(compute(data))
    assert _external_refs(page) == []
    assert "&#x27;page_table_1_flattened&#x27;" in page       # exception lines are escaped
    assert "s3cret" not in page
    for key in ("throughput", "latency", "history", "importance", "crashmap", "pareto"):
        assert f'id="fig-{key}"' in page


def test_flag_values_keep_their_precision_and_lose_float_noise(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    t = store.read_trial(6)
    t.params["mem-fraction-static"] = 0.8400000000000001
    store.write_trial(t)
    d = load_study(store)
    rows = {r["trial"]: r["key_flags"] for r in trial_rows(d)}
    assert rows[6]["mem-fraction-static"] == 0.8400000000000001      # the data keeps the value; the page rounds it
    page = render(compute(d))
    assert "mem-fraction-static=0.84<" in page and "0.8400000000000001" not in page


def test_empty_study_renders_without_a_winner(tmp_path):
    store = StudyStore("empty", tmp_path)
    store.write_study({"kind": "search"})
    r = compute(load_study(store))
    assert r["summary"]["best"] is None
    assert "No stable configuration yet" in render(r)
    store.write_best({"study": "empty", "best": None})        # a search that found nothing stable
    assert best_trial(load_study(store)) is None


def test_torn_trial_json_is_skipped(tmp_path):
    store = build_search_study(tmp_path, with_db=False)
    shutil.copy(store.trial_dir(1) / "trial.json", tmp_path / "keep")
    (store.trial_dir(1) / "trial.json").write_text('{"trial": 1, "sta')
    d = load_study(store)
    assert 1 not in {t.trial for t in d.trials} and len(d.trials) == 10


def test_cells_show_metrics_with_one_decimal_and_knobs_as_set():
    assert fmt_cell(1522.587) == "1,522.6" and fmt_cell(0.88) == "0.88"
    assert fmt_cell(0.8400000000000001) == "0.84" and fmt_cell(True) == "true" and fmt_cell(64) == "64"


def test_the_winners_patch_is_in_the_summary_and_the_differing_flags(data):
    from tunectl.reports.render import flag_diff

    s = summary(data)["best"]
    assert s["patches"] == ["flashinfer-cutlass-autotune"]           # the stand-in-free fixture: real SGLang
    assert s["command"].startswith("# needs the SGLang patches flashinfer-cutlass-autotune")
    row = next(r for r in flag_diff(data) if r["flag"] == "patch flashinfer-cutlass-autotune")
    assert row["best"] is True and row["baseline"] is None
    assert "patches: flashinfer-cutlass-autotune" in render(compute(data))


def test_the_ranking_follows_the_studys_objective_not_the_peak(tmp_path):
    """With an SLO on p99 TTFT, a config whose peak misses it ranks below one that meets it at a lower peak (the
    order the search told its sampler): the winner without best.json and the first curve are the SLO's."""
    from tests.reports.fixtures import make_trial, profile_dict, write_trial
    from tunectl.models import LevelResult
    from tunectl.reports.data import rank_trials, study_profile

    store = StudyStore("slo-study", tmp_path)
    store.write_study({"kind": "search", "profile": {**profile_dict("slo-study"),
                                                     "objective": {"slo": {"p99_ttft_ms": 2000}}}})
    for n, points in ((1, [(64, 900.0, 800.0), (256, 1500.0, 5000.0)]),     # its peak misses the SLO
                      (2, [(64, 1000.0, 600.0), (256, 1200.0, 1800.0)])):   # lower peak, meets it
        t = make_trial(n, "search", "ok", {"max-running-requests": 64 * n}, 1000.0, None, None)
        t.levels = [LevelResult(concurrency=c, status="ok", completed=2 * c, duration_s=30.0,
                                metrics={"output_throughput": tp, "p99_ttft_ms": ttft}) for c, tp, ttft in points]
        write_trial(store, t)
    data = load_study(store)
    prof = study_profile(data)
    assert prof is not None and prof.objective.slo == {"p99_ttft_ms": 2000}
    assert [t.trial for t in rank_trials(data.trials, prof)] == [2, 1]
    assert [t.trial for t in rank_trials(data.trials)] == [1, 2]                  # by the peak alone
    assert best_trial(data).trial == 2
    assert throughput_curves(data)["curves"][0]["trial"] == 2
    # a study.json whose profile no longer validates: the peak decides, nothing fails
    store.write_study({"kind": "search", "profile": {"name": "slo-study", "objective": {"slo": {"bogus": 1}}}})
    assert best_trial(load_study(store)).trial == 1
