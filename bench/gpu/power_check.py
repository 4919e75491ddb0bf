"""tunectl's GPU power per level against nvidia-smi sampled beside it (docs/energy.md, "Checked on the real GPU").

    python bench/gpu/power_check.py docs/real-gpu/results/spec-h100          # print the table
    python bench/gpu/power_check.py OUT/spec --save-ends                      # on the run's own copy: keep the
                                                                              # level end times (git keeps no mtimes)

FOLDER holds `smi.csv` (`nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu
--format=csv,noheader,nounits -lms 500`, run beside the sweeps by bench/gpu/spec.sh) and tunectl's results
(`spec-*/trials/0/levels/*.json`). A level ends when its file is written (its mtime, or `level-ends.json`) and lasted
its `duration_s`. nvidia-smi's reading of a level: its samples in that window, read by tunectl's own rule
(runners/server/power.py: samples with the GPU idle left out, then the first and last tenth).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # run as a script from anywhere in the checkout
from tunectl.runners.server.power import summarize  # noqa: E402

ENDS = "level-ends.json"


def smi_samples(path: Path) -> list[tuple[float, float, float]]:
    """(epoch s, watts, utilization %) per line; nvidia-smi's timestamp is the host's clock (UTC there)."""
    out = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.split(",")]
        try:
            t = dt.datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
            out.append((t.timestamp(), float(cells[2]), float(cells[3])))
        except (ValueError, IndexError):
            continue
    return out


def level_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/trials/0/levels/*.json"))


def ends(folder: Path) -> dict[str, float]:
    saved = folder / ENDS
    if saved.exists():
        return json.loads(saved.read_text())
    return {str(f.relative_to(folder)): f.stat().st_mtime for f in level_files(folder)}


def smi_mean(samples: list[tuple[float, float, float]], start: float, end: float) -> tuple[float | None, int]:
    """nvidia-smi's watts over [start, end] by tunectl's own rule (runners/server/power.py `summarize`), and the
    samples that rule kept."""
    got = summarize([{0: (w, u)} for t, w, u in samples if start <= t <= end])
    return got.get("watts"), got.get("samples", 0)


def check(folder: Path) -> list[dict[str, Any]]:
    samples = smi_samples(folder / "smi.csv")
    rows = []
    for name, end in ends(folder).items():
        lv = json.loads((folder / name).read_text())
        power = (lv.get("witness") or {}).get("power") or {}
        smi, n = smi_mean(samples, end - lv["duration_s"], end)
        ours = power.get("watts")
        rows.append({"level": name, "study": name.split("/")[0], "concurrency": lv["concurrency"],
                     "tunectl_w": ours, "tunectl_samples": power.get("samples"), "reader": power.get("source"),
                     "smi_w": None if smi is None else round(smi, 1), "smi_samples": n,
                     "diff": None if smi is None or ours is None else round(ours / smi - 1, 4)})
    return sorted(rows, key=lambda r: (r["study"], r["concurrency"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--save-ends", action="store_true", help=f"write {ENDS} from the level files' mtimes")
    a = ap.parse_args(argv)
    if a.save_ends:
        (a.folder / ENDS).write_text(json.dumps(ends(a.folder), indent=1, sort_keys=True) + "\n")
    rows = check(a.folder)
    print(f"{'study':14} {'c':>4} {'tunectl W':>10} {'(n, reader)':>13} {'nvidia-smi W':>13} {'(n)':>5} {'diff':>7}")
    for r in rows:
        diff = "-" if r["diff"] is None else f"{r['diff']:+.1%}"
        print(f"{r['study']:14} {r['concurrency']:>4} {r['tunectl_w'] or 0:>10.1f} "
              f"{'(' + str(r['tunectl_samples']) + ', ' + str(r['reader']) + ')':>13} {r['smi_w'] or 0:>13.1f} "
              f"{'(' + str(r['smi_samples']) + ')':>5} {diff:>7}")
    diffs = sorted(abs(r["diff"]) for r in rows if r["diff"] is not None)
    if diffs:
        print(f"\n{len(diffs)} levels: |diff| median {diffs[len(diffs) // 2]:.1%}, max {diffs[-1]:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
