"""Makes a GPU machine an SSH host for tunectl, on its own loopback: a real OpenSSH sshd (the tests' recipe,
tests/runners/sshd.py) with generated host and user keys, and a ~/.ssh/config alias for it. The host key is NOT
added to known_hosts: `tunectl hosts trust ALIAS` does that, as a user would.

  python3 bench/gpu/ssh_host.py start DIR ALIAS PORT   -> prints the host key's fingerprint (ssh-keygen -lf)
  python3 bench/gpu/ssh_host.py cut DIR                -> kills every SSH session of that sshd (a dropped link)

Sessions get this process's PATH (sshd's `SetEnv`), like a login on a GPU host whose PATH has CUDA and Python.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.runners.sshd import children, start_sshd


def start(d: Path, alias: str, port: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if os.environ.get("SSHD_LIB_PATH"):        # libraries of a carried OpenSSH build, for sshd and ssh-keygen only
        os.environ["LD_LIBRARY_PATH"] = os.environ["SSHD_LIB_PATH"]
    server = start_sshd(d, port=port, extra=f"SetEnv PATH={os.environ['PATH']}\n")
    ssh = Path.home() / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    with open(ssh / "config", "a") as f:
        f.write(f"\nHost {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {server.user}\n"
                f"  IdentityFile {server.user_key}\n")
    fp = subprocess.run(["ssh-keygen", "-lf", str(d / "host_ed25519.pub")], capture_output=True, text=True)
    print(f"sshd pid {server.proc.pid} on 127.0.0.1:{port}; host key {fp.stdout.strip()}")


def cut(d: Path) -> None:
    listener = int((d / "sshd.pid").read_text())
    pids = children(listener)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"cut {len(pids)} SSH session(s) of sshd {listener}: {pids}")


if __name__ == "__main__":
    if sys.argv[1] == "start":
        start(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        cut(Path(sys.argv[2]))
