"""Slurm's own commands, as argv lists: submit (`sbatch`), ask (`squeue`, `scontrol show job`, `sacct`), cancel
(`scancel <job id>`). Nothing else is installed on the cluster, and no profile value ever enters a shell string.

`JobInfo.kind` maps a scheduler state to what tunectl does with it:
- "waiting": queued (PENDING, CONFIGURING, REQUEUED, SUSPENDED...): shown as pending, no trial clock runs;
- "running": the job's script runs on its node;
- "done": the script ended by itself (COMPLETED, FAILED): the trial's own files say what happened;
- "infra": the scheduler or the machine ended it (CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE,
  OUT_OF_MEMORY of the job's cgroup): not the config's fault, the trial is retried;
- "gone": Slurm no longer knows the job id (aged out of its records, no accounting).
Jobs are only ever cancelled by the id `sbatch` returned, never by a name pattern.
"""
from __future__ import annotations

import getpass
import re
import subprocess
from dataclasses import dataclass

from tunectl.errors import InfraError

WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
           "STOPPED", "RESIZING"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
DONE = {"COMPLETED", "FAILED", "SPECIAL_EXIT"}
INFRA = {"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
         "REVOKED"}


@dataclass
class JobInfo:
    job_id: str
    state: str                       # Slurm's name: PENDING, RUNNING, TIMEOUT, ...
    reason: str = ""                 # why pending, or why it ended
    node: str = ""
    start: str = ""                  # Slurm's ISO times ("Unknown" / "" before it started)
    end: str = ""
    exit_code: str = ""              # "code:signal" as Slurm prints it

    @property
    def kind(self) -> str:
        base = self.state.split()[0].rstrip("+") if self.state else ""
        for kind, names in (("waiting", WAITING), ("running", RUNNING), ("done", DONE), ("infra", INFRA)):
            if base in names:
                return kind
        return "gone" if base in ("", "GONE") else "running"

    def to_dict(self) -> dict[str, str]:
        return {"job_id": self.job_id, "state": self.state, "reason": self.reason, "node": self.node,
                "start": self.start, "end": self.end, "exit_code": self.exit_code}


def call(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise InfraError(f"{argv[0]}: not found on this machine (Slurm's client commands are needed: "
                         "apt-get install slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"{argv[0]} gave no answer in {timeout:.0f} s (is slurmctld up?)") from None


def submit(options: list[str], script: str, args: list[str]) -> str:
    """`sbatch --parsable <options> <script> <args...>`; the job id."""
    res = call(["sbatch", "--parsable", *options, script, *args], timeout=60)
    if res.returncode != 0:
        raise InfraError(f"sbatch refused the job: {(res.stderr or res.stdout).strip()[-400:]}")
    return res.stdout.strip().split(";")[0]


_FIELD = {k: re.compile(rf"(?:^|\s){k}=(\S*)") for k in
          ("JobState", "Reason", "NodeList", "StartTime", "EndTime", "ExitCode", "BatchHost")}


def _scontrol(job_id: str) -> JobInfo | None:
    res = call(["scontrol", "--oneliner", "show", "job", job_id])
    if res.returncode != 0 or "JobState=" not in res.stdout:
        return None
    got = {k: (m.group(1) if (m := rx.search(res.stdout)) else "") for k, rx in _FIELD.items()}
    return JobInfo(job_id, got["JobState"], got["Reason"], got["BatchHost"] or got["NodeList"],
                   got["StartTime"], got["EndTime"], got["ExitCode"])


def _sacct(job_id: str) -> JobInfo | None:
    res = call(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id,
                "--format=JobID,State,Reason,NodeList,Start,End,ExitCode"])
    rows = [r.split("|") for r in res.stdout.splitlines() if r.startswith(job_id + "|")]
    if res.returncode != 0 or not rows or len(rows[0]) < 7:
        return None
    r = rows[0]
    return JobInfo(job_id, r[1], r[2], r[3], r[4], r[5], r[6])


def info(job_id: str) -> JobInfo:
    """The job's state: `scontrol show job` while slurmctld remembers it, then `sacct` where accounting runs."""
    return _scontrol(job_id) or _sacct(job_id) or JobInfo(job_id, "GONE")


CANCELLED_HERE: set[str] = set()      # jobs this process cancelled: their end is its own doing, not the cluster's


def cancel(job_id: str, signal: str | None = None) -> None:
    """scancel by the job's id (with `signal`: that signal to the job's processes, batch script included)."""
    argv = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), job_id]
    if signal is None:
        CANCELLED_HERE.add(job_id)
    call(argv)


def mine(name_prefix: str) -> list[tuple[str, str, str, str]]:
    """(job id, state, name, comment) of this user's live jobs whose name starts with `name_prefix` (names that
    tunectl gave its own jobs; the caller checks the comment before it cancels anything, by id)."""
    res = call(["squeue", "--noheader", f"--user={getpass.getuser()}", "--format=%i|%T|%j|%k"])
    out = []
    for row in res.stdout.splitlines():
        parts = row.split("|", 3)
        if len(parts) == 4 and parts[2].startswith(name_prefix):
            out.append((parts[0], parts[1], parts[2], parts[3]))
    return out


def escape_path(path: str) -> str:
    """A path for sbatch --output: Slurm reads %x patterns in it, %% is a literal %."""
    return path.replace("%", "%%")
