"""Host hygiene: GPUs (nvidia-smi), ports, disk, and processes of ours left over. Used before every launch
and by `tunectl check`; a dirty host raises HostDirtyError with the evidence, never a launch on top."""
from __future__ import annotations

import hashlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.errors import HostDirtyError, RunnerError, TunectlError
from tunectl.runners.hosts.base import ProcHandle, Runner

HOST_HELPER = (Path(__file__).parents[1] / "hosts" / "host_helper.py").read_text()
GPU_QUERY = ["--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits"]
APP_QUERY = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"]
NO_SMI = ("nvidia-smi is not on the host's PATH: no NVIDIA driver there, or a container without the driver "
          "utilities (install the driver / run the container with --gpus all)")


class NvidiaSmiError(RunnerError):
    """nvidia-smi is missing or cannot talk to the driver."""


@dataclass
class Gpu:
    index: int
    uuid: str
    used_mib: int
    total_mib: int


@dataclass
class GpuApp:
    gpu_uuid: str
    pid: int | None                 # None where a container hides host pids
    name: str
    used_mib: int | None


def _num(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) if text and text[0].isdigit() else None   # "[N/A]", "[Not Supported]"


def parse_gpus(text: str) -> list[Gpu]:
    out = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 4 and cols[0].isdigit():
            out.append(Gpu(int(cols[0]), cols[1], _num(cols[2]) or 0, _num(cols[3]) or 0))
    return out


def parse_apps(text: str) -> list[GpuApp]:
    out = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 4 and cols[0].startswith(("GPU-", "MIG-")):
            name = ",".join(cols[2:-1])              # process names may contain commas
            out.append(GpuApp(cols[0], _num(cols[1]), name, _num(cols[-1])))
    return out


def _smi(runner: Runner, args: list[str], smi: str) -> str:
    try:
        res = runner.run([smi, *args], timeout=30)
    except FileNotFoundError:
        raise NvidiaSmiError(f"{runner.name}: {NO_SMI}") from None
    if res.exit_code == 127:
        raise NvidiaSmiError(f"{runner.name}: {NO_SMI}")
    if not res.ok:
        raise NvidiaSmiError(f"{runner.name}: nvidia-smi failed", [smi, *args], res.exit_code, res.tail)
    return res.stdout


def query(runner: Runner, smi: str = "nvidia-smi") -> tuple[list[Gpu], list[GpuApp]]:
    return parse_gpus(_smi(runner, GPU_QUERY, smi)), parse_apps(_smi(runner, APP_QUERY, smi))


def gpu_names(runner: Runner, targets: list[int] | None, smi: str = "nvidia-smi") -> list[str]:
    """The model name of each target GPU (all when None), e.g. ['NVIDIA H200']."""
    text = _smi(runner, ["--query-gpu=index,name", "--format=csv,noheader"], smi)
    rows = [line.split(",", 1) for line in text.strip().splitlines() if "," in line]
    return [name.strip() for idx, name in rows if idx.strip().isdigit()
            and (targets is None or int(idx) in targets)]


MACHINE_QUERY = ["--query-gpu=index,name,uuid,power.limit", "--format=csv,noheader,nounits"]


def parse_machine(text: str, targets: list[int] | None) -> str:
    """nvidia-smi's `index, name, uuid, power.limit` rows as one short id of the target GPUs: "NVIDIA H100 80GB
    HBM3 x1, 700 W, gpu-1a2b3c4d" (the UUIDs hashed: which physical cards, not their serials); "" when none."""
    rows = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 4 and cols[0].isdigit() and (targets is None or int(cols[0]) in targets):
            rows.append((", ".join(cols[1:-2]), cols[-2], cols[-1]))
    if not rows:
        return ""
    names = " + ".join(sorted({n for n, _, _ in rows}))
    watts = sorted({w for _, _, w in rows})
    power = ", ".join(f"{float(w):.0f} W" if w.replace(".", "", 1).isdigit() else w for w in watts)
    card = hashlib.sha256(",".join(sorted(u for _, u, _ in rows)).encode()).hexdigest()[:8]
    return f"{names} x{len(rows)}, {power}, gpu-{card}"


def machine(runner: Runner, targets: list[int] | None, smi: str = "nvidia-smi") -> str:
    """The target GPUs as `parse_machine` names them; "" where the host cannot say (never an error: a trial's
    record, not a gate)."""
    try:
        return parse_machine(_smi(runner, MACHINE_QUERY, smi), targets)
    except (TunectlError, OSError):
        return ""


def gpu_problems(gpus: list[Gpu], apps: list[GpuApp], targets: list[int] | None, clean_mib: int,
                 pids: set[int] | None = None) -> list[str]:
    """Why the target GPUs are not clean: memory over threshold, compute apps on them, snapshot pids listed."""
    chosen = [g for g in gpus if targets is None or g.index in targets]
    uuids = {g.uuid: g.index for g in chosen}
    out = [f"GPU {g.index} uses {g.used_mib} MiB of {g.total_mib} (limit {clean_mib})"
           for g in chosen if g.used_mib > clean_mib]
    for a in apps:
        if a.gpu_uuid in uuids or (pids and a.pid in pids):
            mem = f"{a.used_mib} MiB" if a.used_mib is not None else "memory n/a"
            out.append(f"pid {a.pid if a.pid is not None else '?'} {a.name} on GPU {uuids.get(a.gpu_uuid, '?')} "
                       f"({mem})")
    missing = [t for t in targets or [] if t not in {g.index for g in gpus}]
    out += [f"GPU {t} does not exist (host has {len(gpus)})" for t in missing]
    return out


def wait_gpu_release(runner: Runner, targets: list[int] | None, clean_mib: int, timeout: float,
                     pids: set[int] | None = None, poll_s: float = 1.0, smi: str = "nvidia-smi",
                     on_wait: Callable[[list[str]], None] | None = None) -> float:
    """Poll until the target GPUs are clean; seconds waited, or HostDirtyError with the evidence."""
    start = time.monotonic()
    while True:
        problems = gpu_problems(*query(runner, smi), targets, clean_mib, pids)
        if not problems:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise HostDirtyError(f"{runner.name}: GPUs not released after {timeout:.0f}s", problems)
        if on_wait:
            on_wait(problems)
        time.sleep(poll_s)


def host_helper(runner: Runner, command: str, arg: dict[str, Any], python: str = "python3") -> Any:
    res = runner.run([python, "-c", HOST_HELPER, command, json.dumps(arg)], timeout=60)
    if not res.ok:
        raise RunnerError(f"{runner.name}: host probe {command!r} failed", [python, "-c", "..."], res.exit_code,
                          res.tail)
    return json.loads(res.stdout)


def leftovers(runner: Runner, keep: set[str] = frozenset(), python: str = "python3") -> list[str]:
    """Live processes carrying a TUNECTL_RUN_ID (ours from earlier runs), except run ids in keep."""
    rows = host_helper(runner, "ours", {}, python)
    return [f"pid {r['pid']} (pgid {r['pgid']}, run {r['run_id']}): {r['cmdline'][:100]}"
            for r in rows if r["run_id"] not in keep]


def own_leftovers(runner: Runner, workdir: str, python: str = "python3") -> dict[int, ProcHandle]:
    """The process groups of tunectl's earlier runs under `workdir` (a server left by a killed tunectl with this
    profile's host.workdir), by process group id. Runs elsewhere (another study, another user's) are not listed."""
    root = workdir.rstrip("/") + "/"
    groups: dict[int, ProcHandle] = {}
    for r in host_helper(runner, "ours", {}, python):
        if (r.get("cwd") or "").startswith(root):
            groups.setdefault(int(r["pgid"]), ProcHandle(run_id=r["run_id"], dir=r["cwd"], pgid=int(r["pgid"])))
    return groups


KILL_WAIT_S = 10.0      # how long SIGKILLed processes get to leave the process table before a group is judged


def terminate(runner: Runner, groups: dict[Any, ProcHandle], grace_s: float) -> set[Any]:
    """Stop process groups by their recorded handle, never by name: SIGTERM each one that has processes, SIGKILL
    what is left after grace_s, then wait up to KILL_WAIT_S for the killed ones to leave (a killed process is not
    gone at once on a loaded host; judged at once, a caller would keep or skip what it removes after). The keys
    that needed SIGKILL."""
    live = {k: h for k, h in groups.items() if runner.group_processes(h)}
    for h in live.values():
        runner.signal_group(h, signal.SIGTERM)

    def gone(keys: Any, limit: float) -> None:
        deadline = time.monotonic() + limit
        while any(runner.group_processes(live[k]) for k in keys) and time.monotonic() < deadline:
            time.sleep(0.1)

    gone(live, grace_s)
    forced = {k for k, h in live.items() if runner.group_processes(h)}
    for k in forced:
        runner.signal_group(live[k], signal.SIGKILL)
    gone(forced, KILL_WAIT_S)
    return forced


def stop_groups(runner: Runner, groups: dict[int, ProcHandle], grace_s: float = 20.0) -> list[str]:
    """`terminate` the leftover groups; one line per group: stopped (with SIGKILL), or still running with its pids."""
    forced = terminate(runner, groups, grace_s)
    out = []
    for pgid, handle in groups.items():
        left = runner.group_processes(handle)
        if left:
            out.append(f"process group {pgid} (run {handle.run_id}) still running after SIGKILL: pid "
                       + ", ".join(str(p.pid) for p in left))
        else:
            out.append(f"process group {pgid} (run {handle.run_id}) stopped"
                       + (" with SIGKILL" if pgid in forced else ""))
    return out


def port_problems(runner: Runner, ports: list[int]) -> list[str]:
    out = []
    for port in ports:
        owner = runner.port_owner(port)
        if owner is True:
            out.append(f"port {port} is taken by a process we cannot see")
        elif owner is not None:
            out.append(f"port {port} is taken by pid {owner.pid} (pgid {owner.pgid}): {owner.cmdline[:100]}")
    return out


def free_disk_gb(runner: Runner, path: str) -> float:
    probe = path
    while probe not in ("", "/") and not runner.exists(probe):
        probe = probe.rsplit("/", 1)[0] if "/" in probe else ""      # "a/b" -> "a" -> "": never the same again
    res = runner.run(["df", "-Pk", "--", probe or "/"], timeout=30)
    if not res.ok:
        raise RunnerError(f"{runner.name}: df failed for {probe}", ["df", "-Pk", probe], res.exit_code, res.tail)
    return int(res.stdout.strip().splitlines()[-1].split()[3]) / 1024 / 1024


def ensure_clean(runner: Runner, targets: list[int] | None, clean_mib: int, ports: list[int],
                 keep_runs: set[str] = frozenset(), smi: str | None = "nvidia-smi") -> None:
    """The pre-launch gate: raise HostDirtyError listing every problem at once."""
    problems = leftovers(runner, keep_runs) + port_problems(runner, ports)
    if smi:
        problems += gpu_problems(*query(runner, smi), targets, clean_mib)
    if problems:
        raise HostDirtyError(f"{runner.name}: host is not clean, refusing to launch", problems)
