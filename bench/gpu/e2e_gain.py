"""The end-to-end real search's gain (bench/gpu/e2e.sh): the winner and SGLang's default, each on its fresh launches
(`<study>-confirm-winner-<n>`, `<study>-confirm-default-<n>` under RESULTS), pooled per level into a 95% interval
(tunectl.stats.pooled: the launch-to-launch spread, t with n-1 degrees of freedom), and the winner's gain over the
default with its interval; a level whose intervals overlap is a tie. Also what the search itself claimed (`tunectl
best`'s number) beside what the fresh launches read.

    python bench/gpu/e2e_gain.py RESULTS [STUDY]      (default study: e2e-llama8b)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tunectl.launches import summarize
from tunectl.stats import compare, gain
from tunectl.store import StudyStore


def launches(root: Path, study: str, who: str) -> list:
    pat = re.compile(rf"^{re.escape(study)}-confirm-{who}-(\d+)$")
    names = sorted((p.name for p in root.iterdir() if pat.match(p.name)), key=lambda n: int(pat.match(n)[1]))
    return [t for n in names for t in StudyStore(n, root).trials()]


def main() -> int:
    root = Path(sys.argv[1])
    study = sys.argv[2] if len(sys.argv) > 2 else "e2e-llama8b"
    win, base = launches(root, study, "winner"), launches(root, study, "default")
    if not win or not base:
        print(f"{root}: no confirmation launches of {study} (winner {len(win)}, default {len(base)})")
        return 1
    print(f"winner: {len(win)} launches, {win[0].params}; default: {len(base)} launches")
    print(f"\n| level | winner (95% interval) | default (95% interval) | gain (95% interval) | verdict |")
    print("|---|---|---|---|---|")
    rows_w = {(r.workload, r.load): r for r in summarize(win)}
    for r in summarize(base):
        w = rows_w.get((r.workload, r.load))
        pw, pb = (w.pooled if w else None), r.pooled
        if pw is None or pb is None:
            print(f"| {r.load} | {'-' if pw is None else pw.text()} | {'-' if pb is None else pb.text()} | - | - |")
            continue
        g = gain(pw, pb)
        if len(w.ok) < 2 or len(r.ok) < 2:         # one launch has no launch-to-launch spread: no interval to judge by
            verdict = "no verdict: one launch (the launch-to-launch spread is unknown)"
        else:
            verdict = {"above": "winner ahead", "below": "default ahead", "tie": "tie"}[compare(pw, pb)]
        print(f"| {r.load} | {pw.text()} ({len(w.ok)}) | {pb.text()} ({len(r.ok)}) | {g.text('.3f')} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
