"""Trace replay timing: the shipped sample traces replayed on the live stand-in at several speed-ups, as a user runs
them (`tunectl sweep -p profiles/sim-glm5-trace.yaml`), with what the client recorded about its own sends.

Per replay: requests, the trace's span at that speed (wall seconds: modeled x the stand-in's time scale), the
requests sent within 1% of their offset or 5 ms of their due time (wall), those late, the max and p99 lateness in
wall ms, and the level's throughput and TTFT (modeled, like every figure tunectl shows for the stand-in). The
server runs without the chunked prefix cache: the Mooncake sample's long shared prompts reach the baseline's
modeled page_table_1_flattened crash, a finding of its own, not what this measures.

    python bench/trace_replay.py [--speedups 1,4,16,64] [--scale 0.025]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("mooncake-sample.jsonl", "azure-sample.csv")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replay(tmp: Path, trace: str, speedups: list[float], scale: float) -> list[dict]:
    data = yaml.safe_load((ROOT / "profiles" / "sim-glm5-trace.yaml").read_text())
    data["server"]["port"] = free_port()
    data["server"]["sim"]["time_scale"] = scale
    data["host"] = {"kind": "local", "workdir": str(tmp / "host")}
    base = data["bench"]["workloads"][0]
    data["bench"]["workloads"] = [{**base, "path": str(ROOT / "profiles" / "traces" / trace), "speedup": s,
                                   "name": f"trace-x{s:g}"} for s in speedups]
    path = tmp / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "tunectl", "sweep", "-p", str(path), "--json", "--study", "tr",
                          "--results", str(tmp / "r"), "--set", "disable-chunked-prefix-cache=true"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"exit {res.returncode}: {res.stderr.strip()[-500:]}")
    return json.loads(res.stdout)["levels"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speedups", default="1,4,16,64")
    ap.add_argument("--scale", type=float, default=0.025)
    args = ap.parse_args()
    speedups = [float(x) for x in args.speedups.split(",")]
    print(f"{'trace':<22} {'speedup':>7} {'requests':>8} {'span s':>7} {'on time':>7} {'late':>5} "
          f"{'max late ms':>11} {'p99 late ms':>11} {'tok/s':>7} {'TTFT p99':>9}")
    for trace in TRACES:
        with tempfile.TemporaryDirectory() as d:
            levels = replay(Path(d), trace, speedups, args.scale)
        for lv in levels:
            m, n = lv["metrics"], lv["completed"] + lv["failed_requests"]
            late = int(m.get("late_requests", 0))
            span = (n - 1) / m["request_rate"] * args.scale if m.get("request_rate") else 0.0
            print(f"{trace:<22} {lv['speedup']:>7g} {n:>8} {span:>7.2f} {n - late:>7} {late:>5} "
                  f"{m['max_lateness_ms'] * args.scale:>11.2f} {m['p99_lateness_ms'] * args.scale:>11.2f} "
                  f"{m['output_throughput']:>7.0f} {m['p99_ttft_ms']:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
