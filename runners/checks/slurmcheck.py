"""`tunectl check` on a Slurm profile (`host.kind: slurm`): is the cluster ready for a study?

- partition: it exists and is up (`scontrol show partition`);
- gpus: some node of the partition has the GPUs one trial asks for (`sinfo` gres);
- account: a trial's job would be accepted as the profile asks for it (`sbatch --test-only` with the trial's
  options: partition, account, QoS, time limit, GPUs, constraint, extra options), without submitting anything;
- shared_dir: a short job on a node writes a file under `host.slurm.shared_dir`, and this machine reads it back;
- tunectl: the node's Python runs the in-job trial (`tunectl.wiring.slurm_agent` imports there).
The engine checks (python, SGLang or the stand-in imports), flags and patches run on a node as short jobs through
the runner (runners/checks/readiness.py). Nothing here runs a shell string.
"""
from __future__ import annotations

import re
import uuid
from typing import Any

from tunectl.runners.hosts import slurm_jobs as jobs

NAMES = ("shared_dir", "tunectl")


def _partition(c: Any) -> Any:
    from tunectl.runners.checks.readiness import Check

    name = c.runner.spec.partition
    res = jobs.call(["scontrol", "--oneliner", "show", "partition", *([name] if name else [])])
    if res.returncode != 0 or "PartitionName=" not in res.stdout:
        return Check("partition", False, f"no partition {name!r}: {(res.stderr or res.stdout).strip()[:200]}",
                     "set host.slurm.partition to one `sinfo` lists")
    line = res.stdout.splitlines()[0]
    state = re.search(r"State=(\S+)", line)
    found = re.search(r"PartitionName=(\S+)", line)
    up = state is not None and state.group(1) == "UP"
    return Check("partition", up, f"{found.group(1) if found else name} is {state.group(1) if state else '?'}",
                 "" if up else "ask the cluster's admins, or pick another partition")


def _account(c: Any) -> Any:
    from tunectl.runners.checks.readiness import Check

    opts = c.runner.job_options()
    res = jobs.call(["sbatch", "--test-only", "--nodes=1", "--ntasks=1", *opts, "--wrap", "true"], timeout=60)
    said = (res.stderr or res.stdout).strip().splitlines()
    last = said[-1] if said else f"exit {res.returncode}"
    return Check("account", res.returncode == 0, f"a trial's job ({' '.join(opts)}): {last}",
                 "" if res.returncode == 0 else "fix host.slurm account/qos/partition/time_limit/gpus_per_trial")


def _gpus(c: Any) -> Any:
    from tunectl.runners.checks.readiness import Check

    want = c.runner.gpus
    part = c.runner.spec.partition
    res = jobs.call(["sinfo", "--noheader", "--Node", *(["--partition", part] if part else []), "--format=%N|%G"])
    best = 0
    for row in res.stdout.splitlines():
        for m in re.finditer(r"gpu(?::[^:,()]+)?:(\d+)", row.split("|", 1)[-1]):
            best = max(best, int(m.group(1)))
    ok = best >= want
    return Check("gpus", ok, f"a trial asks for {want} GPU(s); the partition's largest node has {best}",
                 "" if ok else "lower tp-size or server.gpus_per_trial, or use a partition with bigger nodes")


def _shared(c: Any) -> Any:
    from tunectl.runners.checks.readiness import Check

    shared = c.runner.spec.shared_dir
    probe = f"{shared}/.tunectl-check-{uuid.uuid4().hex[:12]}"
    code = "import socket,sys; open(sys.argv[1], 'w').write(socket.gethostname())"
    res = c.runner.run([c.runner.python, "-c", code, probe], timeout=120)
    node = c.runner.read_file(probe).decode().strip()
    if node:
        c.runner.remove_tree(probe)
        return Check("shared_dir", True, f"{shared}: written by a job on {node}, read here")
    return Check("shared_dir", False, f"{shared}: a job could not write it or this machine cannot see what it "
                 f"wrote (exit {res.exit_code}: {res.tail[-200:]})",
                 "set host.slurm.shared_dir to a filesystem mounted at the same path here and on the nodes")


def _tunectl(c: Any) -> Any:
    from tunectl.runners.checks.readiness import Check

    code = "import tunectl, tunectl.wiring.slurm_agent; print(tunectl.__version__)"
    res = c.runner.run([c.prof.server.python or c.runner.python, "-c", code], timeout=120)
    return Check("tunectl", res.ok, f"tunectl {res.stdout.strip()} on a node" if res.ok else
                 f"a node cannot run the trial's job: {res.tail[-200:]}",
                 "" if res.ok else "pip install tunectl into the nodes' environment (host.slurm.venv)")


FIRST = [_partition, _gpus, _account]   # asked of slurmctld: no job runs before they pass
STEPS = [_shared, _tunectl]
