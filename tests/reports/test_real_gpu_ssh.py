"""tunectl over SSH to real SGLang 0.5.17 on an H200 with a tiny MoE (docs/real-gpu.md, docs/real-gpu/ssh-moe/):
what the campaign recorded still reads the same through today's code: the check, the link cut, the MoE search
and its crash (re-read with today's catalog), the patch round trip, default vs winner with the real client."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.sglang.crashes.classifier import LogWatcher, classify
from tunectl.runners.checks.patches import load_manifest
from tunectl.store import StudyStore

DIR = Path(__file__).resolve().parents[2] / "docs" / "real-gpu" / "ssh-moe"
RESULTS = DIR / "results"
PATCH_LINE = "tunectl patch 0003: moe_runner_backend=auto, moe_a2a_backend=none, flashinfer_autotune=on"
PRISTINE = "e903bc2ca42a70694ee685f7b4744b7f967458420410295061b0dc35160db334"   # the 0.5.17 wheel's moe/utils.py
PATCHED = "48039cc21c16255cbcfb3f55e26e5d0eb7e4d33e9c88e69ddbda8f744952df7d"    # ... with patch 0003 applied


def doc(name: str) -> dict:
    return json.loads((DIR / name).read_text())


def test_check_over_ssh_passed_everything_on_the_gpu_host() -> None:
    text = (DIR / "check.txt").read_text()
    assert "all 10 checks passed" in text and "ssh:h200 reachable, host key trusted" in text
    assert "sglang 0.5.17" in text and "0: 0/143771 MiB" in text and "1 patch(es) apply to sglang 0.5.17" in text


def test_link_cut_mid_ladder_is_infra_and_the_server_was_found_and_torn_down() -> None:
    d = doc("sweep-cut.json")
    assert d["host"] == "ssh:h200" and d["status"] == "infra"
    assert (d["crash"]["cls"], d["crash"]["signature"], d["crash"]["level"]) == ("infra", "link_lost", 64)
    first, cut = d["levels"]
    assert first["status"] == "ok" and first["completed"] == 32 and first["metrics"]["output_throughput"] > 1000
    assert cut["status"] == "failed" and cut["failed_requests"] > 0          # lost to the link
    assert d["teardown"]["verdict"] == "clean" and d["teardown"]["exit_code"] == 137
    steps = (DIR / "steps.log").read_text()
    assert "cut 1 SSH session(s)" in steps
    assert (DIR / "gpu-sweep.csv").read_text().strip() == "0, 0 MiB, 143771 MiB"
    assert (DIR / "apps-sweep.csv").read_text().strip() == ""


def test_patch_round_trip_under_a_running_server() -> None:
    sweep = StudyStore("ssh-sweep", RESULTS).trials()[0]
    assert sweep.patch_hashes == {"0003-log-moe-runner": load_manifest()["0003-log-moe-runner"].sha256}
    assert PATCH_LINE in (DIR / "patch-line-live.txt").read_text()          # read while the server was serving
    steps = {ln.split(" sha256 ")[1].split(":")[0]: ln.rsplit(" ", 1)[1]
             for ln in (DIR / "steps.log").read_text().splitlines() if " sha256 " in ln}
    assert steps["before-anything"] == steps["after-search"] == steps["after-default"] == PRISTINE
    assert steps["while-serving"] == steps["after-winner"] == PATCHED
    search = StudyStore("ssh-moe-search", RESULTS)
    for t in search.trials():                          # applied where the trial asked for it, reverted where not
        log = (search.trial_dir(t.trial) / "server.log").read_text()
        if t.crash is None:
            assert (PATCH_LINE in log) == bool(t.params.get("log-moe-runner", True)), t.trial
            assert bool(t.patch_hashes) == bool(t.params.get("log-moe-runner", True)), t.trial


def test_moe_search_trials_and_the_refusal_classified_from_the_real_log() -> None:
    store = StudyStore("ssh-moe-search", RESULTS)
    trials = store.trials()
    assert len(trials) == 5
    for t in trials:
        log = (store.trial_dir(t.trial) / "server.log").read_bytes()
        if t.crash is None:
            w = LogWatcher.read(log)
            assert w.ready and not w.crashed and t.teardown["verdict"] == "clean", t.trial
    (refused,) = [t for t in trials if t.crash is not None]
    assert refused.params["moe-runner-backend"] == "flashinfer_cutedsl"
    assert refused.crash.cls == "config_error" and refused.crash.signature == "unknown"    # the catalog then
    again = classify((store.trial_dir(refused.trial) / "server.log").read_text(), "startup", None, 1)
    assert (again.cls, again.signature) == ("config_error", "moe_runner_unsupported")     # the catalog now
    fp8 = next(t for t in trials if t.params.get("kv-cache-dtype") == "fp8_e4m3")
    assert fp8.crash is None and "KV Cache is allocated. dtype: torch.float8_e4m3fn" in (
        store.trial_dir(fp8.trial) / "server.log").read_text()


def test_winner_beats_sglang_default_with_the_real_bench_serving_at_8_x_c() -> None:
    default, winner = doc("default-bs.json"), doc("winner-bs.json")
    tput = {}
    for name, d in (("default", default), ("winner", winner)):
        assert d["status"] == "ok" and d["teardown"]["verdict"] == "clean"
        for lv in d["levels"]:
            assert lv["workload"] == "random@bench_serving" and lv["completed"] == 8 * lv["concurrency"]
        tput[name] = {lv["concurrency"]: lv["metrics"]["output_throughput"] for lv in d["levels"]}
    assert tput["winner"][256] > 1.5 * tput["default"][256] and tput["winner"][64] > 1.3 * tput["default"][64]
    assert tput["winner"][16] < tput["default"][16]          # at 16 streams the default reads higher
    best = StudyStore("ssh-moe-search", RESULTS).read_best()["best"]
    ran = StudyStore("ssh-winner-bs", RESULTS).trials()[0].params
    assert ran == best["params"]
    res = CliRunner().invoke(app, ["best", "--study", "ssh-moe-search", "--results", str(RESULTS), "-f", "command"])
    assert res.exit_code == 0 and "--cuda-graph-max-bs-decode 256 " in res.stdout


def test_glm5_shaped_model_died_on_its_config_with_dsa_backends_chosen() -> None:
    store = StudyStore("ssh-glm5", RESULTS)
    (t,) = store.trials()
    log = (store.trial_dir(t.trial) / "server.log").read_text()
    assert "Set DSA backends for fp8_e4m3 KV Cache: prefill=flashmla_kv, decode=flashmla_kv." in log
    again = classify(log, "startup", None, 137)
    assert (again.cls, again.signature) == ("config_error", "model_config_missing_field")
    assert "'moe_layer_freq'" in again.exception_line
    assert t.teardown["verdict"] == "clean"
    for step in ("sweep", "search", "default", "winner", "glm5"):
        assert (DIR / f"gpu-{step}.csv").read_text().strip() == "0, 0 MiB, 143771 MiB", step
