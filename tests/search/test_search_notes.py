"""What `tunectl search` says about itself: --parallel N beyond the hosts' GPU slots is said (not silently one at a
time), trial numbers that skip (Optuna numbers proposals dropped before they ran) are explained, and the winner's
line says after how many search trials it was found, not "trial 18 ... first seen at search trial 19"."""
from __future__ import annotations

from pathlib import Path

from tests.reports.fixtures import BEST_TRIAL, build_search_study, make_trial, write_trial
from tunectl.commands.search import numbers_line, parallel_line, show
from tunectl.wiring.parallel import Fleet
from tunectl.profile import default_profile_path, load_profile
from tunectl.runners.hosts.local import LocalRunner
from tunectl.store import StudyStore


def test_parallel_beyond_the_slots_is_said(tmp_path: Path) -> None:
    prof = load_profile(default_profile_path())           # the stand-in's 8 GPUs, tp-size 8: one slot
    events: list[tuple[str, dict]] = []
    runner = LocalRunner()
    try:
        fleet = Fleet(prof, [runner], StudyStore("s", tmp_path), None, lambda k, d: events.append((k, d)), 2)
        assert fleet.width == 1
        Fleet(prof, [runner], StudyStore("s", tmp_path), None, lambda k, d: events.append((k, d)), 1)
    finally:
        runner.close()
    assert events == [("parallel_capped", {"asked": 2, "slots": 1, "gpus_per_trial": 8})]
    assert parallel_line(events[0][1]).startswith("--parallel 2: trials run one at a time: the hosts have 1 GPU "
                                                  "slot of 8 GPUs")


def _out(store: StudyStore, trials: int, to_best: int) -> dict:
    return {"study": store.name, "trials": trials, "crashed": 2, "pruned": 1, "duplicates": 0, "retries": 0,
            "wall_s": 10.0, "saved_s": 0.0, "best": store.read_best()["best"], "trials_to_best": to_best,
            "results_dir": str(store.dir), "storage": "sqlite:///study.db"}


def test_skipped_trial_numbers_and_the_winner_line_are_said(tmp_path: Path, capsys) -> None:
    store = build_search_study(tmp_path)
    n_before = len(store.trials())
    assert numbers_line(store.trials()) is None                      # numbers without gaps: nothing to say
    write_trial(store, make_trial(40, "search", "ok", {"disable-cuda-graph": False, "max-running-requests": 128,
                                                       "moe-runner-backend": "triton"}, 700.0, None, None))
    show(_out(store, 9, BEST_TRIAL + 1), tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    assert f"trial numbers run to 40: {40 + 1 - (n_before + 1)} of them went to proposals dropped" in out
    assert f"{n_before + 1} trials ran" in out
    assert f"best: trial {BEST_TRIAL}," in out and f"(found after {BEST_TRIAL + 1} of 9 search trials)" in out
    assert "first seen at" not in out
