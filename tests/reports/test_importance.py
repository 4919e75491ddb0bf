"""Parameter importance on pooled values: a lucky single reading does not rank a knob first, and where no knob's
effect stands out of the launch-to-launch noise the report says so instead of ranking."""
from __future__ import annotations

import random
from typing import Any

from tunectl.models import LevelResult, TrialResult
from tunectl.reports.importance import importance


def _trial(n: int, params: dict[str, Any], value: float, role: str = "search") -> TrialResult:
    lv = LevelResult(512, "ok", "random", completed=512, duration_s=10.0, metrics={"output_throughput": value})
    return TrialResult(trial=n, status="ok", params=dict(params), role=role, levels=[lv])


def _study(effect: float, lucky: bool, noise: float = 0.05, seed: int = 0) -> list[TrialResult]:
    """`patch` multiplies the value by 1 + effect; `chunk` does nothing; readings carry `noise`. `lucky`: one
    config read 40% high once, then normal on its two reruns."""
    rng, out = random.Random(seed), []
    for i in range(24):
        params = {"patch": i % 2 == 0, "chunk": (4096, 8192, 16384)[i % 3]}
        true = 1000 * (1 + effect * params["patch"])
        out.append(_trial(i, params, true * rng.gauss(1, noise)))
    if lucky:
        params = {"patch": False, "chunk": 16384, "extra": 1}
        out += [_trial(30, params, 1400), _trial(31, params, 1000, "finalist"), _trial(32, params, 1000, "finalist")]
    return out


def test_a_real_effect_is_ranked_and_a_lucky_reading_does_not_rank_its_knob() -> None:
    got = importance(_study(effect=0.4, lucky=True), noise=0.05)
    assert list(got["values"])[0] == "patch"
    assert "chunk" not in got["values"] and "chunk" in got["swamped"]


def test_an_effect_inside_the_noise_gives_no_ranking_and_says_so() -> None:
    got = importance(_study(effect=0.01, lucky=False, noise=0.08), noise=0.08)
    assert got["values"] == {} and got["note"].startswith("noise swamps the effect")
