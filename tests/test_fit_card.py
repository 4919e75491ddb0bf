"""bench/fit_card.py: a card's timings fitted to part of a landscape are checked on the configs held out; on the
fixture measured on the stand-in's own card (tests/fixtures/landscape/make.py), a card whose timings were thrown off
is brought back."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from bench.fit_card import Fit, errors, main_effects, scaled
from tunectl.wiring import landscape
from tunectl.sim.card import load_card

FX = Path(__file__).resolve().parent / "fixtures" / "landscape" / "fx"


def mean_error(fit: Fit, card, configs) -> float:
    per, crash_off = errors(fit, card, configs)
    assert crash_off == []
    return statistics.fmean(abs(e) for es in per.values() for e in es)


def test_a_thrown_off_card_is_fitted_back_and_checked_on_held_out_configs() -> None:
    land = landscape.convert(FX)
    off = scaled(load_card("llama31-8b-h200"), {"decode.launch_ms": 3.0, "decode.base_ms": 2.0})
    fit = Fit(land, off, None)
    held = fit.configs[2::3]
    train = [c for c in fit.configs if c not in held]
    assert [c["id"] for c in held] == ["c02", "c05"] and len(train) == 5
    before = mean_error(fit, off, held)
    fitted = scaled(off, fit.fit(train, rounds=3))
    after = mean_error(fit, fitted, held)
    assert before > 0.3 and after < 0.1 and fit.loss(fitted, train) < fit.loss(off, train)


def test_main_effects_compare_twins_measured_and_modelled() -> None:
    land = landscape.convert(FX)
    fit = Fit(land, load_card("llama31-8b-h200"), None)
    effects = {(k, lv): (m, c) for k, _, lv, m, c in main_effects(fit, fit.base)}
    meas, card = effects[("disable-cuda-graph", 16)]
    assert meas < 0.6 and card < 0.6              # graphs off: much slower at 16 streams, measured and modelled


def test_eager_steps_overlap_the_launches_with_the_gpu_work() -> None:
    from tunectl.sim.setup import eager_ms
    assert eager_ms(6.0, 17.0, 0.0) == 23.0                      # no overlap: the two add up (older cards)
    for gpu in (1.0, 6.0, 17.0, 25.0, 80.0):
        t = eager_ms(gpu, 17.0, 2.5)
        assert max(gpu, 17.0) <= t < gpu + 17.0                  # bound by the slower, never the sum
    assert eager_ms(80.0, 17.0, 2.5) < 1.02 * 80.0                # a long GPU step hides the launches
    assert eager_ms(2.0, 17.0, 2.5) < 1.01 * 17.0                 # a short one waits on them


REAL = Path(__file__).resolve().parents[1] / "docs" / "real-gpu" / "landscapes" / "llama8b-h100"


def test_the_h100_card_fitted_to_the_real_landscape_reaches_its_graph_effects() -> None:
    """sim/cards/llama31-8b-h100.yaml against the measured table (the real client), fitted to the design's balanced
    first half (c00-c11) with every third config held out: each level of the eight configs it was fitted to within
    20% on average, the four held out (c02, c05, c08, c11) within 15% on average and 25% at worst per level; the
    main effects of graphs on and of graphs to 256 instead of 32 (measured 3.00x / 1.54x / 1.33x and 1.00x / 2.04x /
    1.69x at 16 / 64 / 256 streams) within 10%. The same card without the eager overlap (launches added to the GPU's
    work, as the older cards play it) cannot reach the graphs' effect at 256 streams: it makes eager batches far
    slower there than the real GPU does. (docs/landscapes.md, "The first real fit" and "The refit on the balanced
    half".)"""
    land = landscape.convert(REAL)
    card = load_card("llama31-8b-h100")
    fit = Fit(land, card, "bench_serving")
    half = [c for c in fit.configs if c["id"] in {f"c{i:02d}" for i in range(12)}]
    held = {"c02", "c05", "c08", "c11"}
    for configs, mean_max, worst in (([c for c in half if c["id"] not in held], 0.2, None),
                                     ([c for c in half if c["id"] in held], 0.15, 0.25)):
        per, crash_off = errors(fit, card, configs)
        assert crash_off == [] and set(per) == {16, 64, 256}
        for lv, es in per.items():
            assert sum(abs(e) for e in es) / len(es) < mean_max, (lv, es)
            assert worst is None or max(abs(e) for e in es) < worst, (lv, es)
    effects = {(k, lv): (m, c) for k, _, lv, m, c in main_effects(fit, card)}
    for knob in ("cuda-graph-backend-decode", "cuda-graph-max-bs-decode"):
        for lv in (16, 64, 256):
            meas, model = effects[(knob, lv)]
            assert abs(model / meas - 1) < 0.1, (knob, lv, meas, model)
    additive = scaled(card, {}, {"decode.launch_overlap_p": 0.0})
    meas, model = {lv: (m, c) for k, _, lv, m, c in main_effects(fit, additive)
                   if k == "cuda-graph-max-bs-decode"}[256]
    assert model / meas > 1.25


def _land(launches_per_config: list[list[list[float]]]) -> dict:
    levels = ("16", "64", "256")
    return {"configs": [{"id": f"c{i:02d}", "launches": [
        {"outcome": "ok", "levels": {"bench_serving": {lv: {"status": "ok", "value": v} for lv, v in zip(levels, vals)}}}
        for vals in launches]} for i, launches in enumerate(launches_per_config)]}


def test_the_noise_splits_a_relaunchs_shift_from_its_levels_scatter() -> None:
    from bench.fit_card import noise
    base = [1000.0, 3000.0, 8000.0]
    # a launch 4% faster at every level: all of it is the launch's shift, none is left per level
    shifted = noise(_land([[base, [v * 1.04 for v in base]]]), "bench_serving")
    assert shifted is not None and shifted["level"] < 1e-9
    assert shifted["launch"] == pytest.approx(math.log(1.04) / math.sqrt(2))
    # levels scattered +-3% around no common shift: level noise, and the launch's share read as none
    scattered = noise(_land([[base, [v * f for v, f in zip(base, (1.03, 0.97, 1.0))]]]), "bench_serving")
    assert scattered is not None and scattered["level"] > 0.02 and scattered["launch"] < 0.01
    # pooled over configs; a config launched once adds nothing, and a table without relaunches gives None
    both = noise(_land([[base, [v * 1.04 for v in base]], [base]]), "bench_serving")
    assert both is not None and (both["configs"], both["launches"]) == (1, 2)
    assert noise(_land([[base], [base]]), "bench_serving") is None


def test_launches_on_two_machines_are_no_relaunches_of_each_other() -> None:
    """A config read 11% apart on two machines (as two real H100s read one config) is not launch noise: the noise
    counts only launches of one machine (`launches[].machine`, "" where a table did not record it)."""
    from bench.fit_card import noise
    base = [1000.0, 3000.0, 8000.0]
    land = _land([[base, [v * 1.11 for v in base], [v * 1.01 for v in base]]])
    land["configs"][0]["launches"][1]["machine"] = "NVIDIA H100 80GB HBM3 x1, 700 W, gpu-b"
    got = noise(land, "bench_serving")
    assert got is not None and (got["configs"], got["launches"]) == (1, 2)        # the two on the unnamed machine
    assert got["launch"] == pytest.approx(math.log(1.01) / math.sqrt(2))
    land["configs"][0]["launches"][2]["machine"] = "NVIDIA H100 80GB HBM3 x1, 700 W, gpu-c"
    assert noise(land, "bench_serving") is None                                     # one launch per machine


def test_the_real_relaunch_reads_as_a_launch_shift_for_the_real_client() -> None:
    from bench.fit_card import noise
    land = landscape.load(Path(__file__).resolve().parents[1] / "docs" / "real-gpu" / "landscapes" / "llama8b-h100"
                          / "landscape.json")
    got = noise(land, "bench_serving")
    # c02's two launches (lease 2, lease 3): the real client read the second 3.6-3.8% lower at every level, so the
    # shift is the launch's and what is left per level is an order of magnitude smaller
    assert got is not None and got["configs"] >= 1
    assert got["launch"] > 5 * got["level"]


def test_twins_that_differ_only_in_passenger_knobs_read_as_relaunches_and_split_eager_from_graphed() -> None:
    from bench.fit_card import eager, noise
    land = landscape.load(REAL / "landscape.json")
    passengers = ("chunked-prefill-size", "kv-cache-dtype")       # measured to act on nothing in this table
    alone, twins = noise(land, "bench_serving"), noise(land, "bench_serving", passengers)
    assert alone is not None and twins is not None and twins["configs"] > alone["configs"]
    graphed = noise(land, "bench_serving", passengers, lambda f: not eager(f))
    eagerly = noise(land, "bench_serving", passengers, eager)
    # graphed: c02's relaunch and the pairs c01/c10, c02/c05, c04/c07, c08/c11 (0-5% apart); eager: c00/c03 and
    # c06/c09 (up to 48% apart): the card's launch and launch_eager (sim/cards/llama31-8b-h100.yaml)
    assert graphed is not None and eagerly is not None
    assert graphed["configs"] == 4 and eagerly["configs"] == 2
    assert graphed["launch"] < 0.03 and eagerly["launch"] > 4 * graphed["launch"]
    card = load_card("llama31-8b-h100").noise
    assert card.launch == pytest.approx(graphed["launch"], abs=0.002)
    assert card.launch_eager == pytest.approx(eagerly["launch"], abs=0.002)
    # a knob that acts is no passenger: without the twins no eager config was launched twice
    assert noise(land, "bench_serving", (), eager) is None


def test_configs_read_on_two_machines_give_the_machine_noise_the_h100_card_plays():
    """Lease 8's relaunch of c05 ran on a sixth H100, lease 7's c17 on a fifth, lease 6 on a fourth and lease 5's
    c12 on a third; each has twins on the first half's machine (differing only in knobs that act on nothing here):
    per pair of machines and level the log difference, graphed and eager levels apart. Graphed levels move a few
    percent, eager ones several times more (the host launches the kernels): the card's `noise.machine` and
    `noise.machine_eager` are these figures."""
    from bench.fit_card import eager_at, machine_noise
    land = landscape.load(REAL / "landscape.json")
    passengers = ("chunked-prefill-size", "kv-cache-dtype")
    m = machine_noise(land, "bench_serving", passengers)
    assert m is not None and m["machines"] == 5 and m["pairs"] >= 11
    assert m["levels"]["graphed"] >= 20 and m["levels"]["eager"] >= 13
    assert m["machine"] < 0.08 and m["machine_eager"] > 2.5 * m["machine"]
    card = load_card("llama31-8b-h100").noise
    assert card.machine == pytest.approx(m["machine"], abs=0.003)
    assert card.machine_eager == pytest.approx(m["machine_eager"], abs=0.003)
    # without the twins one config was read on two machines (c05, its relaunch on the sixth card; c02's relaunch
    # ran on the machine of its first launch): graphed levels only, and they move as the twins say
    alone = machine_noise(land, "bench_serving")
    assert alone is not None and (alone["machines"], alone["pairs"], alone["machine_eager"]) == (2, 1, None)
    assert abs(alone["machine"] - m["machine"]) < 0.01
    # a level decodes eager with graphs off, or where its batch (capped by max-running) exceeds the graphs' max bs
    graphs32 = {"cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 32, "max-running-requests": 64}
    assert not eager_at(graphs32, 16) and eager_at(graphs32, 64) and eager_at(graphs32, 256)
    assert not eager_at({**graphs32, "max-running-requests": 32}, 256)
    assert eager_at({"cuda-graph-backend-decode": "disabled"}, 16)
