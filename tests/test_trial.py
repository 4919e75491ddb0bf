"""run_trial on the stand-in: results written as it goes, launch.json reproduces the launch, crash and prune paths,
an interrupted trial leaves readable results and no process behind."""
from __future__ import annotations

import json
import sys

import pytest
import yaml

from tests.runners.test_lifecycle import group_pids, run_pids, sim_profile
from tunectl.runners.hosts.local import LocalRunner
from tunectl.sim import args as sim_args
from tunectl.store import StudyStore, load_frames
from tunectl.wiring.trial import TrialContext, run_trial

SEEDS = {"disable-cuda-graph": True, "max-running-requests": 2048, "disable-radix-cache": True,
         "moe-runner-backend": "flashinfer_cutlass", "flashinfer-cutlass-autotune": True}


def ctx(tmp_path, levels, **overrides):
    prof = sim_profile(tmp_path, **overrides)
    return TrialContext(prof, LocalRunner(), StudyStore("t", tmp_path / "results"), levels=levels)


def test_ok_trial_writes_everything(tmp_path):
    c = ctx(tmp_path, [1, 16])
    events = []
    r = run_trial(c, 0, {"max-running-requests": 128}, "sweep", lambda k, d: events.append(k))
    assert r.status == "ok" and [lv.status for lv in r.levels] == ["ok", "ok"]
    assert r.levels[1].output_throughput > r.levels[0].output_throughput > 0
    d = c.store.trial_dir(0)
    assert {p.name for p in d.iterdir()} >= {"trial.json", "launch.json", "config.yaml", "server.log", "levels"}
    assert sorted(p.name for p in (d / "levels").iterdir()) == ["random-c1.json", "random-c16.json"]
    back = c.store.read_trial(0)
    assert back.best_output_throughput == r.best_output_throughput and back.teardown["verdict"] == "clean"
    assert "The server is fired up and ready to roll!" in (d / "server.log").read_text()
    assert ["plan", "launch", "ready", "level_start", "level", "level_start", "level", "teardown", "done"] == [
        e for e in events if e != "milestone"]
    frames = load_frames(c.store)
    assert list(frames["levels"]["concurrency"]) == [1, 16]


def test_launch_json_argv_reproduces_the_launch(tmp_path):
    c = ctx(tmp_path, [1])
    run_trial(c, 0, {"max-running-requests": 256, "disable-radix-cache": True, "cuda-graph-max-bs": 64})
    launch = json.loads((c.store.trial_dir(0) / "launch.json").read_text())
    argv = launch["argv"]
    assert argv[:3] == [sys.executable, "-m", "tunectl.sim.launch_server"]
    assert yaml.safe_load((c.store.trial_dir(0) / "config.yaml").read_text()) == launch["config"]
    # the by-hand command line parses to exactly what the --config launch parsed to
    by_hand = vars(sim_args.parse(argv[3:]))
    cfg = tmp_path / "config.yaml"
    cfg.write_text((c.store.trial_dir(0) / "config.yaml").read_text())
    launched = vars(sim_args.parse(["--config", str(cfg), *launch["exec_argv"][5:]]))
    assert by_hand == launched
    assert by_hand["max_running_requests"] == 256 and by_hand["disable_radix_cache"] is True
    assert launch["env"]["SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION"] == "1"
    assert launch["env"]["no_proxy"] == "127.0.0.1,localhost,::1"
    assert launch["env"]["TUNECTL_RUN_ID"] == launch["run_id"]


def test_seeds_config_crashes_under_load_with_evidence(tmp_path):
    # The seeds: page_table_1_flattened at 512, and at 256 on one run of two. Steady-state levels run several
    # waves, so the crash may come at 256 already; either way it is the same finding.
    c = ctx(tmp_path, [64, 256, 512])
    r = run_trial(c, 0, SEEDS)
    assert r.status == "crashed"
    at = r.crashed_level
    assert at in (256, 512)
    assert [(lv.concurrency, lv.status) for lv in r.levels] == [
        (lv, "ok") for lv in (64, 256) if lv < at] + [(at, "crashed")]
    assert r.max_stable_concurrency == (64 if at == 256 else 256)
    assert r.crash.signature == "page_table_1_flattened" and r.crash.exit_code == 137
    assert r.launch.env["TUNECTL_SIM_PATCHES"] == "0001-flashinfer-cutlass-autotune"
    saved = json.loads((c.store.trial_dir(0) / "levels" / f"random-c{at}.json").read_text())
    assert saved["crash"]["exception_line"].startswith("AttributeError: 'PrefillMetadata'")
    assert run_pids(r.launch.run_id) == []


def test_should_prune_stops_after_the_level(tmp_path):
    c = ctx(tmp_path, [1, 4, 16])
    seen = []
    r = run_trial(c, 0, {}, "search", should_prune=lambda lv: seen.append(lv.concurrency) or lv.concurrency == 4)
    assert r.status == "pruned" and seen == [1, 4] and [lv.concurrency for lv in r.levels] == [1, 4]


def test_dirty_host_is_an_infra_result(tmp_path):
    import socket

    c = ctx(tmp_path, [1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", c.profile.server.port))
        s.listen()
        r = run_trial(c, 0, {})
    assert r.status == "infra" and r.crash.cls == "infra"
    assert "is held by pid" in r.crash.message
    assert c.store.read_trial(0).status == "infra"


def test_interrupted_trial_leaves_results_and_no_process(tmp_path):
    c = ctx(tmp_path, [1, 4, 16])
    seen = {}

    def on_event(kind, data):
        if kind == "launch":
            seen["pgid"] = data["pgid"]
        if kind == "level":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_trial(c, 0, {}, on_event=on_event)
    t = c.store.read_trial(0)
    assert t.status == "interrupted" and [lv.concurrency for lv in t.levels] == [1]
    assert group_pids(seen["pgid"]) == [] and run_pids(t.launch.run_id) == []  # teardown ran on the way out


def test_frames_keep_integer_columns_integers_where_some_trials_have_none() -> None:
    import pandas as pd

    from tunectl.store import _frame

    df = _frame(pd, [{"trial": 0, "max_stable_concurrency": 512, "tps": 2483.0},
                     {"trial": 1, "max_stable_concurrency": None, "tps": 1000.5}])
    assert str(df["max_stable_concurrency"].dtype) == "Int64" and df["max_stable_concurrency"][0] == 512
    assert df["tps"].dtype == float and str(df["trial"].dtype) == "int64"   # a float column stays float
