"""The Runner conformance suite on SSHRunner against a real OpenSSH sshd, plus what only SSH can show."""
from __future__ import annotations

import pytest

from tests.runners.conformance import *

pytestmark = pytest.mark.sshd


@pytest.fixture
def runner(make_ssh_runner):
    return make_ssh_runner()


@pytest.fixture
def runner_factory(make_ssh_runner):
    return make_ssh_runner


# ---------------------------------------------------------------------------------------------- SSH only
import os
import signal
import time

import paramiko

from tests.runners.conformance import py, wait_for
from tests.runners.sshd import JUMP_ALIAS, keygen
from tunectl.errors import HostKeyError, InfraError
from tunectl.profile import HostSpec
from tunectl.runners.hosts.ssh import SSHAuthError


def cut_links(sshd) -> int:
    """Kill the per-connection sshd processes (by their pid, children of our test sshd): the link drops."""
    pids = sshd.session_pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


def test_unknown_host_key_is_refused_with_fingerprint(make_ssh_runner, ssh_home, sshd):
    (ssh_home / ".ssh" / "known_hosts").write_text("")
    r = make_ssh_runner(reconnect_s=30)
    t0 = time.monotonic()
    with pytest.raises(HostKeyError) as e:
        r.run(["true"])
    assert time.monotonic() - t0 < 5                      # refused at once, never retried
    msg = str(e.value)
    assert "not known" in msg and "SHA256:" in msg and "tunectl hosts trust tunectl-test" in msg
    assert (ssh_home / ".ssh" / "known_hosts").read_text() == ""   # nothing was added behind our back


def test_changed_host_key_is_refused(make_ssh_runner, ssh_home, sshd, tmp_path):
    other = keygen(tmp_path / "impostor").split()
    (ssh_home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    r = make_ssh_runner(reconnect_s=30)
    t0 = time.monotonic()
    with pytest.raises(HostKeyError, match="CHANGED"):
        r.run(["true"])
    assert time.monotonic() - t0 < 5


def test_extra_known_hosts_file_from_profile(make_ssh_runner, ssh_home, sshd, tmp_path):
    (ssh_home / ".ssh" / "known_hosts").write_text("")
    pinned = tmp_path / "tunectl_known_hosts"
    pinned.write_text(sshd.known_hosts_line + "\n")
    host = HostSpec(kind="ssh", address="tunectl-test", known_hosts=str(pinned), connect_timeout_s=5)
    assert make_ssh_runner(host=host).run(["true"]).ok


def test_wrong_key_fails_auth_without_retry(make_ssh_runner, sshd, tmp_path):
    stranger = tmp_path / "stranger"
    keygen(stranger)
    host = HostSpec(kind="ssh", address="tunectl-test", identity_file=str(stranger), connect_timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(SSHAuthError, match="authentication failed"):
        make_ssh_runner(host=host, reconnect_s=30).run(["true"])
    assert time.monotonic() - t0 < 5


def test_config_alias_and_proxyjump(make_ssh_runner, sshd):
    r = make_ssh_runner(host=HostSpec(kind="ssh", address=JUMP_ALIAS, connect_timeout_s=5))
    assert [h.alias for h in r.hops] == ["tunectl-test", JUMP_ALIAS]
    assert r.run(["echo", "through the jump"]).stdout.strip() == "through the jump"
    jump, target = (c.get_transport() for c in r._clients)
    assert jump.is_active() and isinstance(target.sock, paramiko.Channel)   # the target link rides the jump

def test_unreachable_host_is_an_infra_error(make_ssh_runner, sshd):
    from tests.runners.sshd import free_port

    host = HostSpec(kind="ssh", address="127.0.0.1", port=free_port(), connect_timeout_s=1)
    with pytest.raises(InfraError, match="link down"):
        make_ssh_runner(host=host, reconnect_s=2).run(["true"])


def test_link_cut_reconnects_and_rebuilds_state(make_ssh_runner, sshd, workdir):
    events = []
    r = make_ssh_runner(on_event=lambda kind, data: events.append(kind))
    h = r.start_detached(py("import time\nfor i in range(100): print('tick', i, flush=True); time.sleep(0.1)"),
                         f"{workdir}/run", {}, "ssh-cut-1")
    assert wait_for(lambda: b"tick 3" in r.read_file(h.log_path))
    assert cut_links(sshd) >= 1
    time.sleep(0.3)
    # the next call notices the dead link, reconnects, and the run is still there, rebuilt from its dir
    again = r.attach("ssh-cut-1", f"{workdir}/run")
    assert again.pgid == h.pgid
    assert r.poll(again) is None
    assert any(p.pgid == h.pgid for p in r.group_processes(again))
    assert events.count("ssh_connected") >= 2         # it really re-dialled
    size = len(r.read_file(h.log_path))
    assert wait_for(lambda: len(r.read_file(h.log_path)) > size)    # still writing its log
    r.signal_group(again, signal.SIGKILL)
    assert wait_for(lambda: r.group_processes(again) == [])


def test_detached_run_survives_dropped_link_and_forward_recovers(make_ssh_runner, sshd, workdir):
    import urllib.request

    from tests.runners.conformance import FREE_PORT, LISTEN

    r = make_ssh_runner()
    port = int(r.run(py(FREE_PORT)).stdout)
    h = r.start_detached(py(LISTEN, str(port)), f"{workdir}/srv", {}, "ssh-fwd-1")
    try:
        assert wait_for(lambda: b"listening" in r.read_file(h.log_path))
        r.write_file(f"{h.dir}/ping.txt", b"pong")
        host, lport = r.endpoint("127.0.0.1", port)
        with urllib.request.urlopen(f"http://{host}:{lport}/ping.txt", timeout=5) as resp:
            assert resp.read() == b"pong"
        cut_links(sshd)
        time.sleep(0.3)
        # the same local port works again once the runner has re-dialled
        with urllib.request.urlopen(f"http://{host}:{lport}/ping.txt", timeout=10) as resp:
            assert resp.read() == b"pong"
        assert r.poll(h) is None
    finally:
        r.signal_group(h, signal.SIGKILL)


def test_stalled_link_found_by_liveness_probe(make_ssh_runner, sshd):
    r = make_ssh_runner(probe_interval_s=0.2)
    assert r.run(["true"]).ok
    stalled = sshd.session_pids()
    for pid in stalled:                 # the link stays "up" but nothing answers: a half-dead peer
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        assert r.run(["echo", "back"]).stdout.strip() == "back"
        assert time.monotonic() - t0 < 15 and r.reconnects >= 1
    finally:
        for pid in stalled:
            os.kill(pid, signal.SIGKILL)


def test_ssh_agent_auth(make_ssh_runner, ssh_home, sshd, tmp_path, monkeypatch):
    """No key file anywhere in the config or HOME: the key is only in a real ssh-agent."""
    import shutil
    import subprocess

    if not shutil.which("ssh-agent"):
        pytest.skip("ssh-agent is not installed (apt-get install openssh-client)")
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: os.path.exists(sock))
        subprocess.run(["ssh-add", "-q", str(sshd.user_key)], env={**os.environ, "SSH_AUTH_SOCK": sock},
                       check=True, timeout=30, capture_output=True)
        host = HostSpec(kind="ssh", address="127.0.0.1", port=sshd.port, user=sshd.user, connect_timeout_s=5)
        with pytest.raises(SSHAuthError):                     # without the agent: nothing to offer
            make_ssh_runner(host=host).run(["true"])
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        assert make_ssh_runner(host=host).run(["echo", "via agent"]).stdout.strip() == "via agent"
    finally:
        agent.terminate()
        agent.wait(timeout=10)
