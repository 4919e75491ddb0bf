"""The Runner conformance suite on SSHRunner against a real OpenSSH sshd, plus what only SSH can show."""
from __future__ import annotations

import pytest

from tests.runners.conformance import *  # noqa: F401,F403

pytestmark = pytest.mark.sshd


@pytest.fixture
def runner(make_ssh_runner):
    return make_ssh_runner()


@pytest.fixture
def runner_factory(make_ssh_runner):
    return make_ssh_runner


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "host"
    d.mkdir()
    return str(d)
