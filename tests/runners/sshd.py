"""A real OpenSSH sshd for the tests: started on 127.0.0.1 and a free port with generated host and user keys,
plus a per-test HOME with a pinned known_hosts and an ~/.ssh/config alias (and a ProxyJump alias through the
same sshd). Never the system sshd; never a password."""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.ports import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
ALIAS = "tunectl-test"
JUMP_ALIAS = "tunectl-via-jump"

CONFIG = """Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_ed25519
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AllowTcpForwarding yes
AllowAgentForwarding no
X11Forwarding no
ClientAliveInterval 5
ClientAliveCountMax 3
MaxStartups 200
MaxSessions 200
Subsystem sftp internal-sftp
LogLevel ERROR
"""


def sshd_available() -> str | None:
    """None when usable, else why not."""
    if not os.path.exists(SSHD):
        return "OpenSSH sshd is not installed (apt-get install openssh-server)"
    if not shutil.which("ssh-keygen"):
        return "ssh-keygen is not installed (apt-get install openssh-client)"
    return None


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tunectl-test", "-f", str(path)],
                   check=True, timeout=30)
    return path.with_suffix(".pub").read_text().strip()


def children(ppid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == ppid:
                out.append(int(name))
    return out


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen[bytes]
    host_pub: str            # "ssh-ed25519 AAAA..."
    user_key: Path
    user: str

    @property
    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_pub}"

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener): kill one to cut a link."""
        return children(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_sshd(d: Path, port: int | None = None, extra: str = "") -> Sshd:
    """sshd on 127.0.0.1 (a free port unless given); `extra` is appended to its config (e.g. SetEnv lines)."""
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation directory
    host_pub = " ".join(keygen(d / "host_ed25519").split()[:2])
    user_pub = keygen(d / "user_ed25519")
    (d / "authorized_keys").write_text(user_pub + "\n")
    port = port or free_port()
    (d / "sshd_config").write_text(CONFIG.format(port=port, d=d) + extra)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdin=subprocess.DEVNULL,
                            stdout=open(d / "sshd.log", "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)       # outlives the shell that started it
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {(d / 'sshd.log').read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return Sshd(d, port, proc, host_pub, d / "user_ed25519", getpass.getuser())


SSH_CONFIG = """Host {alias}
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {key}

Host {jump_alias}
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {key}
  ProxyJump {alias}
"""


def make_home(home: Path, sshd: Sshd) -> Path:
    """A HOME-like dir: .ssh/known_hosts pinned to the test sshd, .ssh/config with the aliases."""
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    (ssh / "known_hosts").write_text(sshd.known_hosts_line + "\n")
    (ssh / "config").write_text(SSH_CONFIG.format(alias=ALIAS, jump_alias=JUMP_ALIAS, port=sshd.port,
                                                  user=sshd.user, key=sshd.user_key))
    return home


# ---------------------------------------------------------------------------------------------- fixtures

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
    from tunectl.runners.hosts.ssh import SSHRunner

    made = []

    def make(**kw):
        made.append(SSHRunner(kw.pop("host", ssh_host), **{"reconnect_s": 20, **kw}))
        return made[-1]

    yield make
    for r in made:
        r.close()
