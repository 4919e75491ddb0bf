"""One trial inside its Slurm job: `python -m tunectl.wiring.slurm_agent <job dir>/spec.json`, run on the compute node.

The whole trial runs here, as tunectl/wiring/trial.py runs it on any host (`run_trial` with a LocalRunner): patches,
launch, ready, the client beside the server (no port forward), the ladder, teardown by process group. Its files
go to `<job dir>/results/<study>/trials/<n>/` on the shared filesystem, where the coordinator reads them back
(tunectl/wiring/slurm_trials.py). The two talk through files in the job dir only:
- `events.jsonl`: the trial's progress events, one JSON line each (the coordinator's live view);
- `prune`: written by the coordinator when a level says the trial is clearly worse; the ladder stops there.
SIGTERM (scancel, the job's time limit, preemption) stops the trial the way Ctrl-C does: the server is torn down
by its process group and the trial is left `interrupted`; the coordinator reads the job's state and counts it as
an infra fault.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from tunectl.models import LevelResult
from tunectl.profile import HostSpec, Profile
from tunectl.store import StudyStore, read_json


def job_profile(spec: dict[str, Any]) -> Profile:
    """The study's profile as the job sees it: this node is a local host (the job's GPUs are what Slurm gave it:
    CUDA_VISIBLE_DEVICES is Slurm's), server directories under the node's `host.workdir`."""
    prof = Profile.model_validate(spec["profile"])
    host = HostSpec(kind="local", workdir=spec["workdir"], gpu_clean_mib=prof.host.gpu_clean_mib,
                    min_free_disk_gb=prof.host.min_free_disk_gb)
    server = prof.server.model_copy(update={"port": free_port(prof.server.port)})
    local = prof.model_copy(update={"host": host, "hosts": [], "server": server})
    local.source = spec.get("source", "")
    return local


def free_port(base: int) -> int:
    """Jobs of one study may share a node: each starts at its own stride above the base (by its job id) and
    takes the first port nobody listens on."""
    start = base + (int(os.environ.get("SLURM_JOB_ID", "0") or 0) % 100) * 10
    for port in [*range(start, min(start + 200, 65536)), *range(base, start)]:
        with socket.socket() as s:
            try:
                s.bind(("", port))
                return port
            except OSError:
                continue
    return base


def main(spec_path: str) -> int:
    from tunectl.runners.hosts.local import LocalRunner
    from tunectl.wiring.trial import TrialContext, run_trial

    spec = read_json(Path(spec_path))
    job_dir = Path(spec_path).parent
    prof = job_profile(spec)
    store = StudyStore(spec["study"], job_dir / "results")
    lock = threading.Lock()

    def on_event(kind: str, data: dict[str, Any]) -> None:
        line = json.dumps({"kind": kind, "data": data}, default=str)
        with lock, open(job_dir / "events.jsonl", "a") as f:
            f.write(line + "\n")

    def should_prune(_lv: LevelResult) -> bool:
        return (job_dir / "prune").exists()

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    ctx = TrialContext(prof, LocalRunner(), store, levels=spec.get("levels"))
    try:
        result = run_trial(ctx, int(spec["n"]), dict(spec["params"]), spec.get("role", "search"), on_event,
                           should_prune)
    except KeyboardInterrupt:
        return 128 + signal.SIGTERM       # the trial's files say `interrupted`; its server is down
    on_event("agent_done", {"status": result.status})
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main(sys.argv[1]))
