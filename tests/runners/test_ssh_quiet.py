"""A server that stops accepting under load (a crash at c=512) behind the SSH port forward: paramiko's
"Secsh channel N open FAILED" records never reach the terminal (they were one line per refused connection, 224
in one crash); the CLI says it once."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.runners.sshd import ALIAS

pytestmark = pytest.mark.sshd

SCRIPT = textwrap.dedent("""
    import socket, sys
    from tunectl.profile import HostSpec
    from tunectl.runners.hosts.ssh import SSHRunner
    from tunectl.runners.hosts import _ssh_log

    runner = SSHRunner(HostSpec(kind="ssh", address=sys.argv[1], workdir=sys.argv[2], connect_timeout_s=5))
    host, port = runner.endpoint("127.0.0.1", int(sys.argv[3]))       # nothing listens there: refused
    for _ in range(int(sys.argv[4])):
        c = socket.create_connection((host, port), timeout=10)
        c.settimeout(10)
        assert c.recv(1) == b""                                          # the client sees the connection close
        c.close()
    runner.close()
    print(_ssh_log.NOTES.refused, "|", _ssh_log.summary())
""")


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_refused_forward_channels_print_nothing_and_are_counted(ssh_home, tmp_path) -> None:
    n = 12
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ALIAS, str(tmp_path / "w"), str(_closed_port()), str(n)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(ssh_home)},
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Secsh channel" not in proc.stderr and "open FAILED" not in proc.stderr, proc.stderr
    count, line = proc.stdout.strip().split(" | ")
    assert int(count) == n
    assert line.startswith(f"ssh: {n} connection(s) through the SSH port forward refused by the host")


def test_the_cli_says_it_in_one_line(capsys) -> None:
    from tunectl.commands._common import one_line_errors
    from tunectl.runners.hosts import _ssh_log

    @one_line_errors
    def command() -> None:
        for i in range(5):
            _ssh_log.NOTES.emit(_record(f"Secsh channel {i} open FAILED: Connection refused: Connect failed"))

    _ssh_log.NOTES.reset()
    command()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ssh: 5 connection(s) through the SSH port forward refused by the host (Connection refused: "
                   "Connect failed; the server had stopped accepting)"]
    assert _ssh_log.summary() is None                  # said once


def _record(msg: str):
    import logging

    return logging.LogRecord("paramiko.transport", logging.ERROR, __file__, 1, msg, None, None)
