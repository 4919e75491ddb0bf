"""Fixtures for the SSH runner tests: a real sshd (session), a per-test HOME and an SSHRunner on it."""
from __future__ import annotations

import pytest

from tests.runners.sshd import ALIAS, Sshd, make_home, sshd_available, start_sshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> Sshd:
    why = sshd_available()
    if why:
        pytest.skip(why)
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def ssh_home(tmp_path, monkeypatch, sshd):
    home = make_home(tmp_path / "home", sshd)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)      # no agent from the developer's session
    return home


@pytest.fixture
def ssh_host(ssh_home, tmp_path):
    from tunectl.profile import HostSpec

    return HostSpec(kind="ssh", address=ALIAS, workdir=str(tmp_path / "remote-work"), connect_timeout_s=5)


@pytest.fixture
def make_ssh_runner(ssh_host):
    from tunectl.runners.ssh import SSHRunner

    made = []

    def make(**kw):
        made.append(SSHRunner(kw.pop("host", ssh_host), **{"reconnect_s": 20, **kw}))
        return made[-1]

    yield make
    for r in made:
        r.close()
