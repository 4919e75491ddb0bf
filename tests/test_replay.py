"""The replay engine: a measured landscape served as a virtual one (tunectl/wiring/replay.py), on the fixture measured by
the real `tunectl sweep` on the stand-in (tests/fixtures/landscape/make.py)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from tunectl.errors import UsageError
from tunectl.wiring import landscape
from tunectl.wiring.replay import Replay, ReplayEvaluator, Unmeasured, replay_profile

FX = Path(__file__).resolve().parent / "fixtures" / "landscape" / "fx"


@pytest.fixture(scope="module")
def land() -> dict:
    return landscape.convert(FX)


def cfg(land: dict, cid: str) -> dict:
    return next(c for c in land["configs"] if c["id"] == cid)


def test_a_replayed_config_returns_its_measured_levels(land: dict) -> None:
    prof = replay_profile(land)
    ev = ReplayEvaluator(prof, Replay(land, noise="none"))
    c02 = cfg(land, "c02")
    res = ev(1, dict(c02["set"]), "search")
    assert res.status == "ok" and [lv.concurrency for lv in res.levels] == [16, 64]
    assert [lv.output_throughput for lv in res.levels] == [c02["levels"]["builtin"][k]["mean"] for k in ("16", "64")]
    assert res.levels[1].metrics["p99_ttft_ms"] == c02["launches"][0]["levels"]["builtin"]["64"]["p99_ttft_ms"]
    assert res.ready_s == c02["launches"][0]["ready_s"] and res.best_output_throughput == c02["value"]


def test_a_crashed_config_returns_its_class(land: dict) -> None:
    ev = ReplayEvaluator(replay_profile(land), Replay(land))
    c01 = cfg(land, "c01")
    res = ev(1, dict(c01["set"]), "search")
    assert res.status == "crashed" and res.levels == []
    assert (res.crash.cls, res.crash.signature, res.crash.phase) == (
        c01["crash"]["cls"], c01["crash"]["signature"], "startup")


def test_readings_of_a_relaunched_config_are_its_launches(land: dict) -> None:
    replay = Replay(land)
    c00 = cfg(land, "c00")
    measured = c00["levels"]["builtin"]["64"]["values"]
    reads = [replay.reading(c00["set"], random.Random(seed))[1][1]["value"] for seed in range(30)]
    assert set(reads) <= set(measured) and len(set(reads)) > 1
    again = [replay.reading(c00["set"], random.Random(seed))[1][1]["value"] for seed in range(30)]
    assert reads == again                                              # seeded


def test_a_config_launched_once_reads_within_the_landscape_spread(land: dict) -> None:
    replay = Replay(land)
    c02 = cfg(land, "c02")
    mean, cv = c02["levels"]["builtin"]["16"]["mean"], land["spread"]["builtin"]["16"]["median_cv"]
    reads = [replay.reading(c02["set"], random.Random(seed))[1][0]["value"] for seed in range(40)]
    assert cv > 0 and len(set(reads)) > 1
    assert all(mean * (1 - 2 * cv) - 1e-6 <= r <= mean * (1 + 2 * cv) + 1e-6 for r in reads)


def test_an_unmeasured_config_is_a_clear_error_or_counted(land: dict) -> None:
    c07 = cfg(land, "c07")
    with pytest.raises(Unmeasured) as e:
        Replay(land).lookup(c07["set"])
    msg = str(e.value)
    assert "was not measured" in msg and "7 of 8" in msg and "nearest measured" in msg and "\n" not in msg
    ev = ReplayEvaluator(replay_profile(land), Replay(land))
    res = ev(3, dict(c07["set"]), "search")
    assert res.status == "pruned" and res.levels == [] and ev.unmeasured == 1
    with pytest.raises(Unmeasured):
        ReplayEvaluator(replay_profile(land), Replay(land), unmeasured="error")(3, dict(c07["set"]), "search")


def test_the_replay_profile_is_the_tables_space(land: dict) -> None:
    prof = replay_profile(land)
    space = prof.search.space
    assert set(space) == {"disable-cuda-graph", "max-running-requests", "mem-fraction-static", "cuda-graph-max-bs"}
    assert space["max-running-requests"].choices == [64, 512]
    assert space["cuda-graph-max-bs"].conditions == {"disable-cuda-graph": False}
    assert space["disable-cuda-graph"].conditions == {}
    assert {k: s.default for k, s in space.items()} == cfg(land, "c00")["set"]
    assert prof.bench.levels == [16, 64] and prof.search.try_first == []


def test_pruning_stops_the_ladder(land: dict) -> None:
    ev = ReplayEvaluator(replay_profile(land), Replay(land, noise="none"))
    res = ev(1, dict(cfg(land, "c04")["set"]), "search", should_prune=lambda lv: lv.concurrency == 16)
    assert res.status == "pruned" and [lv.concurrency for lv in res.levels] == [16]


def test_true_value_and_best(land: dict) -> None:
    replay = Replay(land)
    best, where = replay.best()
    assert best == max(c["value"] for c in land["configs"] if c["outcome"] == "ok")
    assert replay.true_value(where) == best and replay.true_value(cfg(land, "c01")["set"]) == 0.0


def test_the_search_loop_runs_on_the_replay(land: dict, tmp_path: Path) -> None:
    """The real loop (`run_search`) with the replay as its trial engine: every trial it ran is a table config (or
    counted unmeasured), a crash it met is the table's, and its winner is a measured config that served."""
    import optuna

    from tunectl.search.study import open_storage
    from tunectl.wiring.study import run_search

    prof = replay_profile(land)
    replay = Replay(land)
    ev = ReplayEvaluator(prof, replay, seed=3)
    url = "memory:replay-test"
    out = run_search(prof, trials=8, root=tmp_path, evaluate=ev, seed=3, storage_url=url)
    assert out.best is not None and replay.lookup(out.best["params"])["outcome"] == "ok"
    trials = [t for t in optuna.load_study(study_name=prof.name, storage=open_storage(url)).trials
              if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("status") in ("ok", "crashed")]
    assert len(trials) >= 5
    for t in trials:
        cfg = replay.lookup(t.params)
        assert (t.user_attrs.get("crash_signature") is not None) == (cfg["outcome"] == "crash")
        if cfg["outcome"] == "crash":
            assert t.user_attrs["crash_signature"] == cfg["crash"]["signature"]


def _by_hand(replay: Replay, c: dict, key: str, limit: float) -> float:
    """A config's value under `key <= limit`: the best level whose latency, averaged over the launches, holds."""
    out = 0.0
    for level, summary in c["levels"][replay.client].items():
        seen = [launch["levels"][replay.client][level][key] for launch in c["launches"]
                if launch["levels"].get(replay.client, {}).get(level, {}).get(key) is not None]
        if seen and sum(seen) / len(seen) <= limit:
            out = max(out, summary["mean"])
    return out


@pytest.mark.parametrize("key", ["median_tpot_ms", "p99_ttft_ms"])
def test_true_value_under_an_slo_is_the_best_level_that_meets_it(land: dict, key: str) -> None:
    """Judged under an SLO (`bench/search_efficiency.py --landscape ... --slo KEY=MS`), a config is worth its best
    level whose latency (the mean over its launches) holds, as a study with `objective.slo` scores it; a limit in
    the middle of the table's latencies moves some configs' values and none up."""
    replay = Replay(land)
    ok = [c for c in land["configs"] if c["outcome"] == "ok"]
    seen = sorted(launch["levels"][replay.client][lv][key] for c in ok for launch in c["launches"]
                  for lv in launch["levels"].get(replay.client, {})
                  if launch["levels"][replay.client][lv].get(key) is not None)
    limit = seen[len(seen) // 2]
    prof = replay_profile(land)
    prof.objective = prof.objective.model_copy(update={"slo": {key: limit}})
    values = {c["id"]: replay.true_value(c["set"], prof) for c in ok}
    assert values == {c["id"]: pytest.approx(_by_hand(replay, c, key, limit)) for c in ok}
    assert all(values[c["id"]] <= replay.true_value(c["set"]) for c in ok)
    assert any(values[c["id"]] < replay.true_value(c["set"]) for c in ok)
    assert replay.best(prof)[0] == max(values.values())
    with pytest.raises(UsageError, match="p99_tpot_ms"):
        replay.check_slo({"p99_tpot_ms": 50.0})
