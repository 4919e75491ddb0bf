"""What `sweep --capacity` and open-loop levels say about themselves: every run of a probe is recorded and printed
(a probe that failed late twice, then passed, shows three runs, not "2 pass (100%)"), and a level whose latencies
are within the host's timing floor on the stand-in's clock is flagged, as is a capacity whose SLO is."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

from tests.helpers.ports import free_port
from tunectl.commands._levels import capacity_lines, level_table
from tunectl.goodput import capacity_record, jitter_bound
from tunectl.models import LevelResult, TrialResult
from tunectl.profile import default_profile_path, load_profile
from tunectl.runners.server import capacity

ROOT = Path(__file__).resolve().parents[2]


def _level(rate: float, attained: float, late: bool) -> LevelResult:
    lv = LevelResult(concurrency=0, status="ok", request_rate=rate, completed=10, client_bound=late,
                     metrics={"slo_attainment": attained, "median_ttft_ms": 900.0, "timing_floor_ms": 1000.0})
    return lv


def test_every_run_of_a_probe_is_kept_and_printed(monkeypatch) -> None:
    """The client's lateness is scripted (a real host is late when it likes): at 2 req/s the first two runs fail
    late, the third passes; every other rate fails on time."""
    script = {2.0: [(0.4, True), (0.5, True), (1.0, False)]}
    seen: dict[float, int] = {}

    def run_level(server, w, c, ol):
        rate = ol.rate
        att, late = script.get(rate, [(0.3, False)])[seen.get(rate, 0)]
        seen[rate] = seen.get(rate, 0) + 1
        return _level(rate, att, late)

    monkeypatch.setattr(capacity, "run_level", run_level)
    monkeypatch.setattr(capacity, "open_load", lambda server, w, load: SimpleNamespace(rate=load))
    prof = load_profile(default_profile_path(), {"objective.slo": {"p99_ttft_ms": 1000.0},
                                                 "objective.capacity.start": 2.0,
                                                 "objective.capacity.max_probes": 3})
    ladder, br = capacity.run_capacity(SimpleNamespace(prof=prof), prof.bench.workloads[0])
    assert len(ladder.levels) == 5 and [p.load for p in br.probes] == [2.0, 4.0, 2.83]
    rec = capacity_record(br, "rate", 0.1, {"p99_ttft_ms": 1000.0}, 0.99)
    assert rec["runs"] == [[2.0, False, 0.4, "late"], [2.0, False, 0.5, "late"], [2.0, True, 1.0, ""],
                           [4.0, False, 0.3, ""], [2.83, False, 0.3, ""]]
    json.dumps(rec)                                          # trial.json keeps it as is
    result = TrialResult(trial=0, status="ok", levels=ladder.levels, capacity=rec)
    tried = next(ln for ln in capacity_lines(result) if ln.strip().startswith("tried:"))
    assert tried.count("2 fail (") == 2 and "sent late: run again" in tried and "2 pass (100.0%)" in tried
    assert any("unreliable here" in ln for ln in capacity_lines(result))       # floor 1000 ms vs a 1000 ms SLO


def test_a_level_within_the_timing_floor_is_flagged_and_one_above_is_not() -> None:
    noisy, clean = _level(1.0, 1.0, False), _level(1.0, 1.0, False)
    clean.metrics["timing_floor_ms"] = 50.0
    assert jitter_bound(noisy) and not jitter_bound(clean)
    cap = TrialResult(trial=0, status="ok", levels=[clean])
    assert level_table(cap).caption is None or "?" not in str(level_table(cap).caption)


def test_open_loop_on_the_default_profile_says_its_latencies_are_host_jitter(tmp_path: Path) -> None:
    """The embedded default runs the stand-in at time scale 0.005: 5 ms of wall time is 1 s on its clock."""
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["port"] = free_port()
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "host")}
    profile = tmp_path / "sim-glm5.yaml"
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "tunectl", "sweep", "-p", str(profile), "--request-rate", "0.5",
                          "--study", "r", "--results", str(tmp_path / "r")], cwd=ROOT,
                         env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=300,
                         check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lv = json.loads((tmp_path / "r" / "r" / "trials" / "0" / "trial.json").read_text())["levels"][0]
    assert lv["metrics"]["timing_floor_ms"] >= 5.0 / data["server"]["sim"]["time_scale"] - 1e-6
    assert "ok?" in res.stdout and "mostly host jitter" in res.stdout
