"""The client host's own limits. A level of more streams than the soft limit of open files allows: the client raises
its limit within the hard one, as sglang.bench_serving does, and so does the stand-in, as SGLang's server does; a
stock soft limit of 1,024 no longer fails a level of 1,024 streams with "Too many open files". A level of more streams
than the host has local ports (`sweep -c 100000`) fails as the client's limit, said so, not as a server that
refused the connection."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.profiles import fast_default

ROOT = Path(__file__).resolve().parents[2]
SOFT = 256


def _low_soft_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4 * SOFT, reason="the hard limit is too low")
def test_a_level_of_more_streams_than_the_soft_limit_runs_every_request(tmp_path: Path) -> None:
    profile, _ = fast_default(tmp_path, time_scale=None)
    res = subprocess.run([sys.executable, "-m", "tunectl", "sweep", "-p", str(profile), "-c", str(2 * SOFT),
                          "--study", "u", "--results", str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False, preexec_fn=_low_soft_limit)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    [lv] = json.loads((tmp_path / "r" / "u" / "trials" / "0" / "trial.json").read_text())["levels"]
    assert lv["status"] == "ok", lv
    assert lv["completed"] > 2 * SOFT and lv["failed_requests"] == 0, lv


def _netns() -> bool:
    """A private network namespace can be made here (root, unshare and ip): its port range is ours to shrink."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _netns(), reason="needs root, unshare and ip to make a network namespace")
def test_a_level_past_the_hosts_local_ports_fails_as_the_clients_limit(tmp_path: Path) -> None:
    """In a namespace of its own with 16 local ports, 64 streams cannot all connect: the level failed and said
    "connection refused" (the server gone) in trial.json only; it now says the client host ran out of ports, in the
    sweep's output too, and the level below it still counts."""
    profile, _ = fast_default(tmp_path, time_scale=None)
    setup = "ip link set lo up && echo '40000 40015' > /proc/sys/net/ipv4/ip_local_port_range && exec \"$@\""
    res = subprocess.run(["unshare", "-n", "sh", "-c", setup, "sh", sys.executable, "-m", "tunectl", "sweep", "-p",
                          str(profile), "-c", "4,64", "--study", "u", "--results", str(tmp_path / "r")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    low, high = json.loads((tmp_path / "r" / "u" / "trials" / "0" / "trial.json").read_text())["levels"]
    assert low["status"] == "ok" and low["failed_requests"] == 0, low
    assert high["status"] == "failed" and high["errors"][0].startswith("client host limit: no free local port"), high
    assert not any("connection refused" in e for e in high["errors"]), high
    assert "c64: failed: client host limit: no free local port" in " ".join(res.stdout.split()), res.stdout[-2000:]
