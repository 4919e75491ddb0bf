"""SLA capacity: `tunectl sweep --capacity` on the live stand-in against the true capacity of its model.

For each configuration, SLO and time scale, one live `sweep --capacity` (a bracketing search on one launch: double
the request rate until the SLO fails for more than 1% of requests, then bisect to 10%) and the model's own
capacity at that SLO: the same search on the virtual model (the same scheduler, arrivals and prompts) bisected ten
times finer. "within" says whether the truth lies within one bracketing step of the live bracket
(low / 1.1 <= truth <= high x 1.1); where the search stopped because this host's client could not send the next
rate on schedule, it says "client" and the live figure is a lower bound (checked: truth >= low / 1.1). The table
also gives the probes the live search ran (re-runs of probes sent late included), the requests it sent late and
the wall time of the launch.

    python bench/capacity.py [--runs 1] [--scales 0.025,0.1] [--configs baseline,tuned]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunectl.profile import default_profile_path, load_profile  # noqa: E402
from tunectl.wiring.virtual import VirtualEvaluator  # noqa: E402

TUNED = {"disable-cuda-graph": "true", "max-running-requests": "2048", "moe-runner-backend": "flashinfer_cutlass",
         "flashinfer-cutlass-autotune": "true", "disable-radix-cache": "true", "disable-chunked-prefix-cache": "true"}
CONFIGS = {"baseline": {}, "tuned": TUNED}
SLOS = {"p99 TTFT <= 2 s": {"p99_ttft_ms": 2000.0}, "p99 TTFT <= 500 ms": {"p99_ttft_ms": 500.0},
        "TTFT <= 2 s, TPOT <= 60 ms": {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 60.0}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profile_file(tmp: Path, scale: float) -> Path:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["port"] = free_port()
    data["server"]["sim"]["time_scale"] = scale
    data["host"] = {"kind": "local", "workdir": str(tmp / "host")}
    path = tmp / "sim-glm5.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def live(path: Path, tmp: Path, params: dict[str, str], slo: dict[str, float]) -> tuple[dict, list[dict], float]:
    cmd = [sys.executable, "-m", "tunectl", "sweep", "-p", str(path), "--capacity", "--json", "--study", "cap",
           "--results", str(tmp / "r"), *[f"--slo={k}={v:g}" for k, v in slo.items()],
           *[f"--set={k}={v}" for k, v in params.items()]]
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"exit {res.returncode}: {res.stderr.strip()[-500:]}")
    doc = json.loads(res.stdout)
    return doc["capacity"], doc["levels"], time.monotonic() - t0


def truth(path: Path, params: dict[str, str], slo: dict[str, float], tolerance: float) -> float | None:
    prof = load_profile(path, {"objective.mode": "goodput", "objective.slo": slo,
                               "objective.capacity.tolerance": tolerance, "objective.capacity.max_probes": 60})
    typed = {k: yaml.safe_load(v) for k, v in params.items()}
    return VirtualEvaluator(prof)(0, typed, "sweep").capacity["capacity"]


def verdict(cap: dict, true: float | None) -> str:
    step, low, high = 1 + cap["tolerance"], cap["low"], cap["high"]
    if true is None or low is None:
        return "NO"
    if cap["stopped"] == "client_bound":
        return "client" if true >= low / step else "NO"
    return "yes" if high is not None and low / step <= true <= high * step else "NO"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--scales", default="0.025,0.1")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    print(f"{'config':<9} {'SLO':<27} {'scale':>6} {'live capacity (bracket)':>26} {'probes':>6} {'late':>5} "
          f"{'true':>7} {'within':>6} {'wall s':>7}  load")
    for scale in (float(x) for x in args.scales.split(",")):
        for cname in args.configs.split(","):
            params = CONFIGS[cname]
            for sname, slo in SLOS.items():
                for _ in range(args.runs):
                    with tempfile.TemporaryDirectory() as d:
                        tmp = Path(d)
                        path = profile_file(tmp, scale)
                        cap, levels, wall = live(path, tmp, params, slo)
                        true = truth(path, params, slo, cap["tolerance"] / 10)
                    ok = verdict(cap, true)
                    late = sum(int(lv["metrics"].get("late_requests", 0)) for lv in levels)
                    bracket = f"{cap['capacity'] or 0:.3g} ({cap['low'] or 0:.3g}-{cap['high'] or 0:.3g})"
                    print(f"{cname:<9} {sname:<27} {scale:>6g} {bracket:>26} {len(levels):>6} {late:>5} "
                          f"{true or 0:>7.3g} {ok:>6} {wall:>7.1f}  {os.getloadavg()[0]:.1f}",
                          flush=True)


if __name__ == "__main__":
    main()
