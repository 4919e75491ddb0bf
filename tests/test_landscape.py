"""landscape.json: the converter on a fixture measured by the real `tunectl sweep` on the stand-in
(tests/fixtures/landscape/make.py) and on the real-GPU results in docs/real-gpu/, its counts and format."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunectl.wiring import landscape
from tunectl.errors import TunectlError, UsageError

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "tests" / "fixtures" / "landscape" / "fx"


@pytest.fixture(scope="module")
def fx() -> dict:
    return landscape.convert(FX)


def by_id(land: dict) -> dict[str, dict]:
    return {c["id"]: c for c in land["configs"]}


def trial(study: str) -> dict:
    return json.loads((FX / "results" / study / "trials" / "0" / "trial.json").read_text())


def test_the_fixture_converts_with_its_counts(fx: dict) -> None:
    assert (fx["format"], fx["version"]) == ("tunectl-landscape", 1)
    assert fx["counts"] == {"configs": 8, "measured": 7, "unmeasured": 1, "relaunched": 1, "launches": 9,
                            "configs_ok": 5, "configs_crash": 2, "configs_flaky": 0, "launches_ok": 7,
                            "launches_crash": 2, "launches_infra": 0, "launches_pruned": 0}
    assert fx["unmeasured"] == ["c07"] and fx["unknown_studies"] == []
    assert fx["levels"] == [16, 64] and fx["clients"] == ["builtin"] and fx["baseline"] == "c00"
    assert [launch["study"] for launch in by_id(fx)["c00"]["launches"]] == ["fx-c00", "fx-c00-r2", "fx-c00-r3"]


def test_levels_keep_the_producers_names_and_values(fx: dict) -> None:
    c02 = by_id(fx)["c02"]
    rec = c02["launches"][0]["levels"]["builtin"]["64"]
    lv = next(x for x in trial("fx-c02")["levels"] if x["concurrency"] == 64)
    assert rec["output_throughput"] == lv["metrics"]["output_throughput"]
    assert rec["p99_ttft_ms"] == lv["metrics"]["p99_ttft_ms"]
    assert rec["median_tpot_ms"] == lv["metrics"]["median_tpot_ms"]
    assert rec["completed"] == lv["completed"] and rec["status"] == "ok"
    steady = lv["metrics"].get("steady_output_throughput", lv["metrics"]["output_throughput"])
    assert rec["value"] == pytest.approx(steady, abs=0.01)
    assert c02["levels"]["builtin"]["64"]["n"] == 1 and c02["value"] == max(
        s["mean"] for s in c02["levels"]["builtin"].values())


def test_relaunches_give_the_spread(fx: dict) -> None:
    s = by_id(fx)["c00"]["levels"]["builtin"]["16"]
    reads = [launch["levels"]["builtin"]["16"]["value"] for launch in by_id(fx)["c00"]["launches"]]
    assert s["n"] == 3 and s["values"] == reads and s["min"] == min(reads) and s["max"] == max(reads)
    assert s["mean"] == pytest.approx(sum(reads) / 3, abs=0.01) and s["cv"] > 0
    assert fx["spread"]["builtin"]["16"] == {"configs": 1, "median_cv": s["cv"]}


def test_a_crash_keeps_its_class_and_signature(fx: dict) -> None:
    c01 = by_id(fx)["c01"]
    t = trial("fx-c01")
    assert c01["outcome"] == "crash" and c01["value"] is None
    assert c01["crash"]["cls"] == t["crash"]["cls"] == "config_error"
    assert c01["crash"]["signature"] == t["crash"]["signature"]
    assert c01["launches"][0]["outcome"] == "crash"


def test_a_partial_landscape_and_an_infra_launch(tmp_path: Path) -> None:
    folder = tmp_path / "fx"
    shutil.copytree(FX, folder)
    shutil.rmtree(folder / "results" / "fx-c02")                      # not measured yet
    shutil.copytree(folder / "results" / "fx-c04", folder / "results" / "fx-stray")
    path = folder / "results" / "fx-c05" / "trials" / "0" / "trial.json"
    t = json.loads(path.read_text())
    t["status"] = "infra"
    path.write_text(json.dumps(t))
    land = landscape.convert(folder)
    assert land["unmeasured"] == ["c02", "c05", "c07"]
    assert land["unknown_studies"] == ["fx-stray"]
    c05 = by_id(land)["c05"]
    assert c05["launches"][0]["outcome"] == "infra" and c05["value"] is None
    assert land["counts"]["launches_infra"] == 1 and land["counts"]["measured"] == 5


def test_real_gpu_search_results_convert() -> None:
    land = landscape.convert(ROOT / "docs" / "real-gpu" / "results" / "h200-search")
    cfgs = by_id(land)
    assert land["counts"]["configs"] == 8 and land["counts"]["launches"] == 9 and land["levels"] == [16, 128, 512]
    assert cfgs["c01"]["crash"]["signature"] == "cuda_oom_startup"
    assert [launch["role"] for launch in cfgs["c07"]["launches"]] == ["search", "finalist"]   # a rerun: a relaunch
    assert land["baseline"] == "c00" and cfgs["c00"]["launches"][0]["role"] == "baseline"
    assert cfgs["c04"]["value"] == pytest.approx(50854.69, abs=0.01)
    assert land["sglang"] == "0.5.17" and land["study_profile"]["name"] == "tiny-llama-h200"


def test_real_gpu_sweeps_with_both_clients_convert() -> None:
    land = landscape.from_results(ROOT / "docs" / "real-gpu" / "measure" / "results", "moe-measure")
    assert land["name"] == "moe-measure" and land["clients"] == ["bench_serving", "builtin"]
    winner = next(c for c in land["configs"] if c["launches"][0]["study"] == "h200-winner-x3")
    assert [launch["outcome"] for launch in winner["launches"]] == ["ok", "ok", "infra"]
    assert winner["levels"]["builtin"]["128"]["n"] == 3           # the infra launch's levels before its fault count
    assert winner["levels"]["bench_serving"]["128"]["n"] == 3


def test_design_mistakes_and_foreign_files_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "design.yaml").write_text("name: x\nlevels: [16]\nconfigs: [{id: c00, set: {}}]\ncolour: red\n")
    with pytest.raises(TunectlError) as e:
        landscape.convert(tmp_path)
    assert "design.yaml" in str(e.value) and "colour" in str(e.value) and "\n" not in str(e.value)
    bad = tmp_path / "l.json"
    bad.write_text(json.dumps({"format": "tunectl-landscape", "version": 99}))
    with pytest.raises(UsageError, match="version: 99"):
        landscape.load(bad)
    with pytest.raises(UsageError, match="no design.yaml and no tunectl studies"):
        landscape.convert(tmp_path / "nothing")


def test_write_and_load_round_trip(fx: dict, tmp_path: Path) -> None:
    landscape.write(fx, tmp_path / "landscape.json")
    assert landscape.load(tmp_path / "landscape.json") == json.loads(json.dumps(fx, default=str))


def test_a_study_that_ran_other_flags_than_its_config_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "fx"
    shutil.copytree(FX, folder)
    path = folder / "results" / "fx-c04" / "trials" / "0" / "trial.json"
    t = json.loads(path.read_text())
    t["params"]["max-running-requests"] = 128
    path.write_text(json.dumps(t))
    land = landscape.convert(folder)
    assert [(m["config"], m["study"]) for m in land["mismatched"]] == [("c04", "fx-c04")]
    assert landscape.convert(FX)["mismatched"] == []


LANDSCAPES = sorted((ROOT / "docs" / "real-gpu" / "landscapes").glob("*/design.yaml"))


@pytest.mark.parametrize("design", LANDSCAPES, ids=lambda p: p.parent.name)
def test_checked_in_landscapes_convert_and_are_current(design: Path) -> None:
    """Every measured landscape: its counts agree with its design, every launch is a study of its config that ran
    the config's flags, and a checked-in landscape.json is what the converter writes from the files today."""
    import yaml

    d = yaml.safe_load(design.read_text())
    land = landscape.convert(design.parent)
    n = land["counts"]
    assert n["configs"] == len(d["configs"]) == n["measured"] + n["unmeasured"]
    assert [c["id"] for c in land["configs"]] == [c["id"] for c in d["configs"]]
    assert land["mismatched"] == [] and land["unknown_studies"] == []
    for c in land["configs"]:
        for launch in c["launches"]:
            assert launch["study"] == f"{d['name']}-{c['id']}" or launch["study"].startswith(f"{d['name']}-{c['id']}-r")
            assert {int(lv) for by in launch["levels"].values() for lv in by} <= set(d["levels"])
    saved = design.parent / "landscape.json"
    if saved.exists():
        assert landscape.load(saved) == json.loads(json.dumps(land, default=str)), \
            f"{saved} is stale: python bench/landscape.py {design.parent}"
