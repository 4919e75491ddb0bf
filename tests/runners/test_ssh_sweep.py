"""The stand-in through SSHRunner against the real sshd: a full sweep, and the link cut in the middle of the
ladder. Shell metacharacters in flag values and paths reach the host as data."""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.runners.conformance import wait_for
from tests.runners.sshd import ALIAS, free_port
from tunectl import REPO_ROOT
from tunectl.cli import app
from tunectl.profile import load_profile
from tunectl.runners.hosts.base import ProcHandle
from tunectl.store import StudyStore

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def ssh_profile(tmp_path: Path, workdir: str | None = None, **flags) -> Path:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml").read_text())
    data["host"] = {"kind": "ssh", "address": ALIAS, "connect_timeout_s": 5,
                    "workdir": workdir or str(tmp_path / "remote")}
    data["server"]["port"] = free_port()
    data["server"]["flags"].update(flags)
    path = tmp_path / "ssh-profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sweep(tmp_path: Path, prof: Path, levels: str) -> dict:
    res = CliRunner().invoke(app, ["sweep", "-p", str(prof), "-c", levels, "--json", "--study", "s",
                                   "--results", str(tmp_path / "results")], env={"COLUMNS": "200"})
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return json.loads(res.stdout[res.stdout.index("{"):])


def test_full_sweep_through_ssh(tmp_path, ssh_home, sshd, make_ssh_runner):
    doc = sweep(tmp_path, ssh_profile(tmp_path), "1,8,64")
    assert doc["status"] == "ok", doc.get("crash")
    assert doc["host"] == f"ssh:{ALIAS}"
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 8, 64]
    tput = [lv["metrics"]["output_throughput"] for lv in doc["levels"]]
    assert all(t > 0 for t in tput) and tput[2] > tput[0]          # measured through the SSH port forward
    trial = Path(doc["results_dir"])
    assert "The server is fired up and ready to roll!" in (trial / "server.log").read_text()
    assert doc["teardown"]["verdict"] == "clean"
    launch = json.loads((trial / "launch.json").read_text())
    h = ProcHandle.for_dir(launch["run_id"], launch["trial_dir"])
    assert make_ssh_runner().group_processes(h) == []               # nothing of ours left on the host


def test_metacharacters_in_flag_values_and_paths_are_data(tmp_path, ssh_home, sshd):
    workdir = str(tmp_path / "remote $(touch PWNED); `touch PWNED2`")
    prof = ssh_profile(tmp_path, workdir=workdir, **{"served-model-name": "glm'5; touch PWNED3 $(id)"})
    doc = sweep(tmp_path, prof, "1")
    assert doc["status"] == "ok", doc.get("crash")
    assert Path(workdir).is_dir()
    log = (Path(doc["results_dir"]) / "server.log").read_text()
    assert "served_model_name=\"glm'5; touch PWNED3 $(id)\"" in log      # the server got the value verbatim
    assert not [p for p in tmp_path.rglob("PWNED*")] and not Path.home().joinpath("PWNED").exists()


def cut_mid_ladder(tmp_path, sshd, make_ssh_runner):
    """Run one trial through SSH and cut every SSH link (sshd session processes killed by pid) while the second
    level's requests travel through the port forward (once the server's log shows them running)."""
    from tunectl.wiring.trial import TrialContext, run_trial

    prof = load_profile(ssh_profile(tmp_path))
    store = StudyStore("cut", tmp_path / "results")
    runner = make_ssh_runner()
    cut = threading.Event()

    def on_event(kind, data):
        if kind == "level_start" and data["concurrency"] == 64 and not cut.is_set():
            cut.set()
            threading.Thread(target=cut_when_serving, args=(tmp_path / "remote", sshd, 32), daemon=True).start()

    result = run_trial(TrialContext(prof, runner, store, levels=[1, 64, 256, 512]), 0, {}, "sweep", on_event)
    assert cut.is_set()
    return result, store, runner


def test_link_cut_mid_ladder_loses_nothing(tmp_path, ssh_home, sshd, make_ssh_runner):
    """The trial ends as a result (never an exception), the runner re-dials, the server is found again through a
    fresh connection and torn down by its process group, and what was measured before the cut is kept."""
    result, store, runner = cut_mid_ladder(tmp_path, sshd, make_ssh_runner)
    assert runner.reconnects >= 1 and runner.link_epoch >= 1
    saved = json.loads((store.trial_dir(0) / "trial.json").read_text())
    assert saved["status"] == result.status
    assert saved["levels"][0]["concurrency"] == 1 and saved["levels"][0]["status"] == "ok"   # nothing lost
    assert (store.trial_dir(0) / "server.log").stat().st_size > 0
    assert result.crash is None or result.crash.cls == "infra"          # never blamed on the config
    launch = json.loads((store.trial_dir(0) / "launch.json").read_text())
    h = ProcHandle.for_dir(launch["run_id"], launch["trial_dir"])
    fresh = make_ssh_runner()
    assert wait_for(lambda: fresh.group_processes(h) == [], timeout=20)   # torn down, nothing left running
    assert result.teardown["exit_code"] is not None                        # the wrapper saw the end
    assert result.teardown["verdict"] == "clean"
    assert not fresh.exists(launch["trial_dir"])                           # the host keeps nothing after


def test_link_cut_mid_ladder_is_an_infra_fault(tmp_path, ssh_home, sshd, make_ssh_runner):
    """Requests lost while the link was re-dialled (runner.link_epoch moved) are not the config's fault: the
    trial is 'infra', which the search retries."""
    result, _, runner = cut_mid_ladder(tmp_path, sshd, make_ssh_runner)
    assert runner.link_epoch >= 1
    assert result.status == "infra" and result.crash is not None and result.crash.cls == "infra"


def sshd_kill(sshd) -> None:
    for pid in sshd.session_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cut_when_serving(remote: Path, sshd, running: int, timeout_s: float = 60.0) -> None:
    """Cuts the link once the server's log shows a batch of at least `running` requests: mid-level, whatever the
    client's start-up costs on a busy machine."""
    logs = {p: p.stat().st_size for p in remote.glob("*/server.log")}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in remote.glob("*/server.log"):
            text = log.read_text(errors="replace")[logs.get(log, 0):]
            if any(int(n) >= running for n in re.findall(r"#running-req: (\d+)", text)):
                sshd_kill(sshd)
                return
        time.sleep(0.05)


def test_search_retries_the_trial_the_link_cut(tmp_path, ssh_home, sshd, make_ssh_runner):
    """A short study through SSH: the link is cut in trial 0's ladder; the search records the infra fault and runs
    the same configuration again, and every trial's results are on disk."""
    from tunectl.wiring.study import run_search

    prof = load_profile(ssh_profile(tmp_path), {"search.finalists.top_k": 0, "bench.levels": [1, 64, 256]})
    events: list[tuple[str, dict]] = []
    cut = threading.Event()

    def on_event(kind, data):
        events.append((kind, data))
        if kind == "level_start" and data["concurrency"] == 64 and not cut.is_set():
            cut.set()
            threading.Thread(target=cut_when_serving, args=(tmp_path / "remote", sshd, 32), daemon=True).start()

    out = run_search(prof, trials=2, study_name="cut", root=tmp_path / "results", on_event=on_event,
                     runner=make_ssh_runner())
    assert cut.is_set()
    retries = [d for k, d in events if k == "retry"]
    assert retries and retries[0]["n"] == 0, [k for k, _ in events]
    starts = [d for k, d in events if k == "trial_start"]
    first = starts[0]["params"]
    assert any(s["n"] != 0 and s["params"] == first for s in starts[1:])      # the same config, run again
    store = StudyStore("cut", tmp_path / "results")
    for n in store.trial_numbers():
        assert json.loads((store.trial_dir(n) / "trial.json").read_text())["status"] in ("ok", "infra", "pruned",
                                                                                         "crashed")
    assert out.evaluated >= 3


@pytest.mark.parametrize("status, crash_cls", [("failed", None), ("crashed", "hang")])
def test_a_level_lost_to_an_unnoticed_link_drop_is_infra(make_ssh_runner, sshd, status, crash_cls):
    """Seen on the GPU host (bench/gpu/ssh-moe.sh cuts the SSH sessions from outside, mid-level) and on the stand-in:
    the level's streams fail, or stop without an error (a 'hang'), before anything of ours used the link again,
    so the runner has not re-dialled yet. The level's end checks the link with one round trip: it was the link's."""
    from types import SimpleNamespace

    from tunectl.models import CrashInfo, LevelResult
    from tunectl.runners.server.ladder import _lost_to_link

    runner = make_ssh_runner()
    runner.run(["true"])
    epoch = runner.link_epoch
    crash = CrashInfo(cls=crash_cls, signature="no_token_progress", phase="load") if crash_cls else None
    lv = LevelResult(concurrency=64, status=status, crash=crash)
    assert not _lost_to_link(SimpleNamespace(runner=runner), lv, epoch)      # link fine: the level's own result
    sshd_kill(sshd)
    assert _lost_to_link(SimpleNamespace(runner=runner), lv, epoch)
    assert runner.link_epoch == epoch + 1
    ok = LevelResult(concurrency=64, status="ok")
    assert not _lost_to_link(SimpleNamespace(runner=runner), ok, epoch)       # nothing lost, nothing to blame


