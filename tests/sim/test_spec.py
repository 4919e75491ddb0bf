"""Speculative decoding: the knobs' scopes from SGLang's source, the startup refusals classified from
SGLang 0.5.9's own text, the stand-in's acceptance length read back through a level, and the crossover (it wins
at low concurrency and loses at high)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port
from tests.helpers.spec_text import REFUSALS, refusal
from tests.sim._server import start
from tunectl import knobs
from tunectl.sglang import scopes
from tunectl.sglang.crashes.classifier import classify
from tunectl.profile import load_profile
from tunectl.search.space import is_active
from tunectl.sim.model import load_card, virtual_ladder
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator, read_log

ROOT = Path(__file__).resolve().parents[2]
LOW, HIGH = ROOT / "profiles" / "sim-llama8b-spec.yaml", ROOT / "profiles" / "sim-llama8b-spec-high.yaml"
EAGLE3 = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
          "speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 4}


def test_speculative_knobs_act_only_under_the_algorithms_that_read_them() -> None:
    prof = load_profile(LOW)
    assert "when" not in LOW.read_text().split("speculative-num-steps:")[1].split("\n")[0]   # the profile wrote none
    space = prof.search.space
    cases = {"none": set(), "NGRAM": {"speculative-num-draft-tokens"},
             "EAGLE": {"speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens",
                       "speculative-draft-model-path"}}
    for algo, active in cases.items():
        got = {k for k in space if k.startswith("speculative-") and k != "speculative-algorithm"
               and is_active(space[k], {"speculative-algorithm": algo})}
        assert got == active, algo
    assert set(scopes.implied(prof)) == {"speculative-num-steps", "speculative-eagle-topk",
                                         "speculative-num-draft-tokens", "speculative-draft-model-path"}


def test_algorithm_none_leaves_the_flag_out_of_the_launch() -> None:
    prof = load_profile(LOW)
    assert "speculative-algorithm" not in knobs.merge(prof, {"speculative-algorithm": "none"})[0]
    assert knobs.merge(prof, {"speculative-algorithm": "NGRAM"})[0]["speculative-algorithm"] == "NGRAM"


@pytest.mark.parametrize("which", sorted(REFUSALS))
def test_speculative_refusals_are_classified_from_sglangs_text(which: str) -> None:
    info = classify(refusal(which), "startup", exit_code=1)
    assert info is not None and info.signature == which.removesuffix("_ngram") and info.cls == "config_error"


@pytest.mark.parametrize("flags,sig", [
    ({"speculative-algorithm": "EAGLE", "speculative-num-steps": 3}, "spec_topk_missing"),
    ({"speculative-algorithm": "EAGLE", "speculative-num-draft-tokens": 4}, "spec_params_partial"),
    ({"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 4,
      "attention-backend": "trtllm_mha"}, "spec_topk_trtllm"),
    ({"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 4, "page-size": 16,
      "attention-backend": "triton"}, "spec_topk_paged"),
])
def test_the_stand_in_refuses_what_sglang_refuses(flags: dict, sig: str) -> None:
    lad = virtual_ladder("llama31-8b-h200", flags, levels=[1], noise=0.0)
    info = read_log(lad).crash_info("startup", None, 1)
    assert lad.crashed and info.signature == sig


def test_the_live_stand_in_refuses_before_its_first_log_line(tmp_path: Path) -> None:
    srv = start(tmp_path, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                base=["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--sim-card", "llama31-8b-h200"],
                wait_ready=False)
    assert srv.wait_exit() == 1
    text = srv.text()
    assert text.startswith("Traceback (most recent call last):") and "in _handle_speculative_decoding" in text
    assert classify(text, "startup", exit_code=1).signature == "spec_topk_missing"


def test_acceptance_depends_on_the_workload_and_the_draft() -> None:
    card = load_card("llama31-8b-h200")
    acc = {kind: virtual_ladder(card, EAGLE3, levels=[1], workload_kind=kind, noise=0.0).levels[0].spec_accept_length
           for kind in ("random", "sharegpt")}
    assert 1.0 < acc["random"] < acc["sharegpt"] <= 4.0           # at most steps + 1
    eagle = {**EAGLE3, "speculative-algorithm": "EAGLE",
             "speculative-draft-model-path": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}
    assert 1.0 < virtual_ladder(card, eagle, levels=[1], noise=0.0).levels[0].spec_accept_length < acc["random"]
    wrong = {**EAGLE3, "speculative-algorithm": "EAGLE"}          # an EAGLE3 head under EAGLE: nothing accepted
    assert virtual_ladder(card, wrong, levels=[1], noise=0.0).levels[0].spec_accept_length == 1.0
    sim = virtual_ladder(card, EAGLE3, {"SGLANG_SIMULATE_ACC_LEN": "3.5"}, levels=[1], noise=0.0)
    assert sim.levels[0].spec_accept_length == 3.5                 # SGLang's own override, clamped to steps + 1
    assert virtual_ladder(card, {}, levels=[1], noise=0.0).levels[0].spec_accept_length is None    # off: none


def test_simulated_acceptance_reaches_ngram_from_0517_as_measured() -> None:
    """SGLANG_SIMULATE_ACC_LEN sets NGRAM's acceptance on 0.5.17 (its worker verifies through EAGLE's eagle_sample;
    a real H100 read 2.45-2.57 for 2.5, docs/real-gpu.md), not on 0.5.9 (EAGLE's verify only)."""
    card = load_card("llama31-8b-h200")
    ngram = {"speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 4}
    env = {"SGLANG_SIMULATE_ACC_LEN": "2.5"}
    acc = {v: virtual_ladder(card, ngram, env, levels=[1], noise=0.0, sglang_version=v).levels[0].spec_accept_length
           for v in ("0.5.9", "0.5.17", "0.5.23")}
    assert acc["0.5.17"] == acc["0.5.23"] == 2.5
    own = virtual_ladder(card, ngram, levels=[1], noise=0.0, sglang_version="0.5.17").levels[0].spec_accept_length
    assert acc["0.5.9"] == own != 2.5                             # 0.5.9: the card's own n-gram acceptance


def test_speculative_decoding_wins_at_low_concurrency_and_loses_at_high() -> None:
    for path, wins in ((LOW, True), (HIGH, False)):
        prof = load_profile(path)
        ev = VirtualEvaluator(prof, 0, noise=0.0)
        best = {"cuda-graph-max-bs": 1024, "max-running-requests": 1024, "mem-fraction-static": 0.72}
        off = ev(0, best, "search").best_output_throughput
        on = ev(1, {**best, **EAGLE3}, "search").best_output_throughput
        assert (on > 1.2 * off) is wins and (on < off) is not wins, (path.name, on, off)


def test_graphs_matter_more_with_speculative_decoding() -> None:
    # eager draft steps each pay their launches: disabling CUDA graphs costs a speculative config more
    card, base = load_card("llama31-8b-h200"), {"max-running-requests": 64}
    share = {}
    for name, cfg in (("off", base), ("on", {**base, **EAGLE3})):
        g = virtual_ladder(card, cfg, levels=[4], noise=0.0).levels[0].output_throughput
        e = virtual_ladder(card, {**cfg, "disable-cuda-graph": True}, levels=[4], noise=0.0).levels[0].output_throughput
        share[name] = e / g
    assert share["on"] < share["off"] < 1.0


def _profile(tmp_path: Path) -> Path:
    data = yaml.safe_load(LOW.read_text())
    data["server"]["port"] = free_port()
    data["server"]["sim"]["time_scale"] = 0.02
    data.setdefault("host", {})["workdir"] = str(tmp_path / "host")
    data["bench"]["levels"] = [1, 4]
    data["server"]["flags"]["enable-metrics"] = True          # the /metrics witness
    out = tmp_path / "spec.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def test_the_servers_acceptance_length_reaches_the_level(tmp_path: Path) -> None:
    sets = [a for k, v in EAGLE3.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-c", "from tunectl.cli import app; app()", "sweep", "--profile", str(_profile(tmp_path)),
           "--results", str(tmp_path / "results"), "--json", *sets]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    levels = json.loads(out.stdout)["levels"]
    want = virtual_ladder("llama31-8b-h200", EAGLE3, levels=[1], noise=0.0).levels[0].spec_accept_length
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for lv in levels:
        assert lv["metrics"]["spec_accept_length"] == pytest.approx(want, abs=0.01)     # from the decode lines
        assert lv["witness"]["server_spec_accept_length"] == pytest.approx(want, abs=0.01)   # from /metrics


@pytest.mark.parametrize("path,speculates", [(LOW, True), (HIGH, False)])
def test_the_search_finds_speculative_decoding_where_it_pays(path: Path, speculates: bool, tmp_path: Path) -> None:
    # one space, two objectives: the winner of a short search (noise on, finalists raced) speculates at 1-16
    # streams and not at 256-1,024 (the full table: bench/spec_crossover.py, docs/search.md)
    prof = load_profile(path)
    out = run_search(prof, trials=16, root=tmp_path, evaluate=VirtualEvaluator(prof, 0), seed=0,
                     storage_url=f"memory:spec:{path.name}")
    assert out.best is not None
    params = out.best["params"]
    assert (params.get("speculative-algorithm", "none") != "none") is speculates
    if speculates:                    # and it pays: the same config without it reads far less (noise off)
        true = VirtualEvaluator(prof, 0, noise=0.0)
        off = {**params, "speculative-algorithm": "none"}
        assert true(0, params, "search").best_output_throughput > 1.3 * true(1, off, "search").best_output_throughput
