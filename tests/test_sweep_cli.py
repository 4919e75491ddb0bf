"""`tunectl sweep` end to end on the embedded default profile (the stand-in), as a user runs it."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.profiles import fast_default
from tunectl.profile import default_profile_path

SEEDS = ["--set", "disable-cuda-graph=true", "--set", "max-running-requests=2048", "--set", "disable-radix-cache=true",
         "--set", "moe-runner-backend=flashinfer_cutlass", "--set", "flashinfer-cutlass-autotune=true"]
SEED_BASELINE_AT_64 = 880.0      # the seeds' write-up: ~880 tok/s before tuning


@pytest.fixture
def env(tmp_path):
    prof, port = fast_default(tmp_path)
    return {"profile": prof, "results": tmp_path / "results", "port": port}


def sweep(env, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from tunectl.cli import app; app()", "sweep", "--profile", str(env["profile"]),
           "--results", str(env["results"]), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_baseline_shows_the_seeds_numbers(env):
    res = sweep(env, "--concurrency", "64,256,512", "--study", "base", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and [lv["status"] for lv in doc["levels"]] == ["ok"] * 3
    at64, level = doc["levels"][0]["metrics"]["output_throughput"], doc["levels"][0]
    assert at64 < 1.3 * SEED_BASELINE_AT_64                    # never faster than the model
    if not level["client_bound"]:                              # a starved client says so, and then reads low
        assert 0.6 * SEED_BASELINE_AT_64 < at64, level["witness"]
    for key in ("output_throughput", "total_throughput", "median_ttft_ms", "p99_ttft_ms", "p99_tpot_ms"):
        assert key in doc["levels"][0]["metrics"]
    assert Path(doc["results_dir"], "trial.json").is_file()


def test_seeds_config_reports_the_crash_under_load(env):
    # The seeds: page_table_1_flattened at 512, at 256 on one run of two; steady-state levels run several waves, so
    # it may come at 256 already.
    res = sweep(env, "--concurrency", "64,256,512", "--study", "seeds", *SEEDS)
    assert res.returncode == 0, res.stderr                     # a crash is a finding
    out = " ".join(res.stdout.split())                         # the console wraps at the terminal's width
    trial = json.loads((env["results"] / "seeds" / "trials" / "0" / "trial.json").read_text())
    at = trial["crash"]["level"]
    assert at in (256, 512)
    assert f"load_crash (page_table_1_flattened) at concurrency {at}" in out
    assert "AttributeError: 'PrefillMetadata' object has no attribute" in out
    assert "exit code: 137" in out
    assert [(lv["concurrency"], lv["status"]) for lv in trial["levels"]] == [
        (c, "ok") for c in (64, 256) if c < at] + [(at, "crashed")]
    if at == 512:
        assert trial["levels"][1]["metrics"]["output_throughput"] > trial["levels"][0]["metrics"]["output_throughput"]
    launch = json.loads((env["results"] / "seeds" / "trials" / "0" / "launch.json").read_text())
    assert "--disable-cuda-graph" in launch["argv"] and "--disable-radix-cache" in launch["argv"]
    assert launch["argv"][launch["argv"].index("--max-running-requests") + 1] == "2048"
    assert launch["patches"] == ["0001-flashinfer-cutlass-autotune"]


@pytest.mark.parametrize("args, needle", [
    (["--set", "disable-cuda-grap=true"], "did you mean 'disable-cuda-graph'"),
    (["--set", "moe-runner-backend=fast"], "must be one of flashinfer_cutlass, triton, flashinfer_trtllm"),
    (["--set", "max-running-requests=lots"], "must be one of 64, 128"),
    (["--set", "disable-radix-cache=maybe"], "expected a boolean"),
    (["--set", "schedule-policy=fastest"], "must be one of lpm"),
    (["--set", "nonsense"], "expected NAME=VALUE"),
    (["--concurrency", "64,x"], "--concurrency"),
    (["--study", "../elsewhere"], "names a folder"),
    (["--launches", "0"], "--launches: 0"),
    (["--request-rate", "1", "--burstiness", "nan"], "--burstiness: nan"),      # was pydantic's traceback
    (["--request-rate", "1", "--burstiness", "inf"], "--burstiness: inf"),
    (["--capacity", "--slo", "p99_ttft_ms=nan"], "--slo 'p99_ttft_ms=nan'"),    # was pydantic's traceback
    (["--capacity", "--slo", "p99_ttft_ms=inf"], "--slo 'p99_ttft_ms=inf'"),    # no limit at all
    (["--set", "config=/etc/passwd"], "tunectl writes the server's --config file itself"),
])
def test_bad_input_is_one_line_and_starts_nothing(env, args, needle):
    res = sweep(env, *args, timeout=60)
    assert res.returncode == 2
    assert needle in res.stderr and "Traceback" not in res.stderr + res.stdout
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (env["results"]).exists()


def test_dry_run_prints_the_plan_and_starts_nothing(env):
    res = sweep(env, "--dry-run", *SEEDS, timeout=60)
    assert res.returncode == 0, res.stderr
    head = shlex.join([sys.executable, "-m", "tunectl.sim.launch_server", "--model"])   # tunectl's interpreter
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(head))
    argv = shlex.split(line)
    assert "--disable-cuda-graph" in argv and argv[argv.index("--tp-size") + 1] == "8"
    assert "SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION=1" in res.stdout
    assert "TUNECTL_SIM_PATCHES=0001-flashinfer-cutlass-autotune" in res.stdout
    assert (not env["results"].exists()
            and not Path(yaml.safe_load(env["profile"].read_text())["host"]["workdir"]).exists())


def test_stranger_on_the_port_is_one_line_exit_1(env):
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
            "print('up', flush=True); time.sleep(60)")
    stranger = subprocess.Popen([sys.executable, "-c", code, str(env["port"])], stdout=subprocess.PIPE)
    try:
        assert stranger.stdout.readline() == b"up\n"
        res = sweep(env, "--concurrency", "1", timeout=60)
        assert res.returncode == 1
        assert f"pid {stranger.pid}" in res.stderr and "Traceback" not in res.stderr
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def _has_real_client() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("transformers") is not None


@pytest.mark.skipif(not _has_real_client(), reason="sglang.bench_serving 0.5.9 not installed")
def test_both_clients_measure_each_level_on_one_launch(env):
    # no tokenizer in the profile: the stand-in's own serves the real client
    assert "tokenizer" not in yaml.safe_load(env["profile"].read_text())["model"]
    res = sweep(env, "--concurrency", "4,16", "--client", "builtin,bench_serving", "--study", "clients", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    got = [(lv["workload"], lv["concurrency"], lv["status"]) for lv in doc["levels"]]
    assert got == [("random@builtin", 4, "ok"), ("random@builtin", 16, "ok"),
                   ("random@bench_serving", 4, "ok"), ("random@bench_serving", 16, "ok")]
    by = {(lv["workload"], lv["concurrency"]): lv for lv in doc["levels"]}
    real, ours = by[("random@bench_serving", 16)], by[("random@builtin", 16)]
    assert real["completed"] == 16                                 # parsed from the real client's result file
    assert ours["completed"] >= 16 and ours["samples"] > 0         # the built-in client's steady level: more
    ratio = real["metrics"]["output_throughput"] / ours["metrics"]["output_throughput"]
    # Same server, same workload, modeled units (a unit slip would be 1/scale = 20x). The built-in client reads
    # the stand-in's own clock; the real client measures on this host's clock, so its own per-request overhead on
    # a busy host counts against it (docs/sim.md, "The clock"): it may read lower, never higher.
    assert 0.25 < ratio < 1.25, ratio
    log = Path(doc["results_dir"], "server.log").read_text()
    assert log.count("The server is fired up and ready to roll!") == 1   # both clients, one launch


def test_a_client_named_twice_measures_each_level_once(env):
    """`--client builtin,builtin` ran every level twice under one name: the second level file overwrote the first
    in levels/, and the table showed two rows for one level."""
    res = sweep(env, "--concurrency", "4", "--client", "builtin,builtin", "--study", "dup", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [(lv["workload"], lv["concurrency"]) for lv in doc["levels"]] == [("random@builtin", 4)]
    assert len(list(Path(doc["results_dir"], "levels").iterdir())) == 1


def test_launches_are_fresh_servers_pooled_per_level(env):
    res = sweep(env, "--concurrency", "4,16", "--launches", "2", "--study", "twice", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    runs = [json.loads(Path(d["results_dir"], "launch.json").read_text())["run_id"] for d in doc["launches"]]
    assert len(runs) == 2 and runs[0] != runs[1]                      # two launches, each its own server
    assert [row["concurrency"] for row in doc["summary"]] == [4, 16]
    for row, levels in zip(doc["summary"], zip(*(d["levels"] for d in doc["launches"]))):
        values = [lv["metrics"]["steady_output_throughput"] for lv in levels]
        pooled = row["pooled"]
        assert [r["value"] for r in row["readings"]] == values
        assert pooled["value"] == pytest.approx(sum(values) / 2) and pooled["n"] == 2
        assert pooled["low"] <= min(values) and pooled["high"] >= max(values)   # 2 launches: t(1) is wide
        assert row["launch_spread"] == pytest.approx((max(values) - min(values)) / pooled["value"])


@pytest.mark.skipif(not _has_real_client(), reason="sglang.bench_serving 0.5.9 not installed")
def test_a_level_the_real_client_fails_keeps_its_error_text(env, tmp_path):
    data = yaml.safe_load(env["profile"].read_text())
    data["model"]["tokenizer"] = str(tmp_path / "no-such-tokenizer")        # the client cannot start its level
    env["profile"].write_text(yaml.safe_dump(data, sort_keys=False))
    res = sweep(env, "--concurrency", "4", "--client", "bench_serving", "--study", "failing", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [lv["status"] for lv in doc["levels"]] == ["failed"]
    files = list(Path(doc["results_dir"], "levels").glob("*.json"))
    level = json.loads(files[0].read_text())
    assert level["status"] == "failed" and level["errors"], level
    assert level["errors"][0].startswith("bench_serving exit ")                  # what failed, then why
    assert any("no-such-tokenizer" in e for e in level["errors"]), level["errors"]


def test_unknown_client_is_one_line(env):
    res = sweep(env, "--client", "wrk")
    assert res.returncode == 2 and "--client" in res.stderr and "bench_serving" in res.stderr
    assert "Traceback" not in res.stderr


def test_set_takes_sglangs_aliases_once_and_values_off_the_grid():
    from tunectl.commands.sweep import parse_sets
    from tunectl.errors import UsageError
    from tunectl.profile import load_profile

    prof = load_profile(default_profile_path())                       # its base flags spell `tp-size`
    assert parse_sets(prof, ["tp-size=4"]) == {"tp-size": 4}
    assert parse_sets(prof, ["tensor-parallel-size=2", "tp-size=4"]) == {"tp-size": 4}   # one flag, last wins
    assert parse_sets(prof, ["dp-size=2"]) == {"data-parallel-size": 2}
    # knobs take valid SGLang values that are not on the search grid
    assert parse_sets(prof, ["max-running-requests=4096", "mem-fraction-static=0.9"]) == {
        "max-running-requests": 4096, "mem-fraction-static": 0.9}
    with pytest.raises(UsageError, match="did you mean 'max-running-requests'"):
        parse_sets(prof, ["max-runing-requests=3"])
    with pytest.raises(UsageError, match="did you mean 'disable-radix-cache'"):
        parse_sets(prof, ["disable-radix-cach=true"])
    with pytest.raises(UsageError, match="must be one of"):
        parse_sets(prof, ["moe-runner-backend=bogus"])


def test_set_aliases_reach_the_argv_once(env):
    res = sweep(env, "--dry-run", "--set", "tensor-parallel-size=2", "--set", "tp-size=4", timeout=60)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "tunectl.sim.launch_server --model" in ln)
    argv = shlex.split(line)
    assert argv.count("--tp-size") == 1 and "--tensor-parallel-size" not in argv
    assert argv[argv.index("--tp-size") + 1] == "4"


def _in_flight(log: str) -> int:
    """Requests at the server (running + queued) by its latest batch line."""
    last = re.findall(r"#running-req: (\d+).*?#queue-req: (\d+)", log)
    return int(last[-1][0]) + int(last[-1][1]) if last else 0


def test_ctrl_c_during_a_high_level_is_one_line_and_leaves_nothing(env):
    import os
    import signal
    import time

    from tunectl.runners.hosts.base import ProcHandle
    from tunectl.runners.hosts.local import LocalRunner

    data = yaml.safe_load(env["profile"].read_text())      # levels of 100+ modeled s (5+ s wall): the Ctrl-C
    data["bench"].update(min_level_s=100, max_level_s=600)  # lands inside the level at 512, not after it ended
    prof = env["profile"].with_name("long-levels.yaml")
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "tunectl", "sweep", "--profile", str(prof), "--results", str(env["results"]),
           "-c", "256,512", "--study", "ctrl-c"]
    # as from a terminal: SIGINT at its default (a test run started in the background inherits it ignored, and
    # Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    levels = env["results"] / "ctrl-c" / "trials" / "0" / "levels"
    deadline = time.monotonic() + 180
    while not (levels.is_dir() and any(levels.glob("*-c256.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    launch = json.loads((levels.parent / "launch.json").read_text())
    log = Path(ProcHandle.for_dir(launch["run_id"], launch["trial_dir"]).log_path)
    while _in_flight(log.read_text(errors="replace")) <= 256:   # the server's own view: c=512 under way, the
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()   # client's workers busy
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)                      # what Ctrl-C at a terminal does: the whole group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted" in err
    handle = ProcHandle.for_dir(launch["run_id"], launch["trial_dir"])   # found by its run id
    assert LocalRunner().group_processes(handle) == []      # the stand-in was torn down


def test_ctrl_c_pressed_again_and_again_still_tears_the_server_down(env):
    """An impatient user presses Ctrl-C over and over (or `timeout -s INT`, which signals tunectl and then its
    process group: two SIGINTs): the ones that land while the server is being torn down wait until it is down,
    and the last line is still one line (seen: a second SIGINT broke the teardown off and left the stand-in
    serving, its port held for the next search)."""
    import os
    import signal
    import time

    from tunectl.runners.hosts.local import LocalRunner

    data = yaml.safe_load(env["profile"].read_text())
    data["bench"].update(min_level_s=100, max_level_s=600)
    prof = env["profile"].with_name("long-levels.yaml")
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**env, "profile": prof}
    proc, launch, handle = _sweep_until(env, "mash", "64,256", lambda log: _in_flight(log) > 0,
                                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    end = time.monotonic() + 3
    while proc.poll() is None and time.monotonic() < end:   # every 5 ms: some land inside the teardown
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.005)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err, err
    assert LocalRunner().group_processes(handle) == []      # the stand-in was torn down
    record = json.loads((env["results"] / "mash" / "trials" / "0" / "trial.json").read_text())
    assert record["status"] == "interrupted" and record["teardown"]["verdict"] == "clean"


def test_the_hosts_trial_directory_is_removed_after_a_clean_teardown(env):
    res = sweep(env, "-c", "1", "--study", "clean", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["teardown"]["verdict"] == "clean"
    assert not Path(doc["launch"]["trial_dir"]).exists()             # nothing left under host.workdir
    assert "ready to roll" in (Path(doc["results_dir"]) / "server.log").read_text()   # the log was kept


def _sweep_until(env, study: str, levels: str, ready: Callable[[str], bool], preexec_fn: Any = None):
    """Start `tunectl sweep` in its own session; return it once the server's log satisfies `ready`, with the
    launch record and the server's handle."""
    import time

    from tunectl.runners.hosts.base import ProcHandle

    cmd = [sys.executable, "-m", "tunectl", "sweep", "--profile", str(env["profile"]), "--results", str(env["results"]),
           "-c", levels, "--study", study]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=preexec_fn)
    trial = env["results"] / study / "trials" / "0"
    deadline = time.monotonic() + 180
    while not (trial / "launch.json").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    launch = json.loads((trial / "launch.json").read_text())
    handle = ProcHandle.for_dir(launch["run_id"], launch["trial_dir"])
    log = Path(handle.log_path)
    while not log.is_file() or not ready(log.read_text(errors="replace")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, launch, handle


def test_sigterm_during_a_level_tears_the_server_down_like_ctrl_c(env):
    """A job scheduler's stop or `timeout` sends SIGTERM to tunectl alone (not its process group): the server it
    started must not be left running on the host (seen on a real GPU host: the next launch found port and GPU held)."""
    import os
    import signal

    from tunectl.runners.hosts.local import LocalRunner

    proc, _, handle = _sweep_until(env, "sigterm", "64,256", lambda log: _in_flight(log) > 0)   # a level under way
    trial = env["results"] / "sigterm" / "trials" / "0"
    os.kill(proc.pid, signal.SIGTERM)                       # tunectl alone, as `kill PID` or systemd does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "terminated (SIGTERM)" in err, err
    assert LocalRunner().group_processes(handle) == []      # the stand-in was torn down
    record = json.loads((trial / "trial.json").read_text())
    assert record["params"] == {} and record["status"] == "interrupted"       # kept, and not left `running`
    assert record["teardown"]["verdict"] == "clean" and record["finished_at"] >= record["started_at"]


def test_a_server_left_by_a_killed_tunectl_is_found_and_stopped_by_check(env):
    """kill -9 of tunectl leaves its server running (nothing can tear it down); `tunectl check` names it and
    `--stop-leftovers` stops it by its recorded process group."""
    import os
    import signal

    from tunectl.runners.hosts.local import LocalRunner

    proc, launch, handle = _sweep_until(env, "killed", "64", lambda log: "ready to roll" in log)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert LocalRunner().group_processes(handle)                        # the stand-in outlived tunectl

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tunectl", "check", "-p", str(env["profile"]), *args],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"},
                              cwd=env["results"].parent)                # its results/ are here

    before = check()
    assert before.returncode == 1 and launch["run_id"] in before.stdout, before.stdout
    after = check("--stop-leftovers", "--yes")
    assert f"run {launch['run_id']}) stopped" in after.stdout, after.stdout + after.stderr
    assert LocalRunner().group_processes(handle) == []
    assert not Path(handle.dir, "env").exists()                         # its secrets are not left on the host
    assert "port" not in after.stdout.splitlines()[-1]                  # its port is free again
    assert launch["run_id"] not in after.stdout.split("tunectl check", 1)[1]     # not among the leftovers now


def test_check_leaves_a_live_sweep_alone(env):
    """A server whose tunectl still runs (its study's lock held) is not a leftover: plain `check` does not call it
    one, and `--stop-leftovers` does not stop it (it once stopped live runs sharing host.workdir)."""
    import os

    from tunectl.runners.hosts.local import LocalRunner

    proc, launch, handle = _sweep_until(env, "live", "64,256,512", lambda log: "ready to roll" in log)
    try:
        def check(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "tunectl", "check", "-p", str(env["profile"]), *args],
                                  capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"},
                                  cwd=env["results"].parent)            # its results/ are here

        plain = check()
        row = next(line for line in plain.stdout.splitlines() if line.startswith("│ leftovers"))
        assert "pass" in row and "study live" not in row and "running stud" in row, plain.stdout
        assert "kill -TERM" not in plain.stdout
        stop = check("--stop-leftovers", "--yes")
        pgid = Path(handle.pgid_path).read_text().strip()
        assert f"not touched: process group {pgid}, run {launch['run_id']}: study live is running" in stop.stdout, \
            stop.stdout
        assert "stopped" not in stop.stdout and LocalRunner().group_processes(handle)
        assert proc.poll() is None                                      # the sweep runs on
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
