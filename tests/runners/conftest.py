"""Fixtures of the runner tests: `workdir` (a fresh directory on the runner's host, here the same machine) and,
for the SSH runner, a real sshd (session), a per-test HOME and an SSHRunner on it."""
import pytest

from tests.runners.sshd import make_ssh_runner, ssh_home, ssh_host, sshd  # noqa: F401


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "host"
    d.mkdir()
    return str(d)
