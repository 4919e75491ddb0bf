"""bench/fit_card.py: a card's timings fitted to part of a landscape are checked on the configs held out; on the
fixture measured on the stand-in's own card (tests/fixtures/landscape/make.py), a card whose timings were thrown off
is brought back."""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.fit_card import Fit, errors, main_effects, scaled
from tunectl import landscape
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
