"""The power sampler on the live stand-in against the virtual model of the same config, per level.

    python bench/energy_check.py [--profile profiles/sim-llama8b-h200.yaml] [--levels 1,16,64,256,512] [--price 3]

Runs `tunectl sweep --json` (the live stand-in: the host-side sampler runs `python -m tunectl.sim.smi` through the
local runner during each level) and the virtual model of the profile's base config (noise-free, exact energy), and
prints W/GPU, J/tok and $/Mtok side by side (docs/energy.md).
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunectl import knobs  # noqa: E402
from tunectl.profile import load_profile  # noqa: E402
from tunectl.sim.model import virtual_ladder  # noqa: E402


def live(profile: Path, levels: list[int], price: float, tmp: Path) -> list[dict]:
    data = yaml.safe_load(profile.read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        data["server"]["port"] = s.getsockname()[1]
    data["host"], data["cost"] = {"workdir": str(tmp / "host")}, {"gpu_hour_usd": price}
    p = tmp / "p.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    out = subprocess.run([sys.executable, "-c", "from tunectl.cli import app; app()", "sweep", "-p", str(p), "-c",
                          ",".join(map(str, levels)), "--results", str(tmp / "res"), "--json"],
                         capture_output=True, text=True, timeout=900, check=True)
    return [lv["metrics"] for lv in json.loads(out.stdout)["levels"]]


def virtual(profile: Path, levels: list[int]) -> list[tuple[float, float]]:
    prof = load_profile(profile)
    flags, env, patches = knobs.merge(prof, {})
    w = prof.bench.workloads[0]
    lad = virtual_ladder(prof.server.sim.card, flags, env, patches, levels=levels, noise=0,
                         input_len=w.input_len, output_len=w.output_len, prompts_per_level=4)
    return [(lv.gpu_power_w or 0.0, lv.output_throughput or 0.0) for lv in lad.levels]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default=str(ROOT / "profiles" / "sim-llama8b-h200.yaml"))
    ap.add_argument("--levels", default="1,16,64,256,512")
    ap.add_argument("--price", type=float, default=3.0)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        got = live(Path(a.profile), levels, a.price, Path(tmp))
    model = virtual(Path(a.profile), levels)
    print("| c | live W/GPU | virtual W/GPU | live J/tok | virtual J/tok | live $/Mtok |")
    print("|---|---|---|---|---|---|")
    for c, m, (w, tput) in zip(levels, got, model):
        gpus = m.get("power_gpus", 1.0)
        print(f"| {c} | {m.get('gpu_power_w', 0):.0f} | {w:.0f} | {m.get('joules_per_output_token', 0):.3f} | "
              f"{w * gpus / tput:.3f} | {m.get('usd_per_million_output_tokens', 0):.2f} |")


if __name__ == "__main__":
    main()
