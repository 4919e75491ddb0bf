"""A real Slurm cluster of one node for the tests (Debian's slurm-wlm): slurmctld and slurmd started on this machine
with a config, state and spool in a temp dir, on free loopback ports, and stopped by their own process ids.

The node `n1` has GPUS fake GPUs (`Gres=gpu:N`, AutoDetect off, the gres files are links to character devices
that are no GPU: /dev/null, /dev/zero, ...): Slurm counts, allocates and hands them out per job as on a GPU
node, and the stand-in (`sim/`) plays the SGLang server on them. Authentication is Slurm's own `auth/none`
(single machine; munge is not needed). The fixture skips with the reason when the daemons cannot start here
(not installed, or not root: slurmd must be able to run jobs as their user).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.ports import free_port

GPUS = 4
NODE = "n1"
PARTITION = "gpu"
FAKE_DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom"]

CONF = """ClusterName=tunectltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
SlurmUser={user}
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
MinJobAge=900
InactiveLimit=0
JobRequeue=0
MessageTimeout=20
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=16 RealMemory=8000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def slurm_available() -> str | None:
    """None when a test cluster can start here, else why not."""
    for exe in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun"):
        if not shutil.which(exe) and not os.path.exists(f"/usr/sbin/{exe}"):
            return f"{exe} is not installed (apt-get install slurmctld slurmd slurm-client)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs (run the Slurm tests as root)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Cluster:
    dir: Path
    conf: Path
    procs: list[subprocess.Popen[bytes]]
    env: dict[str, str]

    def cmd(self, *argv: str, check: bool = True) -> str:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env={**os.environ, **self.env})
        if check and res.returncode != 0:
            raise RuntimeError(f"{argv}: exit {res.returncode}: {res.stderr}")
        return res.stdout

    def node_state(self) -> str:
        return self.cmd("sinfo", "--noheader", "--nodes", NODE, "--format=%T").strip()

    def set_node(self, state: str, reason: str = "tunectl test") -> None:
        """down (its jobs end NODE_FAIL), drain (no new job starts on it), resume (back in service)."""
        args = [f"nodename={NODE}", f"state={state}"] + ([f"reason={reason}"] if state != "resume" else [])
        self.cmd("scontrol", "update", *args, check=state != "resume")   # resume: a node in service stays so

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.node_state() in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"node {NODE} not back: {self.node_state()}")

    def jobs(self) -> list[str]:
        return [r for r in self.cmd("squeue", "--noheader", "--format=%i|%T|%j").splitlines() if r.strip()]

    def log_tail(self) -> str:
        return "\n".join((self.dir / f).read_text()[-1500:] for f in ("slurmctld.log", "slurmd.log")
                         if (self.dir / f).exists())

    def stop(self) -> None:
        for p in self.procs:                   # ours, by their ids
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def _links(d: Path) -> str:
    for i, dev in enumerate(FAKE_DEVICES[:GPUS]):
        (d / f"gpu{i}").symlink_to(dev)
    return f"AutoDetect=off\nNodeName={NODE} Name=gpu File={d}/gpu[0-{GPUS - 1}]\n"


def start_cluster(d: Path) -> Cluster:
    (d / "state").mkdir()
    (d / "spool").mkdir()
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(host=socket.gethostname(), ctld_port=free_port(), d_port=free_port(), d=d,
                                user="root", node=NODE, gpus=GPUS, partition=PARTITION))
    (d / "gres.conf").write_text(_links(d))
    env = {"SLURM_CONF": str(conf)}
    full = {**os.environ, **env}
    procs = []
    for argv in ([_exe("slurmctld"), "-D", "-i"], [_exe("slurmd"), "-D", "-N", NODE]):
        procs.append(subprocess.Popen(argv, env=full, stdin=subprocess.DEVNULL, stdout=open(d / "daemons.out", "ab"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(0.5)
    cluster = Cluster(d, conf, procs, env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        if cluster.cmd("sinfo", "--noheader", "--format=%T", check=False).strip() == "idle":
            return cluster
        time.sleep(0.3)
    cluster.stop()
    raise RuntimeError(f"the test Slurm did not come up:\n{cluster.log_tail()}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Cluster:
    why = slurm_available()
    if why:
        pytest.skip(why)
    d = Path(tempfile_dir(tmp_path_factory))
    try:
        cluster = start_cluster(d)
    except RuntimeError as e:
        pytest.skip(f"Slurm could not start as this user: {str(e)[:300]}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    yield cluster
    cluster.stop()
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def tempfile_dir(tmp_path_factory) -> str:
    """A short path: slurmd's spool sockets must fit in a unix socket's 108 bytes."""
    import tempfile

    base = tmp_path_factory.getbasetemp()
    return tempfile.mkdtemp(prefix="slurm-", dir=base if len(str(base)) < 60 else None)
