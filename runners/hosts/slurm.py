"""SlurmRunner: the Runner protocol on a Slurm cluster, through Slurm's own commands only.

- `start_detached` submits one batch job (`sbatch`, an argv list): the job holds its GPUs
  (`--gres=gpu:N`) and runs its command as the launch WRAPPER does, in the run's directory, which must be on the
  shared filesystem (`host.slurm.shared_dir`): its log, pgid and exit code come back through it. The job id is in
  `handle.extra["job_id"]` and `<dir>/job_id`; the job's name is `tunectl.<run id>`, its comment `tunectl:<run id>`.
- `run` is a short job of its own (`srun ... env -- argv`): the command runs on a node of the partition.
- `group_processes`, `signal_group` and `port_owner` run the host helper on the job's node as a step of that job
  (`srun --jobid=<id> --overlap`); a job that ended has no processes left (Slurm reaps what it started).
- files are read and written here, on the shared filesystem (the LocalRunner's file methods).
Jobs are cancelled by their id only (`scancel <id>`), never by name.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from tunectl.errors import InfraError
from tunectl.profile import HostSpec
from tunectl.runners.hosts import slurm_jobs as jobs
from tunectl.runners.hosts.base import ProcHandle, ProcInfo, Result, env_file
from tunectl.runners.hosts.local import LocalRunner

HOST_HELPER = (Path(__file__).parent / "host_helper.py").read_text()

# The batch script: constant text; the run's directory and the command arrive as its arguments ($1 -- argv). It
# does what the launch WRAPPER does (pgid, exit code, env file, own session for the command) and one thing more: it
# outlives Slurm's SIGTERM (a cancel, the time limit, preemption) until its command has ended, because Slurm ends
# the whole job the moment the batch script exits, and the command's own teardown (its server's, by process group)
# needs the job's KillWait. `trap true` (a handler, not SIG_IGN) is not inherited by the command.
JOB_SCRIPT = r"""#!/bin/bash
# tunectl job: records the process group and the exit code of one run, in its directory ($1)
dir="$1"; shift; [ "$1" = "--" ] && shift
cd "$dir" || exit 90
exec >> server.log 2>&1 < /dev/null
trap true TERM INT HUP
cat /proc/sys/kernel/random/boot_id > boot_id 2>/dev/null || true
set -a; . ./env; set +a
setsid "$@" &
child=$!
echo "$child" > pgid.tmp && mv pgid.tmp pgid
while :; do
  wait "$child"; rc=$?
  kill -0 "$child" 2>/dev/null || break
done
wait "$child" 2>/dev/null; last=$?; [ "$last" = 127 ] || rc=$last
echo "$rc" > exit_code.tmp && mv exit_code.tmp exit_code
"""
TASK_END = re.compile(r"^srun: error: \S+: tasks? [\d,-]+: (Exited with exit code|Killed|Terminated)")
KILLED = 128 + 9                     # the exit code of a job that ended before its wrapper could record one


class SlurmRunner(LocalRunner):
    relays_in_process = False

    def __init__(self, host: HostSpec, python: str | None = None, gpus: int = 0, start_wait_s: float = 600.0) -> None:
        super().__init__()
        self.start_wait_s = start_wait_s    # start_detached: how long a job may queue before it counts as failed
        assert host.slurm is not None, "host.kind slurm needs host.slurm"
        self.host, self.spec, self.gpus = host, host.slurm, gpus
        venv_py = f"{self.spec.venv}/bin/python" if self.spec.venv else None
        self.python = python or venv_py or "python3"
        self.name = f"slurm:{self.spec.partition or 'default'}"
        self._states: dict[str, tuple[float, jobs.JobInfo]] = {}

    # ------------------------------------------------------------------ what every job asks for
    def job_options(self, gpus: int | None = None, time_limit: str | None = None) -> list[str]:
        s, n = self.spec, self.gpus if gpus is None else gpus
        opts = [f"--{k}={v}" for k, v in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                                         ("constraint", s.constraint), ("mem", s.mem),
                                         ("cpus-per-task", s.cpus_per_trial), ("container", s.container)) if v]
        opts.append(f"--time={time_limit or s.time_limit}")
        if n:
            opts.append(f"--gres=gpu:{n}")
        return [*opts, *s.sbatch_options]

    # ------------------------------------------------------------------ commands: a short job each
    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None) -> Result:
        name = f"tunectl.run-{uuid.uuid4().hex[:12]}"
        minutes = max(1, int(timeout // 60) + 2)
        cmd = ["srun", "--quiet", "--nodes=1", "--ntasks=1", f"--job-name={name}",
               f"--chdir={cwd or self.spec.shared_dir}", *self.job_options(gpus=0, time_limit=str(minutes)),
               "--", "env", "--", *argv]     # env: a missing command is exit 127, as in a shell
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, start_new_session=True,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            for job_id, *_ in jobs.mine(name):
                jobs.cancel(job_id)
            self._kill_group(proc.pid)
            out, err = proc.communicate()
            timed_out = True
        text = err.decode(errors="replace").splitlines(keepends=True)
        err_s = "".join(line for line in text if not TASK_END.match(line))   # srun's own word on the exit
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return Result(list(argv), code, out.decode(errors="replace"), err_s, timed_out=timed_out)

    def helper(self, handle: ProcHandle | None, command: str, arg: dict[str, Any]) -> Any:
        argv = [self.python, "-c", HOST_HELPER, command, json.dumps(arg)]
        if handle is None:
            res = self.run(argv, timeout=60)
        else:
            res = self._step(handle, argv)
            if res is None:
                return None
        if not res.ok and not res.stdout.strip():   # (a signal step may be ended with the job it just ended)
            raise InfraError(f"{self.name}: host helper {command} failed (exit {res.exit_code}): {res.tail}")
        return json.loads(res.stdout)

    def _step(self, handle: ProcHandle, argv: list[str]) -> Result | None:
        """argv as a step of the handle's running job (on its node); None when the job is not running."""
        job_id = self.job_id(handle)
        if not job_id or self.state(job_id, fresh=True).kind != "running":
            return None
        cmd = ["srun", "--quiet", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", "--gres=none",
               "--mem=0", "--", *argv]
        res = subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        ended = any(w in res.stderr for w in (b"has expired", b"Invalid job id", b"CANCELLED AT"))
        if res.returncode != 0 and (ended or self.state(job_id, fresh=True).state != "RUNNING"):
            return None                        # it ended between the two questions (Slurm reaps its processes)
        return Result(argv, res.returncode, res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace"))

    # ------------------------------------------------------------------ jobs
    def start_detached(self, argv: list[str], workdir: str, env: dict[str, str], run_id: str) -> ProcHandle:
        """Submit, then wait (up to start_wait_s) until the job runs and its wrapper recorded the pgid."""
        handle = self.submit(argv, workdir, env, run_id)
        deadline = time.monotonic() + self.start_wait_s
        while handle.pgid is None and time.monotonic() < deadline:
            if self.state(self.job_id(handle)).kind not in ("waiting", "running"):
                break
            time.sleep(0.05)
            self._fill_pgid(handle)
        if handle.pgid is None and super().poll(handle) is None:
            state = self.state(self.job_id(handle), fresh=True)
            self.cancel(handle)
            raise InfraError(f"{self.name}: job {self.job_id(handle)} did not start its command in "
                             f"{self.start_wait_s:.0f} s ({state.state} {state.reason})")
        return handle

    def submit(self, argv: list[str], workdir: str, env: dict[str, str], run_id: str) -> ProcHandle:
        """One batch job running argv under the launch wrapper in workdir; returns at once (it may queue)."""
        self.makedirs(workdir, 0o700)
        self.write_file(f"{workdir}/job.sh", JOB_SCRIPT.encode(), 0o700)
        self.write_file(f"{workdir}/env", env_file({**env, "TUNECTL_RUN_ID": run_id}).encode(), 0o600)
        options = [f"--job-name=tunectl.{run_id}", f"--comment=tunectl:{run_id}", f"--chdir={workdir}",
                   f"--output={jobs.escape_path(workdir)}/slurm.out", "--open-mode=append", "--no-requeue",
                   "--nodes=1", "--ntasks=1", *self.job_options()]
        job_id = jobs.submit(options, f"{workdir}/job.sh", [workdir, "--", *argv])
        self.write_file(f"{workdir}/job_id", job_id.encode(), 0o600)
        handle = ProcHandle.for_dir(run_id, workdir)
        handle.extra["job_id"] = job_id
        return handle

    def attach(self, run_id: str, workdir: str) -> ProcHandle:
        """Rebuild a handle from the run's directory (a coordinator that was restarted)."""
        handle = ProcHandle.for_dir(run_id, workdir)
        job_id = self.read_file(f"{workdir}/job_id").decode().strip()
        if job_id:
            handle.extra["job_id"] = job_id
        self._fill_pgid(handle)
        return handle

    def job_id(self, handle: ProcHandle) -> str:
        if "job_id" not in handle.extra:
            raw = self.read_file(f"{handle.dir}/job_id").decode().strip()
            if raw:
                handle.extra["job_id"] = raw
        return handle.extra.get("job_id", "")

    def state(self, job_id: str, fresh: bool = False, max_age_s: float = 1.0) -> jobs.JobInfo:
        cached = self._states.get(job_id)
        if cached and not fresh and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        got = jobs.info(job_id)
        self._states[job_id] = (time.monotonic(), got)
        return got

    def cancel(self, handle: ProcHandle) -> None:
        job_id = self.job_id(handle)
        if job_id:
            jobs.cancel(job_id)

    def _fill_pgid(self, handle: ProcHandle) -> None:
        if handle.pgid is None:
            raw = self.read_file(handle.pgid_path).strip()
            handle.pgid = int(raw) if raw.isdigit() else None

    def poll(self, handle: ProcHandle) -> int | None:
        self._fill_pgid(handle)
        code = super().poll(handle)
        if code is not None:
            return code
        job_id = self.job_id(handle)
        if not job_id or self.state(job_id).kind in ("waiting", "running"):
            return None
        code = super().poll(handle)                  # written in the instant the job ended
        return KILLED if code is None else code

    def group_processes(self, handle: ProcHandle) -> list[ProcInfo]:
        self._fill_pgid(handle)
        rows = self.helper(handle, "procs", {"run_id": handle.run_id, "pgid": handle.pgid})
        return [ProcInfo(**r) for r in rows or []]

    def signal_group(self, handle: ProcHandle, sig: int) -> None:
        self._fill_pgid(handle)
        self.helper(handle, "signal", {"run_id": handle.run_id, "pgid": handle.pgid, "sig": int(sig)})

    def port_owner(self, port: int) -> ProcInfo | None | bool:
        out = self.helper(None, "port", {"port": int(port)})
        return ProcInfo(**out) if isinstance(out, dict) else out
