"""Server lifecycle on the SGLang stand-in: readiness, every crash class, hang, startup timeout, a stranger on the
port, and a teardown that leaves no process of the run alive (checked by process group and by run id)."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.ports import free_port
from tunectl.errors import HostDirtyError
from tunectl.profile import default_profile_path, load_profile
from tunectl.runners.hosts.local import LocalRunner
from tunectl.runners.server import lifecycle
from tunectl.runners.server import plan as server
from tunectl.runners.server.ladder import run_ladder


def sim_profile(tmp_path: Path, **overrides):
    """The embedded default profile on a free port, trial dirs under tmp_path, paced at 10 ms per modeled second
    (the tests' own pace: the timing they assert holds on a loaded 2-core host whatever the default's pace)."""
    return load_profile(default_profile_path(), {"server.port": free_port(), "host.workdir": str(tmp_path / "host"),
                                                 "server.sim.time_scale": 0.01, **overrides})


def start(prof, params=None):
    runner = LocalRunner()
    run_id = server.make_run_id("lc", 0)
    plan = server.build_plan(prof, params or {}, run_id, f"{prof.host.workdir}/{run_id}")
    lifecycle.preflight(runner, prof, plan)
    return lifecycle.launch(runner, prof, plan, server.config_yaml(plan))


def run_pids(run_id: str) -> list[int]:
    """Every live process carrying this run id, found independently of the runner."""
    marker = f"TUNECTL_RUN_ID={run_id}".encode()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                out.append(int(pid)) if state not in ("Z", "X") else None
        except OSError:
            continue
    return out


def group_pids(pgid: int) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(pid))
    return out


@pytest.fixture
def started():
    servers = []

    def go(prof, params=None):
        srv = start(prof, params)
        servers.append(srv)
        return srv

    yield go
    for srv in servers:
        lifecycle.teardown(srv)


def test_ready_needs_the_log_line_and_health(tmp_path, started):
    srv = started(sim_profile(tmp_path))
    st = lifecycle.wait_ready(srv)
    assert st.ready and st.crash is None
    # milestones in SGLang's order, all before readiness was declared
    order = ["server_args", "load_weight_begin", "load_weight_end", "kv_cache_allocated", "memory_pool_end",
             "max_total_num_tokens", "ready"]
    assert [st.phases[m] for m in order] == sorted(st.phases[m] for m in order)
    assert st.phases["ready"] <= st.ready_s
    assert lifecycle.health_ok(srv.base_url)
    assert srv.watcher.facts["max_running_requests"] == 64


def test_a_server_on_every_interface_is_reached_on_loopback(tmp_path, started):
    """`server.host: 0.0.0.0` (or `--set host=0.0.0.0`): SGLang listens everywhere, and tunectl's clients, readiness
    probe and SSH forward reach it on 127.0.0.1, not on the wildcard (which only Linux connects to, and which a
    proxy whose no_proxy names loopback would take)."""
    srv = started(sim_profile(tmp_path, **{"server.host": "0.0.0.0"}))
    assert lifecycle.wait_ready(srv).ready
    assert srv.base_url == f"http://127.0.0.1:{srv.plan.port}" and lifecycle.health_ok(srv.base_url)
    assert f"Uvicorn running on http://0.0.0.0:{srv.plan.port}" in Path(srv.handle.log_path).read_text()
    assert (srv.plan.host, srv.plan.url) == ("0.0.0.0", f"http://127.0.0.1:{srv.plan.port}")   # launch.json as run
    v6 = server.build_plan(sim_profile(tmp_path, **{"server.host": "::"}), {}, "rid-6", "/w/rid-6")
    assert v6.url == f"http://[::1]:{v6.port}"


def test_teardown_leaves_nothing_of_the_run(tmp_path, started):
    srv = started(sim_profile(tmp_path))
    assert lifecycle.wait_ready(srv).ready
    pgid, run_id = srv.handle.pgid, srv.plan.run_id
    assert len(group_pids(pgid)) >= 2 and run_pids(run_id)      # server + its scheduler child
    td = lifecycle.teardown(srv)
    assert td["verdict"] == "clean", td
    assert group_pids(pgid) == [] and run_pids(run_id) == []
    assert srv.runner.port_owner(srv.plan.port) is None
    assert not os.path.exists(f"{srv.plan.trial_dir}/tmp")
    assert srv.runner.poll(srv.handle) is not None               # the wrapper recorded how it ended


@pytest.mark.parametrize("params, cls, signature", [
    ({"moe-runner-backend": "flashinfer_trtllm"}, "config_error", None),
    ({"mem-fraction-static": 0.95}, "config_error", "capture_cuda_graph_failed"),
    ({"max-running-requests": "many"}, "config_error", "argparse_error"),
])
def test_startup_crash_is_classified(tmp_path, started, params, cls, signature):
    srv = started(sim_profile(tmp_path), params)
    st = lifecycle.wait_ready(srv)
    assert not st.ready
    c = st.crash
    assert c.cls == cls and c.phase == "startup" and c.level is None
    assert signature is None or c.signature == signature
    assert c.exception_line and c.exception_line in srv.tail()
    assert c.exit_code in (137, 2)


def test_load_crash_stops_the_ladder_at_its_level(tmp_path, started):
    seeds = {"disable-cuda-graph": True, "max-running-requests": 2048, "disable-radix-cache": True,
             "flashinfer-cutlass-autotune": True}
    prof = sim_profile(tmp_path)
    srv = started(prof, seeds)
    assert lifecycle.wait_ready(srv).ready
    ladder = run_ladder(srv, [64, 512, 1024], prof.bench.workloads)
    assert [lv.status for lv in ladder.levels] == ["ok", "crashed"]       # 1024 never ran
    c = ladder.crash
    assert (c.cls, c.signature, c.phase, c.level) == ("load_crash", "page_table_1_flattened", "load", 512)
    assert "page_table_1_flattened" in c.exception_line
    assert c.detect_latency_s is not None and c.detect_latency_s < 2.0
    lifecycle.teardown(srv)
    assert srv.runner.poll(srv.handle) == 137


def test_hang_is_detected(tmp_path, started):
    prof = sim_profile(tmp_path)
    srv = started(prof, {"enable-two-batch-overlap": True})
    assert lifecycle.wait_ready(srv).ready
    t0 = time.monotonic()
    ladder = run_ladder(srv, [8, 64], prof.bench.workloads)
    assert ladder.crash is not None and ladder.crash.cls == "hang" and ladder.crash.level == 8
    assert [lv.status for lv in ladder.levels] == ["crashed"]
    assert time.monotonic() - t0 < 10
    assert lifecycle.teardown(srv)["verdict"] == "clean"


def test_startup_timeout_names_the_phase(tmp_path, started):
    # weights take tens of modeled seconds on the card (3 s wall at this scale); allow 1 (1.1 s wall with slack)
    prof = sim_profile(tmp_path, **{"server.timeouts.load_weights_s": 1.0, "server.sim.time_scale": 0.1})
    srv = started(prof)
    st = lifecycle.wait_ready(srv)
    assert not st.ready
    assert st.crash.cls == "startup_timeout" and st.crash.signature == "timeout_load_weights"
    assert "load_weight_begin" in st.phases and "load_weight_end" not in st.phases
    down = lifecycle.teardown(srv)
    assert down["verdict"] == "clean", down


def test_stranger_on_the_port_is_named_and_nothing_starts(tmp_path):
    prof = sim_profile(tmp_path)
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
            "print('up', flush=True); time.sleep(60)")
    stranger = subprocess.Popen([sys.executable, "-c", code, str(prof.server.port)], stdout=subprocess.PIPE)
    try:
        assert stranger.stdout.readline() == b"up\n"
        with pytest.raises(HostDirtyError) as err:
            start(prof)
        assert f"pid {stranger.pid}" in str(err.value) and "socket" in str(err.value)
        assert not os.path.exists(prof.host.workdir)          # nothing was launched
        assert stranger.poll() is None                         # and the stranger was left alone
    finally:
        stranger.kill()
        stranger.wait()


def test_phase_deadlines_scale_with_the_stand_in(tmp_path):
    prof = sim_profile(tmp_path, **{"server.sim.time_scale": 0.01})
    assert lifecycle.scaled(prof, 1800.0) == pytest.approx(18.0 + lifecycle.PHASE_SLACK_S)
    real = prof.model_copy(update={"server": prof.server.model_copy(update={"engine": "sglang"})})
    assert lifecycle.scaled(real, 1800.0) == 1800.0


def test_plan_routes_knobs_to_flags_patches_and_env(tmp_path):
    from tunectl.profile import ParamSpec

    prof = sim_profile(tmp_path, **{"host.gpus": [2, 3]})
    prof.search.space["chunk-threshold"] = ParamSpec(type="int", low=1, high=65536,
                                                     env="SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD")
    prof.search.space["graphs-off"] = ParamSpec(type="bool", flag="disable-cuda-graph")
    params = {"graphs-off": True, "flashinfer-cutlass-autotune": True, "chunk-threshold": 16384,
              "disable-radix-cache": False, "max-running-requests": 1024, "schedule-policy": "fcfs; rm -rf ~"}
    plan = server.build_plan(prof, params, "rid-1", "/w/rid-1")
    assert plan.config["disable-cuda-graph"] is True and "graphs-off" not in plan.config
    assert plan.config["schedule-policy"] == "fcfs; rm -rf ~"          # data in the YAML, never shell text
    assert plan.patches == ["0001-flashinfer-cutlass-autotune"]
    assert "flashinfer-cutlass-autotune" not in plan.config
    assert plan.env["SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD"] == "16384"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,3" and plan.env["TMPDIR"] == "/w/rid-1/tmp"
    assert plan.env["TUNECTL_SIM_PATCHES"] == "0001-flashinfer-cutlass-autotune"
    assert "--disable-cuda-graph" in plan.argv and "--disable-radix-cache" not in plan.argv   # store_true, False
    assert plan.argv[plan.argv.index("--schedule-policy") + 1] == "fcfs; rm -rf ~"
    assert plan.exec_argv[3:5] == ["--config", "/w/rid-1/config.yaml"]


def test_plan_for_real_sglang_has_no_sim_flags(tmp_path):
    prof = sim_profile(tmp_path, **{"server.engine": "sglang"})
    plan = server.build_plan(prof, {}, "rid-2", "/w/rid-2")
    assert plan.argv[:3] == [sys.executable, "-m", "sglang.launch_server"]   # local: tunectl's interpreter
    assert not any(a.startswith("--sim-") for a in plan.argv + plan.exec_argv)
    assert "TUNECTL_SIM_PATCHES" not in plan.env


def test_saturation_stops_a_workload_early(tmp_path, started):
    prof = sim_profile(tmp_path, **{"bench.saturation_stop": 0.5})
    srv = started(prof)
    assert lifecycle.wait_ready(srv).ready
    # Capped at 64 running requests, the throughput stops growing above 64: the ladder stops at the first level
    # that adds less than 50%, before its end. Which level that is depends on how well a busy host's client
    # drives each level (a starved level reads low), so the rule is checked on the levels as measured.
    levels = [64, 128, 256, 512]
    ladder = run_ladder(srv, levels, prof.bench.workloads)
    assert ladder.crash is None and ladder.saturated == ["random"]
    ran = [lv.concurrency for lv in ladder.levels]
    assert 2 <= len(ran) < len(levels) and ran == levels[:len(ran)]
    thr = [lv.output_throughput for lv in ladder.levels]
    assert all(b >= 1.5 * a for a, b in itertools.pairwise(thr[:-1])), thr   # each level before the stop grew
    assert thr[-1] < 1.5 * thr[-2], thr                                    # the last one did not: why it stopped


def _has_bench_serving() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("sglang", "transformers", "datasets", "pybase64", "PIL"))




def test_real_client_that_cannot_run_fails_the_level_not_the_server(tmp_path, started):
    if _has_bench_serving():
        pytest.skip("sglang.bench_serving is installed here")
    prof = sim_profile(tmp_path, **{"bench.client": "bench_serving"})
    srv = started(prof)
    assert lifecycle.wait_ready(srv).ready
    ladder = run_ladder(srv, [1, 8], prof.bench.workloads)
    assert ladder.crash is None and [lv.status for lv in ladder.levels] == ["failed"]
    assert ladder.levels[0].completed == 0 and srv.runner.poll(srv.handle) is None   # the server is fine


@pytest.mark.skipif(not _has_bench_serving(), reason="sglang.bench_serving 0.5.9 not installed")
def test_real_bench_serving_client_drives_a_level(tmp_path, started):
    prof = sim_profile(tmp_path, **{"bench.client": "bench_serving"})
    srv = started(prof)
    assert lifecycle.wait_ready(srv).ready
    ladder = run_ladder(srv, [8], prof.bench.workloads)
    lv = ladder.levels[0]
    assert lv.status == "ok" and lv.completed == 8 and lv.metrics["output_throughput"] > 0


SMI = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"      # captured on an H200


def fake_smi(tmp_path: Path, name: str) -> Path:
    """An nvidia-smi on PATH answering from the captured files `<name>.gpus.csv` / `<name>.apps.csv`."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      f"kind = 'apps' if any('compute-apps' in a for a in sys.argv) else 'gpus'\n"
                      f"sys.stdout.write(open({str(SMI)!r} + '/{name}.' + kind + '.csv').read())\n")
    script.chmod(0o755)
    return bindir


def test_busy_gpu_makes_a_real_host_dirty(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_smi(tmp_path, 'h200x1-busy')}:{os.environ['PATH']}")
    prof = sim_profile(tmp_path, **{"server.engine": "sglang", "host.gpus": [0]})
    evidence = lifecycle.gpu_evidence(LocalRunner(), prof)
    assert any("GPU 0 uses 41487 MiB" in e for e in evidence) and any("pid 433" in e for e in evidence)
    with pytest.raises(HostDirtyError, match="pid 433"):
        start(prof)
    assert not os.path.exists(prof.host.workdir)
    # the stand-in needs no GPU: the same host is fine for engine sim
    assert lifecycle.gpu_evidence(LocalRunner(), sim_profile(tmp_path)) == []


def test_no_nvidia_smi_means_no_gpu_evidence(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    prof = sim_profile(tmp_path, **{"server.engine": "sglang"})
    assert lifecycle.gpu_evidence(LocalRunner(), prof) == []
