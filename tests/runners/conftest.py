"""Fixtures of the runner tests: `workdir` (a fresh directory on the runner's host, here the same machine) and,
for the SSH runner, a real sshd (session), a per-test HOME and an SSHRunner on it; for the Slurm runner, a real
one-node Slurm (session)."""
import pytest

from tests.runners.slurm_cluster import slurm  # noqa: F401   (one test Slurm per session)
from tests.runners.sshd import make_ssh_runner, ssh_home, ssh_host, sshd  # noqa: F401


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "host"
    d.mkdir()
    return str(d)
