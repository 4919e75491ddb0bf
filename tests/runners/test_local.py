"""The Runner conformance suite on LocalRunner, plus what only a local host can show."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.runners.conformance import *
from tests.runners.conformance import wait_for
from tunectl.runners.hosts.local import LocalRunner


@pytest.fixture
def runner():
    r = LocalRunner()
    yield r
    r.close()


@pytest.fixture
def runner_factory():
    return LocalRunner


def test_run_survives_the_python_that_started_it(runner, workdir):
    """A caller process starts a run and exits; the run keeps going and is still found by its run id."""
    code = ("import sys; from tunectl.runners.hosts.local import LocalRunner; "
            "h = LocalRunner().start_detached(['sleep', '30'], sys.argv[1], {}, 'conf-orphan-1'); print(h.pgid)")
    out = subprocess.run([sys.executable, "-c", code, f"{workdir}/orphan"], capture_output=True, text=True,
                         timeout=30, check=True)
    from tunectl.runners.hosts.base import ProcHandle

    h = ProcHandle.for_dir("conf-orphan-1", f"{workdir}/orphan")
    h.pgid = int(out.stdout)
    time.sleep(0.3)
    assert [(p.pid, p.pgid) for p in runner.group_processes(h)] == [(h.pgid, h.pgid)]  # the sleep leads its group
    runner.signal_group(h, signal.SIGKILL)
    assert wait_for(lambda: runner.group_processes(h) == [])


def test_remove_tree_refuses_shallow_paths(runner):
    for bad in ("/", "/tmp", "relative/dir"):
        with pytest.raises(ValueError):
            runner.remove_tree(bad)


def test_port_owner_names_a_listener_in_this_process(runner):
    import os
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        owner = runner.port_owner(s.getsockname()[1])
        me = open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode()   # pytest, or an xdist worker
        assert owner.pid == os.getpid() and me in owner.cmdline
    finally:
        s.close()
