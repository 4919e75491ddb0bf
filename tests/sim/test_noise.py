"""The noise the stand-in plays (sim/noise.py): calibrated to the real GPU's launch-to-launch spread, the same for
the same seed, none at `noise=0` (the card's true value), and drawn per launch and per stretch of work."""
from __future__ import annotations

import math
import statistics

import pytest

from tunectl.sim.card import Noise
from tunectl.sim.model import virtual_ladder
from tunectl.sim.noise import Speed, machine_state
from tunectl.stats import pair_noise

CARD = "glm5-nvfp4-8x-rtx-pro-6000"
SEEDS_CFG = {"disable-cuda-graph": True, "max-running-requests": 2048, "disable-radix-cache": True}
AUTOTUNE = ["0001-flashinfer-cutlass-autotune"]


def _peak(seed: int, noise: float = 1.0) -> float:
    return virtual_ladder(CARD, SEEDS_CFG, patches=AUTOTUNE, seed=seed, noise=noise, levels=[128, 256],
                          min_prompts=2).best


def test_launches_spread_like_the_real_gpu_and_centre_on_the_true_value() -> None:
    true = _peak(0, noise=0.0)
    peaks = [_peak(s) for s in range(24)]
    sd = statistics.stdev(peaks) / statistics.fmean(peaks)
    assert 0.03 < sd < 0.08                          # docs/real-gpu.md: 9-10% spread of three launches ~ 5.5% sd
    assert abs(statistics.fmean(peaks) / true - 1) < 0.04
    assert len({round(p, 6) for p in peaks}) == len(peaks)          # every launch draws its own


def test_the_same_seed_reads_the_same_and_no_noise_reads_the_model() -> None:
    assert _peak(7) == _peak(7)
    assert _peak(3, noise=0.0) == _peak(5, noise=0.0)


def test_the_speed_drifts_with_the_work_done_not_with_time() -> None:
    speed = Speed(Noise(launch=0.05, level=0.03, period_s=1.0), seed="x")
    first = [speed(100.0) / 100.0 for _ in range(10)]            # 1 modeled second of work: one drift draw
    later = [speed(100.0) / 100.0 for _ in range(10)]            # the next second: another
    assert len(set(first)) == 1 and len(set(later)) == 1 and first[0] != later[0]
    again = Speed(Noise(launch=0.05, level=0.03, period_s=1.0), seed="x")
    assert [again(100.0) / 100.0 for _ in range(20)] == first + later
    assert Speed(Noise(launch=0.05, level=0.03, period_s=1.0), seed="y").launch != speed.launch


def test_eager_steps_move_with_their_own_launch_spread_in_step_with_the_graphed_ones() -> None:
    """A card with `launch_eager` (the real H100: eager launches 15-48% apart where graphed ones moved 0-5%): an
    eager decode step takes the launch's factor at that sd, the same draw's sign; a card without it plays one
    factor for both (the cards' draws unchanged)."""
    both = Noise(launch=0.02, launch_eager=0.12, level=0.0)
    graphed, eager = [], []
    for seed in range(200):
        s = Speed(both, seed)
        graphed.append(s(10.0) / 10.0)
        eager.append(s(10.0, eager=True) / 10.0)
        assert (graphed[-1] - 1.0) * (eager[-1] - 1.0) >= 0          # a slow launch is slow in both modes
        plain = Speed(Noise(launch=0.02, level=0.0), seed)
        assert plain(10.0) == plain(10.0, eager=True) == s.launch * 10.0
    sd = lambda xs: statistics.pstdev(math.log(x) for x in xs)      # noqa: E731
    assert 0.015 < sd(graphed) < 0.025 and 0.10 < sd(eager) < 0.14


def test_on_the_fitted_h100_card_eager_configs_spread_wider_between_launches_than_graphed_ones() -> None:
    def peaks(cfg: dict) -> list[float]:
        return [virtual_ladder("llama31-8b-h100", cfg, seed=s, levels=[16, 64], min_prompts=2).best
                for s in range(12)]
    graphed = peaks({"cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 256})
    eager = peaks({"cuda-graph-backend-decode": "disabled"})
    rel = lambda xs: statistics.stdev(xs) / statistics.fmean(xs)      # noqa: E731
    assert rel(eager) > 3 * rel(graphed)


def test_the_machine_state_holds_for_launches_next_to_each_other_and_changes_over_a_campaign() -> None:
    """`noise.machine` (a real H200 stepped 12% at 256 streams mid-lease): launch k reads the state begun at the
    last step before it, a new one about every `machine_launches` launches; off (1.0) unless the card sets it."""
    states = [machine_state("s", k, 0.07, 6) for k in range(3000)]
    runs = [k for k in range(1, 3000) if states[k] != states[k - 1]]
    assert 3000 / 6 * 0.8 < len(runs) < 3000 / 6 * 1.2                   # a step every ~6 launches
    distinct = [states[0]] + [states[k] for k in runs]
    assert 0.06 < statistics.pstdev(math.log(x) for x in distinct) < 0.08
    assert machine_state("s", 12, 0.07, 6) == states[12]                  # the same seed, the same campaign
    assert machine_state("s", 12, 0.0, 6) == 1.0 and Noise().machine == 0.0
    plain = Speed(Noise(launch=0.02, level=0.0), 5)
    assert plain.launch == Speed(Noise(launch=0.02, level=0.0), 5, machine=("s", 12)).launch


def test_a_machine_state_moves_eager_steps_more_than_graphed_ones_where_the_card_says_so() -> None:
    """`noise.machine_eager` (a fourth real H100 read graphed twins 5-8% and eager ones 14-44% below the first
    machine's): each state's one draw, at `machine` on graphed steps and at `machine_eager` on eager ones, the same
    sign; a card without it plays one state for both, the graphed draw unchanged by the field."""
    both = Noise(launch=0.0, level=0.0, machine=0.045, machine_eager=0.21, machine_launches=1)
    graphed, eager = [], []
    for k in range(400):
        s = Speed(both, 7, machine=("m", k))
        graphed.append(s(10.0) / 10.0)
        eager.append(s(10.0, eager=True) / 10.0)
        assert (graphed[-1] - 1.0) * (eager[-1] - 1.0) >= 0                # a slow machine is slow in both modes
        assert graphed[-1] == pytest.approx(machine_state("m", k, 0.045, 1))   # the graphed draw: as before
        plain = Speed(Noise(launch=0.0, level=0.0, machine=0.045, machine_launches=1), 7, machine=("m", k))
        assert plain(10.0) == plain(10.0, eager=True) == pytest.approx(10.0 * graphed[-1])
    sd = lambda xs: statistics.pstdev(math.log(x) for x in xs)      # noqa: E731
    assert 0.038 < sd(graphed) < 0.052 and 0.18 < sd(eager) < 0.24


def test_on_the_fitted_h100_card_another_machine_moves_an_eager_config_more_than_a_graphed_one() -> None:
    def peaks(cfg: dict) -> list[float]:
        return [virtual_ladder("llama31-8b-h100", cfg, seed=1, levels=[16, 64], min_prompts=2,
                               machine=("m", 6 * k)).best for k in range(12)]
    graphed = peaks({"cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 256})
    eager = peaks({"cuda-graph-backend-decode": "disabled"})
    rel = lambda xs: statistics.stdev(xs) / statistics.fmean(xs)      # noqa: E731
    assert rel(eager) > 2.5 * rel(graphed) and rel(graphed) > 0.01


def test_pairs_of_stand_in_launches_cancel_the_machines_drift_and_measure_it() -> None:
    """Two configs (the autotune patch on and off) launched W B B W ... on a machine that drifts (the card's launch
    sd 2%, machine 8%, a state every 8 launches): the pairs' means read the drift and their ratios the launch
    spread (at least the card's; a step between a pair's two launches counts there too), and the paired gain stays
    within 2% of the noise-free one."""
    from tunectl.sim.model import load_card

    card = load_card(CARD).model_copy(deep=True)
    card.noise.launch, card.noise.level, card.noise.machine, card.noise.machine_launches = 0.02, 0.0, 0.08, 8

    def peak(patches: list[str], k: int, noise: float = 1.0) -> float:
        return virtual_ladder(card, SEEDS_CFG, patches=patches, seed=1000 + k, noise=noise, levels=[256],
                              min_prompts=2, machine=("m", k)).best

    order = [i for p in range(60) for i in ((0, 1) if p % 2 == 0 else (1, 0))]
    sides = (AUTOTUNE, [])
    reads = [peak(sides[c], k) for k, c in enumerate(order)]
    pairs = [(reads[k], reads[k + 1]) if order[k] == 0 else (reads[k + 1], reads[k]) for k in range(0, 120, 2)]
    launch, drift = pair_noise(pairs)
    assert 0.017 < launch < 0.045 and 0.05 < drift < 0.11
    true = peak(AUTOTUNE, 0, 0.0) / peak([], 0, 0.0)
    assert true > 1.1
    paired = math.exp(statistics.fmean(math.log(a / b) for a, b in pairs))
    assert abs(paired / true - 1) < 0.02


def test_the_live_server_takes_its_place_in_the_campaign_from_tunectls_run_id(monkeypatch) -> None:
    """The live stand-in's machine state is indexed by tunectl's trial (the `-t<n>-` of TUNECTL_RUN_ID), as the
    virtual clock's is by `n`: a study's launches on the stand-in drift as the virtual ones do."""
    from types import SimpleNamespace

    from tunectl.runners.server.plan import make_run_id
    from tunectl.sim.launch_server import machine_key

    ns = SimpleNamespace(sim_seed=3)
    monkeypatch.setenv("TUNECTL_RUN_ID", make_run_id("my-study-t9", 17))
    assert machine_key(ns) == (3, 17)
    monkeypatch.delenv("TUNECTL_RUN_ID")
    assert machine_key(ns) == (3, 0)


def test_labelled_machine_states_are_recorded_as_the_machines_trials_ran_on() -> None:
    """bench --truth --label-machines: each machine state a machine of its own in the trial record (as the GPUs of a
    resumed study are), one label per state; off (the default) and noise-free: no machine, as the stand-in has."""
    from pathlib import Path

    from tunectl.profile import load_profile
    from tunectl.sim.noise import machine_start
    from tunectl.wiring.virtual import VirtualEvaluator

    prof = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "sim-llama8b-h200.yaml")
    ev = VirtualEvaluator(prof, 3)
    assert ev.card.noise.machine > 0
    params = {k: s.default for k, s in prof.search.space.items() if s.default is not None}
    assert ev(0, params, "search").machine == ""
    ev.label_machines = True
    got = [ev(n, params, "search").machine for n in range(40)]
    starts = [machine_start(3, n, ev.card.noise.machine_launches) for n in range(40)]
    assert got == [f"sim machine {k}" for k in starts]
    assert 2 <= len(set(got)) < 40                                    # states hold for several launches, and change
    assert VirtualEvaluator(prof, 3, noise=0.0)(5, params, "search").machine == ""
