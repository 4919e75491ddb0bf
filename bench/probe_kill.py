"""kill -9 of a search at each moment of a trial on the SGLang stand-in, then the same command again: nothing lost,
no duplicate records, no leftover process, no secrets left on the host.

For each moment a fresh study runs `tunectl search` (a real search: stand-in servers, ladders, teardowns) in a
child process that SIGKILLs itself at that moment of trial N (default 1, the first search trial):

    after-launch    the server process group has just started
    mid-ladder      the first level's record is written
    after-record    the trial's final trial.json is written, before Optuna is told
    teardown        teardown has sent SIGTERM to the server group

then reruns the same command to the end and checks:
    lost            a final trial record from before the kill changed, or its trial is not told as recorded
    duplicates      one config with two served (ok/pruned) search records
    left running    processes of the study's runs still alive (found by TUNECTL_RUN_ID, never by name)
    env left        host trial directories still holding an `env` file (the profile's secrets in clear)
    open trials     RUNNING or WAITING trials left in the study
    readers         `tunectl trials` failed or named an unreadable record

Usage: python bench/probe_kill.py [--trials 3] [--at 1] [--moments after-launch,mid-ladder,after-record,teardown]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

MOMENTS = ("after-launch", "mid-ladder", "after-record", "teardown")
FINAL = ("ok", "crashed", "pruned", "infra")
STUDY = "probe"
SECRET = "probe-secret-in-env-7f3a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_profile(work: Path) -> Path:
    """The embedded default with a free port, a private host workdir, a secret in its environment and one
    finalist rerun (a short study)."""
    from tunectl.profile import default_profile_path

    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["port"] = free_port()
    data["server"].setdefault("env", {})["SGLANG_API_KEY"] = "${PROBE_API_KEY}"
    data.setdefault("host", {})["workdir"] = str(work / "host")
    data["search"]["finalists"] = {"top_k": 1, "reruns": 1}
    path = work / "probe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------------ the child
def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _trial_of(run_id: str) -> int:
    return int(run_id.rsplit("-t", 1)[1].split("-", 1)[0])


def install(moment: str, at: int) -> None:
    """Patch the trial engine so this process kill -9s itself at `moment` of trial `at`."""
    from tunectl.runners.server import lifecycle
    from tunectl.store import StudyStore

    launch, teardown = lifecycle.launch, lifecycle.teardown
    write_level, write_trial = StudyStore.write_level, StudyStore.write_trial

    def on_launch(runner: Any, prof: Any, plan: Any, config_yaml: str) -> Any:
        srv = launch(runner, prof, plan, config_yaml)
        if moment == "after-launch" and _trial_of(plan.run_id) == at:
            _die()
        return srv

    def on_teardown(server: Any) -> Any:
        if moment == "teardown" and _trial_of(server.plan.run_id) == at:
            signal_group = server.runner.signal_group

            def then_die(handle: Any, sig: int) -> None:
                signal_group(handle, sig)
                _die()
            server.runner.signal_group = then_die
        return teardown(server)

    def on_level(self: Any, n: int, lv: Any) -> None:
        write_level(self, n, lv)
        if moment == "mid-ladder" and n == at:
            _die()

    def on_trial(self: Any, t: Any) -> None:
        write_trial(self, t)
        if moment == "after-record" and t.trial == at and t.status in FINAL:
            _die()

    lifecycle.launch, lifecycle.teardown = on_launch, on_teardown
    StudyStore.write_level, StudyStore.write_trial = on_level, on_trial


def child(moment: str, at: int, args: list[str]) -> None:
    install(moment, at)
    from tunectl.cli import app

    app(args=args, prog_name="tunectl")


# ------------------------------------------------------------------------------------------------ the checks
def records(results: Path) -> dict[int, tuple[str, bool, str]]:
    """trial -> (status, retried by the search itself, sha1 of trial.json) for every readable trial.json."""
    out = {}
    for p in sorted((results / STUDY / "trials").glob("*/trial.json")):
        try:
            d = json.loads(p.read_text())
            out[int(p.parent.name)] = (d["status"], _retried(d), hashlib.sha1(p.read_bytes()).hexdigest())
        except (ValueError, KeyError):
            continue
    return out


def our_processes(work: Path) -> list[int]:
    """Live processes of this probe's runs: carrying a TUNECTL_RUN_ID of its host workdir's run directories
    (another probe's study of the same name runs elsewhere)."""
    host = work / "host"
    runs = {p.name.encode() for p in host.iterdir()} if host.is_dir() else set()
    seen = set(runs)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        rid = next((e.split(b"=", 1)[1] for e in env if e.startswith(b"TUNECTL_RUN_ID=")), None)
        if rid is not None and (rid in seen or cwd.startswith(str(host) + "/")):
            out.append(int(d.name))
    return out


def _retried(d: dict[str, Any]) -> bool:
    """A result the search itself runs again (an infra fault, a first flaky crash): its config has two records."""
    return d["status"] == "infra" or (d.get("crash") or {}).get("cls") == "flaky"


def duplicates(results: Path) -> int:
    """Configs with two final search records that are not retries."""
    seen: dict[str, int] = {}
    for p in (results / STUDY / "trials").glob("*/trial.json"):
        d = json.loads(p.read_text())
        if d.get("role") in ("search", "baseline") and d["status"] in FINAL and not _retried(d):
            key = json.dumps(d.get("params", {}), sort_keys=True)
            seen[key] = seen.get(key, 0) + 1
    return sum(n - 1 for n in seen.values() if n > 1)


def lost(results: Path, before: dict[int, tuple[str, bool, str]]) -> list[int]:
    """Final records from before the kill that changed, or whose Optuna trial is not told as recorded (FAIL or
    still RUNNING for a result the search keeps)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{results / STUDY / 'study.db'}")
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    after = records(results)
    out = []
    for n, (status, retried, digest) in before.items():
        if status not in FINAL:
            continue
        t = trials.get(n)
        if after.get(n, (None, None, None))[2] != digest or t is None or (
                not retried and t.state.name not in ("COMPLETE", "PRUNED")):
            out.append(n)
    return out


def open_trials(results: Path) -> int:
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{results / STUDY / 'study.db'}")
    return sum(t.state.name in ("RUNNING", "WAITING") for t in study.get_trials(deepcopy=False))


# ------------------------------------------------------------------------------------------------ one probe
def run_probe(moment: str, at: int, trials: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="probe-kill-") as tmp:
        work = Path(tmp)
        profile, results = make_profile(work), work / "results"
        args = ["search", "-p", str(profile), "--study", STUDY, "--trials", str(trials), "--results", str(results),
                "--json"]
        env = {**os.environ, "PROBE_API_KEY": SECRET}
        t0 = time.monotonic()
        killed = subprocess.run([sys.executable, __file__, "--child", moment, str(at), "--", *args], env=env,
                                capture_output=True, text=True, timeout=600, cwd=work)
        before, alive = records(results), len(our_processes(work))
        rerun = subprocess.run([sys.executable, "-m", "tunectl", *args], env=env, capture_output=True, text=True,
                               timeout=900, cwd=work)
        time.sleep(0.5)
        listing = subprocess.run([sys.executable, "-m", "tunectl", "trials", "--study", STUDY, "--results",
                                  str(results)], capture_output=True, text=True, timeout=120, cwd=work)
        row = {"moment": moment, "killed": killed.returncode == -signal.SIGKILL,
               "at kill": f"{len(before)} records, {alive} procs", "rerun rc": rerun.returncode,
               "lost": lost(results, before) if rerun.returncode == 0 else ["rerun failed"],
               "duplicates": duplicates(results), "left running": len(our_processes(work)),
               "env left": len(list((work / "host").rglob("env"))) if (work / "host").is_dir() else 0,
               "open trials": open_trials(results) if rerun.returncode == 0 else -1,
               "readers": "ok" if listing.returncode == 0 and "not a trial record" not in listing.stderr
               else "FAIL", "wall s": round(time.monotonic() - t0, 1)}
        if rerun.returncode != 0:
            row["error"] = (rerun.stderr.strip().splitlines() or ["?"])[-1][:200]
        for pid in our_processes(work):          # never leave a probe's server behind, whatever happened
            os.kill(pid, signal.SIGKILL)
        return row


def failures(row: dict[str, Any]) -> list[str]:
    bad = [] if row["killed"] else ["not killed at the moment"]
    bad += [] if row["rerun rc"] == 0 else [f"rerun exit {row['rerun rc']}: {row.get('error', '')}"]
    bad += [f"{k}: {row[k]}" for k in ("lost", "duplicates", "left running", "env left", "open trials") if row[k]]
    return bad + ([] if row["readers"] == "ok" else ["trials listing"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="search trials of each probe's study")
    ap.add_argument("--at", type=int, default=1, help="the trial killed (0 is the baseline)")
    ap.add_argument("--moments", default=",".join(MOMENTS))
    a = ap.parse_args()
    rows = [run_probe(m, a.at, a.trials) for m in a.moments.split(",")]
    cols = ["moment", "killed", "at kill", "rerun rc", "lost", "duplicates", "left running", "env left",
            "open trials", "readers", "wall s"]
    print("| " + " | ".join(cols) + " | failures |")
    print("|" + "---|" * (len(cols) + 1))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + f" | {'; '.join(failures(r)) or 0} |")
    bad = sum(bool(failures(r)) for r in rows)
    print(f"\n{len(rows)} probes, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[5:])
    else:
        main()
