"""`tunectl sweep --capacity` on the embedded default (the stand-in): the capacity found on one launch is within
one bracketing step of the true capacity of the stand-in's model at that SLO, found on the virtual model (the
same scheduler, arrivals and prompts) by a bisection ten times finer.

When the host is too busy for the client to send a rate on schedule, the search says so and stops: its capacity
is then a lower bound, checked as one. The stand-in runs at time scale 0.1 here (the default's 0.025 turns a 50 ms stall
of a loaded test host into 2 s of modeled latency, the SLO itself); the model and the SLO are the default's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port
from tunectl.profile import default_profile_path, load_profile
from tunectl.wiring.virtual import VirtualEvaluator

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SLO_MS = 2000.0


def true_capacity(profile: Path, tolerance: float) -> float:
    prof = load_profile(profile, {"objective.mode": "goodput", "objective.slo": {"p99_ttft_ms": SLO_MS},
                                  "objective.capacity.tolerance": tolerance, "objective.capacity.max_probes": 60})
    res = VirtualEvaluator(prof)(0, {}, "sweep")
    assert res.status == "ok" and res.capacity and res.capacity["high"] is not None
    return float(res.capacity["capacity"])


def test_sweep_capacity_is_within_one_bracketing_step_of_the_model(tmp_path: Path) -> None:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["port"] = free_port()
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "host")}
    data["server"]["sim"]["time_scale"] = 0.1
    profile = tmp_path / "sim-glm5.yaml"
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "tunectl", "sweep", "-p", str(profile), "--capacity",
                          "--slo", f"p99_ttft_ms={SLO_MS:g}", "--study", "cap", "--results", str(tmp_path / "r")],
                         cwd=ROOT, env={**os.environ, "COLUMNS": "60"}, capture_output=True, text=True,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    trial = json.loads((tmp_path / "r" / "cap" / "trials" / "0" / "trial.json").read_text())
    cap = trial["capacity"]
    # a host too busy for the client to send the next rate on schedule ends the search there (a lower bound,
    # said so); otherwise the bracket is closed to the tolerance
    bound = cap["stopped"] == "client_bound"
    assert trial["status"] == "ok" and cap["by"] == "rate" and cap["stopped"] in ("", "client_bound")
    assert bound or cap["high"] / cap["low"] - 1 <= cap["tolerance"] + 1e-9
    # printed: the capacity with its SLO, then every rate tried; one level per probe (a late one may run again)
    out = " ".join(res.stdout.split())
    said = ("at least " if bound else "") + f"{cap['capacity']:.4g} req/s"
    assert f"capacity: {said} with p99_ttft_ms <= 2000 for >= 99% of requests" in out
    assert out.count(" pass (") + out.count(" fail (") == len(cap["runs"]) >= len(cap["probes"])   # reruns too
    assert ("stopped early: the client could not send" in out) == bound
    rates = {lv["request_rate"] for lv in trial["levels"]}
    assert rates >= {p[0] for p in cap["probes"]} and len(trial["levels"]) >= len(cap["probes"])
    step = 1 + cap["tolerance"]
    truth = true_capacity(profile, cap["tolerance"] / 10)
    assert cap["low"] / step <= truth and (bound or truth <= cap["high"] * step), (cap, truth)
    # what a user reads afterwards: the trials table, the winner's line and the report carry the capacity found
    from tunectl.reports.data import capacity_text

    shown = capacity_text(cap)
    assert shown.startswith(said)                         # the same words as the sweep printed

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "tunectl", *args, "--study", "cap", "--results",
                               str(tmp_path / "r")], cwd=ROOT, env={**os.environ, "COLUMNS": "250"},
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout
    assert shown in cli("trials")
    assert f"SLA capacity {shown}" in cli("best").splitlines()[0]
    cli("report")
    html = (tmp_path / "r" / "cap" / "report.html").read_text()
    assert f"SLA capacity: <b>{shown}" in html and "p99_ttft_ms &lt;= 2000" in html
