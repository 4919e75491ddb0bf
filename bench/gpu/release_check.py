"""Real-GPU check of host hygiene: a process group that holds GPU memory is started detached, tunectl sees the
memory through nvidia-smi, kills the group by its recorded process group id, and waits until the memory is back.

Run on a machine with an NVIDIA GPU and torch:  python3 bench/gpu/release_check.py OUTDIR
Writes the raw nvidia-smi outputs (idle, busy, released) to OUTDIR for the test fixtures and prints a table.
"""
from __future__ import annotations

import signal
import sys
import time
import uuid
from pathlib import Path

from tunectl.runners.checks import hostcheck
from tunectl.runners.hosts.local import LocalRunner

HOLD = "import torch, time; x = torch.empty(8 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); " \
       "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(600)"


def capture(runner: LocalRunner, out: Path, tag: str) -> tuple[list, list]:
    for name, args in (("gpus", hostcheck.GPU_QUERY), ("apps", hostcheck.APP_QUERY)):
        res = runner.run(["nvidia-smi", *args], timeout=30)
        (out / f"nvidia-smi-{name}-{tag}.csv").write_text(res.stdout)
    (out / f"nvidia-smi-{tag}.txt").write_text(runner.run(["nvidia-smi"], timeout=30).stdout)
    return hostcheck.query(runner)


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    runner = LocalRunner()
    rows = []
    gpus, apps = capture(runner, out, "idle")
    rows.append(("idle", gpus[0].used_mib, len(apps)))
    run_id = uuid.uuid4().hex[:12]
    handle = runner.start_detached([sys.executable, "-c", HOLD], f"/tmp/tunectl-release-{run_id}", {}, run_id)
    deadline = time.monotonic() + 120
    while b"holding" not in runner.read_file(handle.log_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    gpus, apps = capture(runner, out, "busy")
    rows.append(("holding 8 GiB", gpus[0].used_mib, len(apps)))
    pids = {p.pid for p in runner.group_processes(handle)}
    t0 = time.monotonic()
    runner.signal_group(handle, signal.SIGKILL)
    waited = hostcheck.wait_gpu_release(runner, [0], clean_mib=1024, timeout=120, pids=pids, poll_s=0.2)
    gpus, apps = capture(runner, out, "released")
    rows.append((f"released after {waited:.2f} s (kill -> clean {time.monotonic() - t0:.2f} s)",
                 gpus[0].used_mib, len(apps)))
    print(f"{'state':<50} {'GPU0 used MiB':>14} {'compute apps':>13}")
    for state, used, napps in rows:
        print(f"{state:<50} {used:>14} {napps:>13}")
    left = runner.group_processes(handle)
    print(f"processes of the run left: {len(left)}; pgid {handle.pgid}; exit code {runner.poll(handle)}")
    return 0 if rows[1][1] - rows[0][1] >= 8000 and not left and rows[2][1] < 1024 else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "nvidia-smi-capture")))
