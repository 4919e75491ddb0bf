"""kill -9 of the process running a level leaves no client worker behind (runners/clients/_procs.py)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A level of 8 streams over 2 worker processes against a server that accepts connections and never answers: the
# workers sit in their first request (timeout 600 s) when the test kills the process that started them.
COORDINATOR = """
import sys
from tunectl.runners.clients._procs import run_processes
from tunectl.runners.clients.prompts import Prompt
prompts = [Prompt(list(range(16)), 16) for _ in range(16)]
run_processes(f"http://127.0.0.1:{sys.argv[1]}", "sglang", "m", prompts, 8, 2, 600.0, lambda: False, None)
"""


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_coordinator_leaves_no_worker_and_no_fork_server() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)                                    # accepts (the kernel's backlog), never answers
        coord = subprocess.Popen([sys.executable, "-c", COORDINATOR, str(silent.getsockname()[1])], cwd=ROOT)
        try:
            deadline, procs = time.monotonic() + 60, []
            while time.monotonic() < deadline:
                server = children(coord.pid)                 # the fork server, then its two workers
                procs = server + [w for s in server for w in children(s)]
                if len(procs) >= 3:
                    break
                time.sleep(0.1)
            assert len(procs) >= 3, "the level never started its workers"
            time.sleep(1.0)                                  # the workers are in their requests
            os.kill(coord.pid, signal.SIGKILL)
            coord.wait(10)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(alive(p) for p in procs):
                time.sleep(0.1)
            left = [p for p in procs if alive(p)]
        finally:
            if coord.poll() is None:
                coord.kill()
        for p in left:                                       # never leave them to the next test
            os.kill(p, signal.SIGKILL)
        assert not left, "workers (or their fork server) outlived the process that started the level"
