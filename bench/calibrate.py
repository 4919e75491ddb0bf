"""Calibration of the GLM-5 sim card against the seed write-ups, printed side by side.

    python bench/calibrate.py            # virtual model (exact, ms per ladder) + the live stand-in
    python bench/calibrate.py --no-live  # virtual model only

The virtual column must be within +-5% of the seeds (exit 1 otherwise). The live column runs the real stand-in
(subprocess, the built-in client over HTTP, the sim-glm5 profile's time scale) and also times one full trial
(startup + ladder 1..512) of the embedded default profile.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunectl.profile import WorkloadSpec, load_profile  # noqa: E402
from tunectl.sim.model import load_card, virtual_ladder  # noqa: E402

AUTOTUNE = "0001-flashinfer-cutlass-autotune"
PROFILE = load_profile(ROOT / "profiles" / "sim-glm5.yaml")
BASE = {k: v for k, v in PROFILE.server.flags.items()}
SEEDS_CFG = {**BASE, "disable-cuda-graph": True, "max-running-requests": 2048, "disable-radix-cache": True}
BEST_CFG = {**BASE, "cuda-graph-max-bs": 512, "max-running-requests": 1024, "disable-radix-cache": True,
            "disable-chunked-prefix-cache": True, "mem-fraction-static": 0.85}
CARD = load_card(PROFILE.server.sim.card)


def virtual() -> dict[str, float | str]:
    base = virtual_ladder(CARD, BASE, seed=0)
    runs = [virtual_ladder(CARD, SEEDS_CFG, patches=[AUTOTUNE], seed=s) for s in range(200)]
    ok256 = [r.at(256) for r in runs if r.at(256)]
    best = [virtual_ladder(CARD, BEST_CFG, patches=[AUTOTUNE], seed=s) for s in range(5)]
    return {"baseline@64": base.at(64) or 0.0, "seeds@256": sum(ok256) / len(ok256),
            "crash@256": sum(r.crash_level == 256 for r in runs) / len(runs),
            "crash@512|ok256": sum(r.crash_level == 512 for r in runs)
                               / max(1, sum(r.crash_level != 256 for r in runs)),
            "best@512": min(b.at(512) or 0.0 for b in best), "sig": runs[0].signature or ""}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def live_ladder(config: dict, patches: list[str], levels: list[int], scale: float) -> tuple[dict[int, float], float]:
    from tunectl.runners.clients.builtin import run_level

    port = _free_port()
    argv = [sys.executable, "-m", "tunectl.sim.launch_server", "--model-path", PROFILE.model.path,
            "--port", str(port), "--sim-time-scale", str(scale)]
    for k, v in config.items():
        argv += [f"--{k}"] if v is True else ([] if v is False else [f"--{k}", str(v)])
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "TUNECTL_SIM_PATCHES": ",".join(patches)})
    try:
        while proc.poll() is None:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.02)
        wl = WorkloadSpec(input_len=256, output_len=128, range_ratio=1.0)
        out: dict[int, float] = {}
        for c in levels:
            m = run_level(f"http://127.0.0.1:{port}", c, wl, max(8, c), time_scale=scale)
            out[c] = m.metrics.get("output_throughput", 0.0) if not m.failed else 0.0
            if m.failed:
                break
        return out, time.monotonic() - t0
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-live", action="store_true")
    ap.add_argument("--live-scale", type=float, default=0.05, help="time scale for the live calibration points")
    a = ap.parse_args()
    t = time.perf_counter()
    v = virtual()
    per_ladder_ms = (time.perf_counter() - t) / 206 * 1000
    live: dict[str, float] = {}
    if not a.no_live:
        live["baseline@64"] = live_ladder(BASE, [], [64], a.live_scale)[0].get(64, 0.0)
        live["seeds@256"] = live_ladder({**SEEDS_CFG, "disable-chunked-prefix-cache": True}, [AUTOTUNE], [256],
                                        a.live_scale)[0].get(256, 0.0)
        live["best@512"] = live_ladder(BEST_CFG, [AUTOTUNE], [512], a.live_scale)[0].get(512, 0.0)
    rows = [("baseline @ c=64 (tok/s)", "baseline@64", 880.0), ("seeds' config @ c=256 (tok/s)", "seeds@256", 1950.0),
            ("seeds' config: crash share at 256", "crash@256", 0.5),
            ("seeds' config: crash at 512 if 256 ok", "crash@512|ok256", 1.0),
            ("best stable @ c=512 (tok/s)", "best@512", None)]
    print(f"{'':40} {'seeds':>8} {'virtual':>9} {'dev':>7} {'live':>9}")
    bad = 0
    for label, key, seed in rows:
        val = float(v[key])
        dev = "" if seed is None else f"{(val - seed) / seed * 100:+.1f}%"
        check = seed is not None and key in ("baseline@64", "seeds@256") and abs(val - seed) > 0.05 * seed
        bad += check
        lv = f"{live[key]:9.0f}" if key in live else f"{'':9}"
        print(f"{label:40} {'' if seed is None else seed:>8} {val:9.2f} {dev:>7} {lv}{'  <-- off' if check else ''}")
    print(f"crash signature: {v['sig']}; best stable > 1950 x 1.15: {float(v['best@512']) > 1950 * 1.15}")
    print(f"virtual ladder: {per_ladder_ms:.1f} ms per 10-level ladder")
    if not a.no_live:
        levels = PROFILE.bench.levels
        scale = PROFILE.server.sim.time_scale
        for name, cfg, p in (("baseline", BASE, []), ("best", BEST_CFG, [AUTOTUNE])):
            tp, wall = live_ladder(cfg, p, levels, scale)
            print(f"trial wall time, sim-glm5 {name} (scale {scale}, startup + ladder {levels[0]}..{levels[-1]}): "
                  f"{wall:.1f} s; peak {max(tp.values()):.0f} tok/s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
