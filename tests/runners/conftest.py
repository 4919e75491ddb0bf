"""Fixtures for the SSH runner tests: a real sshd (session), a per-test HOME and an SSHRunner on it."""
from tests.runners.sshd import make_ssh_runner, ssh_home, ssh_host, sshd  # noqa: F401
