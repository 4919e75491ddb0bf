"""`python -m tunectl.sim.smi`: the stand-in's nvidia-smi, for the GPU queries tunectl makes during a level.

    python -m tunectl.sim.smi --server http://127.0.0.1:30000 --query-gpu=index,power.draw,utilization.gpu \
        --format=csv,noheader,nounits [-i 0,1]

prints what `nvidia-smi` prints for the same query on a real host (one ", "-separated row per GPU; `[N/A]` where a
value is unknown, e.g. a card without `power:`), from the running stand-in's `/sim_gpus` (sim/power.py). So the
host-side sampler (runners/server/power.py) runs one code path, parser included, on both. A field nvidia-smi does
not know is its own error text and exit code 2; a server that does not answer is exit 15, nvidia-smi's "GPU is lost".
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.request

FIELDS = ("index", "name", "power.draw", "utilization.gpu")


def _cell(value: object, field: str) -> str:
    if value is None:
        return "[N/A]"
    if field == "power.draw":
        return f"{float(value):.2f}"
    if field == "utilization.gpu":
        return str(round(float(value)))
    return str(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tunectl.sim.smi")
    ap.add_argument("--server", required=True)
    ap.add_argument("--query-gpu", required=True)
    ap.add_argument("--format", default="csv,noheader,nounits")
    ap.add_argument("-i", "--id", default=None)
    ns = ap.parse_args(argv)
    fields = [f.strip() for f in ns.query_gpu.split(",")]
    for f in fields:
        if f not in FIELDS:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stdout)
            return 2
    try:
        with urllib.request.urlopen(ns.server.rstrip("/") + "/sim_gpus", timeout=5) as r:
            rows = json.loads(r.read())
    except (OSError, ValueError) as e:
        print(f"Unable to determine the device handle for GPU: GPU is lost ({e})", file=sys.stderr)
        return 15
    want = None if ns.id is None else {int(x) for x in ns.id.split(",") if x.strip().isdigit()}
    for row in rows:
        if want is None or row["index"] in want:
            print(", ".join(_cell(row.get(f), f) for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
