"""The holdouts (docs/search.md, "The holdout"): the default bench set never runs their profiles, and each space is
its own grid, so the exhaustive scan that gives its target covers every config the search can propose. Every
`profiles/holdout-*.yaml` is checked, the current holdout and the ones that became seen."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.search_efficiency import one_per_card
from tunectl.profile import load_profile
from tunectl.search.space import GRID_POINTS, grid_space
from tunectl.sim.card import load_card

ROOT = Path(__file__).resolve().parents[2]
HOLDOUTS = sorted((ROOT / "profiles").glob("holdout-*.yaml"))


def test_there_are_holdouts_and_each_plays_its_own_card() -> None:
    assert len(HOLDOUTS) >= 2
    cards = [load_profile(p).server.sim.card for p in HOLDOUTS]
    assert len(set(cards)) == len(cards)


@pytest.mark.parametrize("holdout", HOLDOUTS, ids=lambda p: p.stem)
def test_the_default_bench_set_never_runs_the_holdout(holdout: Path) -> None:
    card = load_profile(holdout).server.sim.card
    default = one_per_card()
    assert default and all(load_profile(p).server.sim.card != card for p in default)


@pytest.mark.parametrize("holdout", HOLDOUTS, ids=lambda p: p.stem)
def test_the_holdout_space_is_its_grid_and_holds_the_documented_best(holdout: Path) -> None:
    prof = load_profile(holdout)
    grid = grid_space(prof.search, points=GRID_POINTS)
    for name, spec in prof.search.space.items():
        if spec.type != "bool" and spec.choices is None:           # a range: every step of it on the grid
            assert spec.step and not spec.log, name
            assert len(grid[name]) == round((spec.high - spec.low) / spec.step) + 1, name
    best = load_card(prof.server.sim.card).landscape.best_stable
    assert best.profile == f"profiles/{holdout.name}"
    assert all(value in grid[flag] for flag, value in best.flags.items())
