"""Host hygiene: nvidia-smi parsing (tests/fixtures/nvidia-smi), the wait for GPU release after a kill by process
group, ports, disk, leftovers of ours, and flag validation against a --help text."""
from __future__ import annotations

import shutil
import signal
import sys
import uuid
from pathlib import Path

import pytest

from tests.runners.conformance import FREE_PORT, LISTEN, py, wait_for
from tunectl.errors import HostDirtyError
from tunectl.sglang.flags import bundled_flags
from tunectl.profile import Profile
from tunectl.runners.checks import flagcheck, hostcheck
from tunectl.runners.hosts.local import LocalRunner

FIX = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"

FAKE_SMI = '''#!{python}
# answers like nvidia-smi from the fixture files: "busy" while the pid in PIDFILE lives
import os, sys
FIX, PIDFILE, MODE = {fix!r}, {pidfile!r}, {mode!r}
if MODE == "no-driver":
    sys.stdout.write(open(os.path.join(FIX, "no-driver.txt")).read()); sys.exit(9)
def holder():
    try:
        pid = int(open(PIDFILE).read())
        return pid if open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] != "Z" else None
    except (OSError, ValueError):
        return None
pid = holder()
kind = "gpus" if any(a.startswith("--query-gpu") for a in sys.argv) else "apps"
text = open(os.path.join(FIX, "h200x1-%s.%s.csv" % ("busy" if pid else "idle", kind))).read()
sys.stdout.write(text.replace(", 433, ", ", %d, " % pid) if pid else text)
'''


def fake_smi(tmp_path: Path, mode: str = "ok") -> tuple[str, str]:
    smi, pidfile = tmp_path / f"nvidia-smi-{mode}", str(tmp_path / "holder.pid")
    smi.write_text(FAKE_SMI.format(python=sys.executable, fix=str(FIX), pidfile=pidfile, mode=mode))
    smi.chmod(0o755)
    return str(smi), pidfile


@pytest.fixture(params=["local", "ssh"])
def any_runner(request):
    if request.param == "local":
        r = LocalRunner()
        yield r
        r.close()
    else:
        yield request.getfixturevalue("make_ssh_runner")()


def test_parse_fixtures():
    gpus = hostcheck.parse_gpus((FIX / "h200x8-orphan.gpus.csv").read_text())
    apps = hostcheck.parse_apps((FIX / "h200x8-orphan.apps.csv").read_text())
    assert [g.index for g in gpus] == list(range(8)) and gpus[3].used_mib == 120408
    assert {g.total_mib for g in gpus} == {143771}
    assert apps[0].pid == 91377 and apps[0].name == "sglang::scheduler_TP3" and apps[0].used_mib == 120394
    assert hostcheck.gpu_problems(gpus, apps, [0, 1], 1024) == []             # GPU 3 is not ours to use
    problems = hostcheck.gpu_problems(gpus, apps, None, 1024)
    assert problems == ["GPU 3 uses 120408 MiB of 143771 (limit 1024)",
                        "pid 91377 sglang::scheduler_TP3 on GPU 3 (120394 MiB)"]
    assert hostcheck.gpu_problems(gpus, [], [9], 1024) == ["GPU 9 does not exist (host has 8)"]
    na = hostcheck.parse_apps((FIX / "h200x1-na.apps.csv").read_text())
    assert na[0].pid is None and na[0].used_mib is None
    idle = hostcheck.parse_gpus((FIX / "h200x1-idle.gpus.csv").read_text())
    busy = hostcheck.parse_gpus((FIX / "h200x1-busy.gpus.csv").read_text())
    assert [(g.index, g.used_mib, g.total_mib) for g in idle + busy] == [(0, 0, 143771), (0, 41487, 143771)]
    assert hostcheck.gpu_problems(idle, na, [0], 1024) == ["pid ? [N/A] on GPU 0 (memory n/a)"]
    assert hostcheck.parse_apps((FIX / "h200x1-idle.apps.csv").read_text()) == []



def test_parse_real_h200_captures():
    """nvidia-smi on a real H200 (driver 580.159.04) while a process group held 8 GiB, and after tunectl killed the
    group: the memory and the compute app are gone (bench/gpu/release_check.py)."""
    real = FIX / "real-h200"
    busy = hostcheck.parse_gpus((real / "busy.gpus.csv").read_text())
    apps = hostcheck.parse_apps((real / "busy.apps.csv").read_text())
    assert [(g.index, g.used_mib, g.total_mib) for g in busy] == [(0, 8811, 143771)]
    assert [(a.pid, a.used_mib) for a in apps] == [(444, 8802)] and apps[0].gpu_uuid == busy[0].uuid
    assert hostcheck.gpu_problems(busy, apps, [0], 1024)                         # dirty: refuse to launch
    for state in ("idle", "released"):
        gpus = hostcheck.parse_gpus((real / f"{state}.gpus.csv").read_text())
        assert hostcheck.gpu_problems(gpus, hostcheck.parse_apps((real / f"{state}.apps.csv").read_text()),
                                      [0], 1024) == []

def test_missing_nvidia_smi_is_one_clear_message(any_runner):
    with pytest.raises(hostcheck.NvidiaSmiError, match="nvidia-smi is not on the host's PATH"):
        hostcheck.query(any_runner, smi=f"nvidia-smi-absent-{uuid.uuid4().hex[:6]}")


def test_driver_not_loaded(any_runner, tmp_path):
    smi, _ = fake_smi(tmp_path, "no-driver")
    with pytest.raises(hostcheck.NvidiaSmiError, match=r"nvidia-smi failed \(exit 9\)") as e:
        hostcheck.query(any_runner, smi=smi)
    assert "couldn't communicate with the NVIDIA driver" in e.value.tail


def test_gpu_memory_comes_back_after_group_kill(any_runner, tmp_path):
    """The shape of the real H200 check: a process holds the GPU, it is killed by its process group, tunectl
    sees the memory come back."""
    smi, pidfile = fake_smi(tmp_path)
    h = any_runner.start_detached(py("import os,sys,time; open(sys.argv[1],'w').write(str(os.getpid())); "
                                     "time.sleep(60)", pidfile), str(tmp_path / "holder"), {}, "hc-holder-1")
    assert wait_for(lambda: Path(pidfile).exists())
    holder = int(Path(pidfile).read_text())
    with pytest.raises(HostDirtyError) as e:
        hostcheck.wait_gpu_release(any_runner, [0], 1024, timeout=0.3, poll_s=0.1, smi=smi)
    assert "GPU 0 uses 41487 MiB of 143771 (limit 1024)" in e.value.evidence    # the H200 capture
    assert f"pid {holder} /opt/torch/.venv/bin/python3 on GPU 0 (41478 MiB)" in e.value.evidence
    any_runner.signal_group(h, signal.SIGKILL)
    waited = hostcheck.wait_gpu_release(any_runner, [0], 1024, timeout=15, poll_s=0.1, smi=smi,
                                        pids={holder})
    assert waited < 15
    assert hostcheck.gpu_problems(*hostcheck.query(any_runner, smi), [0], 1024) == []


def test_ports_leftovers_and_gate(any_runner, tmp_path):
    port = int(any_runner.run(py(FREE_PORT)).stdout)
    assert hostcheck.port_problems(any_runner, [port]) == []
    rid = f"hc-left-{uuid.uuid4().hex[:8]}"
    h = any_runner.start_detached(py(LISTEN, str(port)), str(tmp_path / "srv"), {}, rid)
    try:
        assert wait_for(lambda: b"listening" in any_runner.read_file(h.log_path))
        assert any(f"run {rid}" in x for x in hostcheck.leftovers(any_runner))
        assert not any(f"run {rid}" in x for x in hostcheck.leftovers(any_runner, keep={rid}))
        taken = hostcheck.port_problems(any_runner, [port])
        assert taken and taken[0].startswith(f"port {port} is taken by pid") and "http.server" in taken[0]
        with pytest.raises(HostDirtyError) as e:
            hostcheck.ensure_clean(any_runner, None, 1024, [port], smi=None)
        assert any(rid in x for x in e.value.evidence) and any(f"port {port}" in x for x in e.value.evidence)
    finally:
        any_runner.signal_group(h, signal.SIGKILL)
    assert wait_for(lambda: not hostcheck.port_problems(any_runner, [port]))


def test_free_disk(any_runner, tmp_path):
    gb = hostcheck.free_disk_gb(any_runner, str(tmp_path / "not" / "yet" / "made"))
    assert abs(gb - shutil.disk_usage(tmp_path).free / 2**30) < 1.0


def profile(flags=None, space=None, engine="sim", version="0.5.9") -> Profile:
    p = Profile.model_validate({"name": "t", "model": {"path": "m"}, "server": {
        "engine": engine, "sglang_version": version, "flags": flags or {}}, "search": {"space": space or {}}})
    p.source = "profiles/t.yaml"
    return p


def test_flag_problems_against_real_help_texts():
    new = bundled_flags("0.5.23")
    prof = profile({"cuda-graph-max-bs": 256, "nsa-prefill-backend": "flashmla_sparse", "tp-size": 8},
                   {"attention-backend": {"type": "categorical", "choices": ["triton", "flashinferx"]},
                    "disable-radix-cache": {"type": "bool"},
                    "autotune": {"type": "bool", "patch": "0001-flashinfer-cutlass-autotune"}})
    problems = flagcheck.problems(prof, new, "sglang.launch_server 0.5.23 on local")
    assert problems[0] == ("profiles/t.yaml: server.flags.cuda-graph-max-bs: --cuda-graph-max-bs is not a flag "
                           "of sglang.launch_server 0.5.23 on local; did you mean --cuda-graph-max-bs-decode?")
    assert "server.flags.nsa-prefill-backend: --nsa-prefill-backend is not a flag" in problems[1]
    assert problems[2].startswith("profiles/t.yaml: search.space.attention-backend: 'flashinferx' is not a valid "
                                  "choice for --attention-backend; valid: ")
    assert "triton" in problems[2] and len(problems) == 3       # tp-size alias, switch and patch knob are fine
    assert flagcheck.problems(profile({"nsa-prefill-backend": "flashmla_sparse", "tp-size": 8}),
                              bundled_flags("0.5.9"), "0.5.9") == []
    switch = flagcheck.problems(profile({"disable-radix-cache": "yes"}), new, "x")
    assert switch == ["profiles/t.yaml: server.flags.disable-radix-cache: --disable-radix-cache is a switch "
                      "(true/false), got 'yes'"]


def test_help_read_from_host_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    runner, prof = LocalRunner(), profile({"tp-size": 2, "mem-fraction-static": 0.8})
    assert flagcheck.check_flags(runner, prof, "0.5.9") == []
    cached = list((tmp_path / ".cache" / "tunectl" / "help").glob("*.txt"))
    assert len(cached) == 1 and "--mem-fraction-static" in cached[0].read_text()
    cached[0].write_text(cached[0].read_text().replace("--mem-fraction-static", "--mem-fraction-statik"))
    assert "did you mean --mem-fraction-statik?" in flagcheck.check_flags(runner, prof, "0.5.9")[0]  # cache used


def test_a_trials_machine_names_its_gpus_power_limit_and_cards():
    """Two H100s of one model read one config 20% apart at their power limits (docs/real-gpu.md): a trial records
    which cards it ran on, and the id changes with the cards, the count and the limit, not with the GPU order."""
    text = (FIX / "h100x3.machine.csv").read_text()
    one = hostcheck.parse_machine(text, [0])
    assert one.startswith("NVIDIA H100 80GB HBM3 x1, 700 W, gpu-")
    assert hostcheck.parse_machine(text, [1]).startswith("NVIDIA H100 80GB HBM3 x1, 650 W, gpu-")
    assert hostcheck.parse_machine(text, [1])[-8:] != one[-8:]                 # another card, another id
    both = hostcheck.parse_machine(text, [0, 1])
    assert both.startswith("NVIDIA H100 80GB HBM3 x2, 650 W, 700 W, gpu-")
    swapped = "\n".join(reversed(text.strip().splitlines()))
    assert hostcheck.parse_machine(swapped, [0, 1]) == both
    assert "[N/A]" in hostcheck.parse_machine(text, [2])
    assert hostcheck.parse_machine(text, [7]) == ""


def test_a_host_without_nvidia_smi_records_no_machine_and_no_error(any_runner):
    assert hostcheck.machine(any_runner, [0], smi=f"nvidia-smi-absent-{uuid.uuid4().hex[:6]}") == ""


DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('deaf', flush=True); time.sleep(300)"


def test_stopping_a_leftover_that_ignores_sigterm_kills_it_and_waits_until_it_is_gone(any_runner, tmp_path):
    """`tunectl check --stop-leftovers`: a group deaf to SIGTERM gets SIGKILL, and the line says "stopped" only once
    the group has left the process table, so the caller's removal of its `env` (secrets) is not skipped."""
    rid = f"hc-deaf-{uuid.uuid4().hex[:8]}"
    h = any_runner.start_detached(py(DEAF), str(tmp_path / "deaf"), {}, rid)
    try:
        assert wait_for(lambda: b"deaf" in any_runner.read_file(h.log_path))
        [line] = hostcheck.stop_groups(any_runner, {h.pgid: h}, grace_s=0.5)
        assert line == f"process group {h.pgid} (run {rid}) stopped with SIGKILL"
        assert any_runner.group_processes(h) == []
    finally:
        any_runner.signal_group(h, signal.SIGKILL)


def test_a_group_still_there_after_sigkill_is_reported_with_its_pids(monkeypatch):
    """A process SIGKILL cannot end at once (uninterruptible I/O on a hung disk or driver) is not called stopped."""
    from tunectl.runners.hosts.base import ProcHandle, ProcInfo

    class Stuck:                            # the runner's view of a group whose process never leaves
        signals: list[int] = []

        def group_processes(self, handle):
            return [ProcInfo(pid=4242, pgid=4242, cmdline="python3 -m sglang.launch_server", start_time="1")]

        def signal_group(self, handle, sig):
            self.signals.append(sig)

    monkeypatch.setattr(hostcheck, "KILL_WAIT_S", 0.3)
    h = ProcHandle.for_dir("run-x", "/tmp/x")
    [line] = hostcheck.stop_groups(Stuck(), {4242: h}, grace_s=0.2)
    assert Stuck.signals == [signal.SIGTERM, signal.SIGKILL]
    assert line == "process group 4242 (run run-x) still running after SIGKILL: pid 4242"
