"""Two hosts over two real sshd (loopback), 2 GPU slots each, one study from one coordinator: every trial's
files (trial.json, launch.json, slot.json, levels, server log) land in the coordinator's results/<study>/ and the
report holds every trial with its server log; kill -9 of the coordinator mid-flight loses nothing."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from tests.runners.sshd import sshd_available, start_sshd
from tests.search.test_parallel import told
from tests.helpers.ports import free_port
from tunectl import REPO_ROOT
from tunectl.cli import app
from tunectl.store import StudyStore, read_json

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


@pytest.fixture
def two_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    why = sshd_available()
    if why:
        pytest.skip(why)
    servers = []
    for i in range(2):
        (tmp_path / f"sshd-{i}").mkdir()
        servers.append(start_sshd(tmp_path / f"sshd-{i}"))
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "known_hosts").write_text("".join(s.known_hosts_line + "\n" for s in servers))
    (home / ".ssh" / "config").write_text("".join(
        f"Host box{i}\n  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n  IdentityFile {s.user_key}\n\n"
        for i, s in enumerate(servers)))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    yield servers
    for s in servers:
        s.stop()


def two_host_profile(tmp_path: Path) -> Path:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "parallel-sim-llama70b-8xh100.yaml").read_text())
    del data["host"]
    data["hosts"] = [{"kind": "ssh", "address": f"box{i}", "gpus": [4, 5, 6, 7], "connect_timeout_s": 5,
                      "workdir": str(tmp_path / f"remote-{i}")} for i in range(2)]
    data["server"]["port"] = free_port()
    data["bench"]["levels"] = [1, 32]
    data["search"]["finalists"] = {"top_k": 1, "reruns": 1}
    path = tmp_path / "two-hosts.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def kill_mid_flight(cmd: list[str], store: StudyStore) -> list[int]:
    """Start the coordinator, kill -9 it once a trial was told and two servers are up; the trials in flight."""
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 400
        while True:
            recs = [read_json(p) for p in store.dir.glob("trials/*/slot.json")]
            live = [r for r in recs if "server_started_at" in r and "server_stopped_at" not in r]
            if len(live) >= 2 and told(store, "two"):
                break
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    storage = f"sqlite:///{store.dir / 'study.db'}"
    return [t.number for t in optuna.load_study(study_name="two", storage=storage).trials
            if t.state == TrialState.RUNNING]


@pytest.mark.timeout(900)                       # two studies' worth of SSH trials on a shared 2-core machine
def test_two_hosts_two_slots_each_one_study_one_report_and_kill_9(tmp_path: Path, two_hosts) -> None:
    """kill -9 of the coordinator with trials in flight on both hosts, then the same command: the trials in flight
    are re-queued and run again, nothing that finished is lost, one report holds every trial with its log."""
    root, prof = tmp_path / "results", two_host_profile(tmp_path)
    store = StudyStore("two", root)
    args = ["search", "-p", str(prof), "-n", "6", "--json", "--study", "two", "--results", str(root)]
    in_flight = kill_mid_flight([sys.executable, "-m", "tunectl", *args], store)
    storage = f"sqlite:///{store.dir / 'study.db'}"
    kept = {t.number: t.values for t in optuna.load_study(study_name="two", storage=storage).trials
            if t.state == TrialState.COMPLETE}
    assert kept and len(in_flight) >= 2
    recorded = {}                                 # in flight for Optuna, but the trial had written its last word
    for n in in_flight:
        try:
            status = read_json(store.trial_dir(n) / "trial.json").get("status")
        except (OSError, ValueError):
            continue
        if status in ("ok", "crashed", "pruned", "infra"):
            recorded[n] = status
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, (res.output[-3000:], res.exception)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["trials"] == 6, res.output[-3000:]
    trials = optuna.load_study(study_name="two", storage=storage).trials
    assert {n: trials[n].values for n in kept} == kept                          # nothing finished is lost
    for n in in_flight:
        retry = [t for t in trials if t.user_attrs.get("retry_of") == n]
        if n in recorded:                         # its final trial.json was written before the kill: told that, once
            assert not retry and trials[n].state in (TrialState.COMPLETE, TrialState.FAIL), (n, recorded[n])
            assert recorded[n] != "ok" or trials[n].state == TrialState.COMPLETE, (n, recorded[n])
            continue
        # re-queued, run again with every value the killed trial had drawn (one killed while the sampler was still
        # drawing its values has only some: the retry draws the rest)
        assert trials[n].state == TrialState.FAIL and len(retry) == 1
        assert trials[n].params.items() <= retry[0].params.items()
    store = StudyStore("two", root)
    recs = {int(p.parent.name): read_json(p) for p in store.dir.glob("trials/*/slot.json")}
    assert {(r["host"], tuple(r["gpus"])) for r in recs.values()} == {
        (f"ssh:box{i}", g) for i in range(2) for g in ((4, 5), (6, 7))}          # 4 slots on 2 hosts, all used
    for n, rec in recs.items():                   # every trial's files came back to the coordinator
        d = store.trial_dir(n)
        if "server_started_at" not in rec:        # killed before its server started: no log exists anywhere
            assert n in in_flight and not (d / "levels").is_dir()
            continue
        trial = read_json(d / "trial.json")
        assert (d / "launch.json").exists() and (d / "server.log").read_text().strip()
        if trial["status"] == "ok":
            assert len(list((d / "levels").glob("*.json"))) == 2
            assert "The server is fired up and ready to roll!" in (d / "server.log").read_text()
        assert read_json(d / "launch.json")["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, rec["gpus"]))
        assert trial["host"] == rec["host"]
    report = CliRunner().invoke(app, ["report", "--study", "two", "--results", str(root)], env={"COLUMNS": "200"})
    assert report.exit_code == 0, report.output
    html = (store.dir / "report.html").read_text()
    linked = set(map(int, re.findall(r'href="trials/(\d+)/server.log"', html)))
    assert {n for n, r in recs.items() if "server_started_at" in r} <= linked  # every server's log
    export = CliRunner().invoke(app, ["export", "--study", "two", "--results", str(root)], env={"COLUMNS": "200"})
    assert export.exit_code == 0, export.output
    with open(store.dir / "two-trials.csv") as f:
        assert {int(row["trial"]) for row in csv.DictReader(f)} >= set(recs)
