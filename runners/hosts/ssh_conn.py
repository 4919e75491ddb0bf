"""SSH connection setup for SSHRunner: ~/.ssh/config resolution (aliases, ProxyJump), pinned host keys, key and
agent auth, timeouts, and which errors are worth a reconnect."""
from __future__ import annotations

import base64
import getpass
import hashlib
import os
import socket
import time
from dataclasses import dataclass, field

import paramiko

from tunectl.errors import HostKeyError
from tunectl.profile import HostSpec

TRUST_HINT = "if this is the right host, run `tunectl hosts trust {alias}` (it shows the fingerprint and asks)"


@dataclass
class Hop:
    alias: str
    hostname: str
    port: int
    user: str
    key_files: list[str] = field(default_factory=list)
    known_hosts: list[str] = field(default_factory=list)
    timeout: float = 15.0

    @property
    def display(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load_config(path: str | None) -> paramiko.SSHConfig:
    path = os.path.expanduser(path or "~/.ssh/config")
    return paramiko.SSHConfig.from_path(path) if os.path.isfile(path) else paramiko.SSHConfig()


def _split_dest(dest: str) -> tuple[str | None, str, int | None]:
    user, _, rest = dest.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return user or None, host, port


def resolve(host: HostSpec) -> list[Hop]:
    """The hops to the target, jump hosts first, the target last."""
    cfg = load_config(host.ssh_config)
    target = _hop(cfg, host.address or "", host.user, host.port, host.identity_file, host.connect_timeout_s)
    if host.known_hosts:
        target.known_hosts.append(os.path.expanduser(host.known_hosts))
    jump = host.proxy_jump or cfg.lookup(host.address or "").get("proxyjump")
    hops = []
    if jump and jump.lower() != "none":
        for dest in jump.split(","):
            user, name, port = _split_dest(dest.strip())
            hops.append(_hop(cfg, name, user, port, None, host.connect_timeout_s))
    return hops + [target]


def _hop(cfg: paramiko.SSHConfig, alias: str, user: str | None, port: int | None, key: str | None,
         timeout: float) -> Hop:
    c = cfg.lookup(alias)
    keys = [key] if key else list(c.get("identityfile", []))
    files = [os.path.expanduser("~/.ssh/known_hosts")]
    files += [os.path.expanduser(p) for p in c.get("userknownhostsfile", "").split() if p]
    if "connecttimeout" in c:
        timeout = min(timeout, float(c["connecttimeout"]))
    return Hop(alias=alias, hostname=c.get("hostname", alias), port=int(port or c.get("port", 22)),
               user=user or c.get("user") or getpass.getuser(),
               key_files=[os.path.expanduser(k) for k in keys], known_hosts=files, timeout=timeout)


class _RejectWithFingerprint(paramiko.MissingHostKeyPolicy):
    """RejectPolicy that says which key was offered and how to accept it deliberately."""

    def __init__(self, alias: str):
        self.alias = alias

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(f"host key of {hostname} is not known ({key.get_name()} {fingerprint(key)}): refusing "
                           "to connect; " + TRUST_HINT.format(alias=self.alias))


def connect_hop(hop: Hop, sock: paramiko.Channel | None, target_alias: str) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    for f in hop.known_hosts:
        if os.path.isfile(f):
            client.get_host_keys().load(f)
    client.set_missing_host_key_policy(_RejectWithFingerprint(target_alias))
    try:
        client.connect(hop.hostname, port=hop.port, username=hop.user, key_filename=hop.key_files or None,
                       allow_agent=True, look_for_keys=not hop.key_files, timeout=hop.timeout,
                       banner_timeout=hop.timeout, auth_timeout=hop.timeout, channel_timeout=hop.timeout,
                       sock=sock)
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostKeyError(
            f"host key of {hop.display} CHANGED: known_hosts has {fingerprint(e.expected_key)}, the server offers "
            f"{e.key.get_name()} {fingerprint(e.key)}; this can be an attack. If the host was reinstalled, remove "
            f"the old entry (ssh-keygen -R '{hop.display}') and run `tunectl hosts trust {target_alias}`") from None
    except BaseException:
        client.close()
        raise
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(15)
    if isinstance(transport.sock, socket.socket):       # small SSH packets (forwarded SSE chunks) go out now
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def connect_chain(hops: list[Hop], target_alias: str) -> list[paramiko.SSHClient]:
    """Connect through every hop (ProxyJump); returns the clients, the target's last."""
    clients: list[paramiko.SSHClient] = []
    sock = None
    try:
        for i, hop in enumerate(hops):
            client = connect_hop(hop, sock, target_alias if i == len(hops) - 1 else hop.alias)
            clients.append(client)
            if i + 1 < len(hops):
                nxt = hops[i + 1]
                transport = client.get_transport()
                assert transport is not None
                sock = transport.open_channel("direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                                              timeout=hop.timeout)
    except BaseException:
        for c in reversed(clients):
            c.close()
        raise
    return clients


def is_transient(exc: BaseException) -> bool:
    """Link trouble worth a reconnect; never auth or host-key failures."""
    if isinstance(exc, (HostKeyError, paramiko.AuthenticationException, paramiko.BadHostKeyException)):
        return False
    return isinstance(exc, (paramiko.SSHException, EOFError, OSError, socket.timeout))


def fetch_host_key(hop: Hop, sock: paramiko.Channel | None = None) -> paramiko.PKey:
    """The key the server offers, without authenticating (for `tunectl hosts trust`)."""
    s = sock or socket.create_connection((hop.hostname, hop.port), timeout=hop.timeout)
    t = paramiko.Transport(s)
    try:
        t.banner_timeout = hop.timeout
        t.start_client(timeout=hop.timeout)
        return t.get_remote_server_key()
    finally:
        t.close()


def collect(chan: paramiko.Channel, deadline: float) -> tuple[str, str, int | None]:
    """stdout, stderr and exit status of an exec channel; None status when the deadline passed first."""
    out, err = bytearray(), bytearray()
    while True:
        busy = False
        if chan.recv_ready():
            out += chan.recv(65536)
            busy = True
        if chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
            busy = True
        if busy:
            continue
        if chan.exit_status_ready() or chan.closed:
            break
        if time.monotonic() > deadline:
            return out.decode(errors="replace"), err.decode(errors="replace"), None
        if not chan.get_transport().is_active():
            raise EOFError("ssh link lost while a command ran")
        chan.status_event.wait(0.02)
    while chan.recv_ready():
        out += chan.recv(65536)
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)
    code = chan.recv_exit_status() if chan.exit_status_ready() else None
    return out.decode(errors="replace"), err.decode(errors="replace"), code
