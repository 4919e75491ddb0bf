"""Sim cards: every shipped card validates; a bad card names file:line and key; the card, not code, decides the
model's behaviour (MoE or dense, autotune, memory that grows with the chunk, GPU names in messages)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tunectl.sim.card import CARDS_DIR, known_cards, load_card
from tunectl.sim.model import virtual_ladder
from tunectl.sim.setup import resolve

from tests._badyaml import bad_yaml_error
from tests.sim._server import TOKENIZER
from tunectl.errors import ProfileError
from tunectl.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
GLM = CARDS_DIR / "glm5-nvfp4-8x-rtx-pro-6000.yaml"


@pytest.mark.parametrize("name", known_cards())
def test_every_card_loads_and_its_default_config_starts(name: str) -> None:
    card = load_card(name)
    assert card.name == name and card.gpu.total_gib < card.gpu.memory_gb
    assert resolve(card, {"tp-size": card.gpu.count, "mem-fraction-static": 0.85}).crash is None


def test_every_sim_profile_names_a_card_that_exists() -> None:
    for path in sorted((ROOT / "profiles").glob("sim-*.yaml")):
        prof = load_profile(path)
        assert load_card(prof.server.sim.card).name, path
        assert not prof.search.try_first, f"{path.name}: no hand-tuned hint"


def _bad_card(tmp_path: Path, edit) -> str:
    msg = bad_yaml_error(tmp_path, GLM, edit, load_card)
    assert msg.split(":")[1].isdigit()                       # the line number
    return msg


def test_unknown_card_key_names_file_line_and_the_valid_keys(tmp_path: Path) -> None:
    msg = _bad_card(tmp_path, lambda d: d["memory"].update(wieghts_gb=1.0))
    assert "memory.wieghts_gb" in msg and "unknown key" in msg and "weights_gb" in msg


def test_missing_card_key_says_what_is_expected(tmp_path: Path) -> None:
    msg = _bad_card(tmp_path, lambda d: d["gpu"].pop("total_gib"))
    assert "gpu.total_gib" in msg and "missing key" in msg and "GiB" in msg


def test_bad_card_value_inside_a_runner(tmp_path: Path) -> None:
    msg = _bad_card(tmp_path, lambda d: d["moe"]["runners"]["triton"].update(autotune="sometimes"))
    assert "moe.runners.triton.autotune" in msg and "'with_patch'" in msg


def test_unknown_card_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match="known cards"):
        load_card("no-such-card")


def test_dense_card_has_no_moe_and_ignores_the_runner_flag() -> None:
    card = load_card("llama31-8b-h200")
    assert card.moe is None and card.page_table_1_flattened is None and card.hang is None
    a = resolve(card, {"moe-runner-backend": "triton"})
    b = resolve(card, {})
    assert a.crash is None and a.step_mult == b.step_mult and not a.autotune


def test_which_runners_autotune_is_a_card_field() -> None:
    ds = load_card("deepseek-v32-fp8-8x-b200")
    assert resolve(ds, {"moe-runner-backend": "flashinfer_trtllm", "mem-fraction-static": 0.84}).autotune
    assert not resolve(ds, {"moe-runner-backend": "flashinfer_cutlass", "mem-fraction-static": 0.84}).autotune
    assert resolve(ds, {"moe-runner-backend": "flashinfer_cutlass", "mem-fraction-static": 0.84},
                   patches=["0001-flashinfer-cutlass-autotune"]).autotune


def test_activation_memory_grows_with_the_chunk() -> None:
    card = load_card("llama33-70b-fp8-2x-h100")
    cfg = {"tp-size": 2, "mem-fraction-static": 0.94, "cuda-graph-max-bs": 32}
    assert resolve(card, {**cfg, "chunked-prefill-size": 2048}).crash is None
    crash = resolve(card, {**cfg, "chunked-prefill-size": 16384}).crash
    assert crash is not None and crash.phase == "kv_alloc"
    assert "total capacity of 79.19 GiB" in crash.exception          # the card's GPU, not a constant


def test_autotune_workspace_grows_with_the_chunk() -> None:
    card = load_card("deepseek-v32-fp8-8x-b200")
    cfg = {"moe-runner-backend": "flashinfer_trtllm", "mem-fraction-static": 0.9, "disable-cuda-graph": True}
    assert resolve(card, {**cfg, "chunked-prefill-size": 4096}).crash is None
    assert resolve(card, {**cfg, "chunked-prefill-size": 16384}).crash.phase == "autotune"


def test_page_table_crash_only_where_the_card_has_it() -> None:
    ds = load_card("deepseek-v32-fp8-8x-b200")
    base = {"attention-backend": "nsa", "nsa-decode-backend": "trtllm", "mem-fraction-static": 0.84}
    assert resolve(ds, {**base, "kv-cache-dtype": "fp8_e4m3"}).pt1_prone
    assert not resolve(ds, base).pt1_prone                             # bf16 KV by default on this card
    assert not resolve(load_card("llama31-8b-h200"), {"kv-cache-dtype": "fp8_e4m3"}).pt1_prone


def test_unequal_lengths_soften_the_tail_wave() -> None:
    """64 requests on 48 slots: equal lengths leave a tail wave of 16; drawn lengths (bench_serving's
    --random-range-ratio) let waiting requests take slots as soon as they free up."""
    card = load_card("qwen3-30b-a3b-fp8-l40s")

    def share(ratio: float) -> float:
        tput = [virtual_ladder(card, {"max-running-requests": m}, levels=[64], input_len=512, output_len=256,
                               range_ratio=ratio, min_prompts=2).levels[0].output_throughput for m in (48, 64)]
        return tput[0] / tput[1]

    assert share(0.5) > share(1.0) + 0.02


def test_relative_card_path_resolves_against_the_profile_folder(tmp_path: Path) -> None:
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "mine.yaml").write_text(GLM.read_text())
    data = yaml.safe_load((ROOT / "profiles" / "sim-glm5.yaml").read_text())
    data["server"]["sim"]["card"] = "cards/mine.yaml"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    prof = load_profile(tmp_path / "p.yaml")
    assert Path(prof.server.sim.card) == tmp_path / "cards" / "mine.yaml"
    assert load_card(prof.server.sim.card).model == "zai-org/GLM-5-NVFP4"


def test_model_info_and_gpu_come_from_the_card(launch) -> None:
    srv = launch("--sim-card", "qwen3-30b-a3b-fp8-l40s", base=["--model-path", str(TOKENIZER)])
    status, info = srv.get("/model_info")
    assert status == 200 and info["model_type"] == "qwen3_moe" and info["architectures"] == ["Qwen3MoeForCausalLM"]
    assert srv.get("/server_info")[1]["sim_gpu"] == "NVIDIA L40S"
    assert "max_total_num_tokens=" in srv.text()


@pytest.mark.parametrize("name", [c for c in known_cards() if c != "glm5-nvfp4-8x-rtx-pro-6000"])
def test_documented_optimum_matches_the_model(name: str) -> None:
    """Each new card records the best stable config of its profile's grid (bench/search_efficiency.py --scan);
    the model still gives that throughput there (GLM-5's is checked in test_model.py)."""
    from tunectl.wiring.virtual import VirtualEvaluator

    best = load_card(name).landscape.best_stable
    prof = load_profile(ROOT / best.profile)
    runs = [VirtualEvaluator(prof, s, noise=0.0)(0, dict(best.flags), "search") for s in range(2)]
    assert all(r.status == "ok" for r in runs)
    assert min(r.best_output_throughput for r in runs) == pytest.approx(best.output_throughput, rel=0.01)


def test_the_scan_finds_the_best_by_the_profiles_objective_slo_limits_kept(tmp_path: Path) -> None:
    """`bench/search_efficiency.py --scan` sets the target the search is measured against: for a profile with an
    SLO it is the best value the search can be told (the SLO-bound level), never a raw peak that breaks the SLO."""
    from bench.search_efficiency import _scan_chunk, grid_configs
    from tunectl.search.feedback import judge
    from tunectl.wiring.virtual import VirtualEvaluator

    data = yaml.safe_load((ROOT / "profiles" / "sim-glm5.yaml").read_text())
    data["objective"] = {"metric": "output_throughput", "slo": {"p99_ttft_ms": 400}}
    path = tmp_path / "slo.yaml"
    path.write_text(yaml.safe_dump(data))
    prof = load_profile(path)
    configs = grid_configs(prof)[::997][:12]
    ev = VirtualEvaluator(prof, 0, noise=0.0)
    runs = [ev(0, c, "search") for c in configs]
    told = [judge(r, prof) for r in runs]
    feasible = [v.values[0] for r, v in zip(runs, told) if r.status == "ok" and v.feasible]
    raw = max(r.best_output_throughput for r in runs if r.status == "ok")
    assert feasible and max(feasible) < 0.8 * raw                 # the SLO binds on this sample
    value, where, _ = _scan_chunk((str(path), configs, 1))
    assert value == pytest.approx(max(feasible)) and where in configs


def test_the_efficiency_bench_names_each_target_a_card_misses(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 35's targets: median <= 10 trials to 95%, every seed reaching it, >= 2x random, crash waste <= 10%;
    a card that misses any says which (a median of 11.5 once printed "met" against an older <= 12)."""
    from bench.search_efficiency import print_summary

    def row(per_seed: list[int], waste: float) -> dict:
        return {"median": sorted(per_seed)[len(per_seed) // 2], "per_seed": per_seed, "waste": waste}

    print_summary({"good": (1.0, {"tpe": row([3, 4, 5], 0.05), "random": row([20, 30, 41], 0.4)}),
                   "slow": (1.0, {"tpe": row([9, 12, 41], 0.12)})}, 40, 1.0)
    out = capsys.readouterr().out
    assert "good" in out and out.split("good", 1)[1].splitlines()[0].rstrip().endswith("met")
    slow = out.split("slow", 1)[1].splitlines()[0]
    assert "NOT met: median 12 > 10, 1 seed(s) never at 95%, crash waste 12%" in slow
    assert "on every card: NOT met" in out
