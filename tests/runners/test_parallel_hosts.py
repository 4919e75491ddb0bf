"""Two hosts over two real sshd (loopback), 2 GPU slots each, one study from one coordinator: every trial's
files (trial.json, launch.json, slot.json, levels, server log) land in the coordinator's results/<study>/ and the
report holds every trial with its server log."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.runners.sshd import sshd_available, start_sshd
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


def test_two_hosts_two_slots_each_one_study_one_report(tmp_path: Path, two_hosts) -> None:
    root = tmp_path / "results"
    res = CliRunner().invoke(app, ["search", "-p", str(two_host_profile(tmp_path)), "-n", "6", "--json",
                                   "--study", "two", "--results", str(root)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, (res.output[-3000:], res.exception)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["trials"] == 6
    store = StudyStore("two", root)
    recs = {int(p.parent.name): read_json(p) for p in store.dir.glob("trials/*/slot.json")}
    assert {(r["host"], tuple(r["gpus"])) for r in recs.values()} == {
        (f"ssh:box{i}", g) for i in range(2) for g in ((4, 5), (6, 7))}          # 4 slots on 2 hosts, all used
    for n, rec in recs.items():                   # every trial's files came back to the coordinator
        d = store.trial_dir(n)
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
    assert set(recs) <= linked                                                  # every trial, with its log
    export = CliRunner().invoke(app, ["export", "--study", "two", "--results", str(root)], env={"COLUMNS": "200"})
    assert export.exit_code == 0, export.output
    with open(store.dir / "two-trials.csv") as f:
        assert {int(row["trial"]) for row in csv.DictReader(f)} >= set(recs)
