"""The end-to-end real search's gain (bench/gpu/e2e.sh): the winner and SGLang's default, each on its fresh launches
(`<study>-confirm-winner-<n>`, `<study>-confirm-default-<n>` under RESULTS, n the launch's place in the run order),
judged machine by machine (each trial records its machine: launches on two machines are never pooled, since two
machines of one model can read 20% apart).

Per machine and level:
- each side's launches pooled into a 95% interval (tunectl.stats.pooled: the launch-to-launch spread, t with n-1
  degrees of freedom) and the conservative gain of the two (tunectl.stats.gain);
- the paired gain (tunectl.stats.paired_gain): each winner launch with the default launch run next to it (the
  order W D D W W D puts every launch beside one of the other side), the geometric mean of the pairs' ratios and
  the t interval of their logs. A step of the machine between pairs (lease 3's H200 read 12% more at 256 streams
  from its fifth launch on, both sides alike) widens the pooled intervals but cancels within a pair, so the
  verdict is the paired one: "winner ahead" or "default ahead" when its interval excludes 1, else a tie; no
  verdict on one pair.
The same for output tokens per joule where the levels measured the board's power. Also what the search itself
claimed is not printed here: `tunectl best` says it.

    python bench/gpu/e2e_gain.py RESULTS [STUDY]      (default study: e2e-llama8b)
"""
from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tunectl import confirm as cf
from tunectl.launches import summarize
from tunectl.models import TrialResult
from tunectl.stats import Interval, compare, gain, paired_gain
from tunectl.store import StudyStore


def launches(root: Path, study: str) -> list[tuple[int, str, TrialResult]]:
    """(place in the run order, "winner" | "default", the launch's trial), in run order."""
    pat = re.compile(rf"^{re.escape(study)}-confirm-(winner|default)-(\d+)$")
    out = []
    for p in root.iterdir():
        if m := pat.match(p.name):
            out += [(int(m[2]), m[1], t) for t in StudyStore(p.name, root).trials()]
    return sorted(out, key=lambda x: x[0])


def pairs(runs: list[tuple[int, str, TrialResult]]) -> list[tuple[TrialResult, TrialResult]]:
    """(winner, default) launches run next to each other on one machine, each in one pair at most: `tunectl
    confirm`'s pairing (tunectl/confirm.py), these launches' sides read from their names."""
    for _, who, t in runs:
        t.role = cf.ROLE["winner" if who == "winner" else "baseline"]
    return cf.pairs([t for _, _, t in runs])


def level_value(t: TrialResult, load: str, metric: str) -> float | None:
    for lv in t.levels:
        if lv.load == load and lv.status == "ok":
            v = lv.metrics.get(metric)
            return float(v) if v else None
    return None


def verdict(p: Interval | None) -> str:
    """tunectl confirm's verdict (tunectl/confirm.py), the baseline here being SGLang's default."""
    return cf.verdict(p).replace("baseline", "default")


def table(runs: list[tuple[int, str, TrialResult]]) -> list[str]:
    win = [t for _, who, t in runs if who == "winner"]
    base = [t for _, who, t in runs if who == "default"]
    both = pairs(runs)
    lines = ["| level | winner (95% interval) | default (95% interval) | pooled gain | paired gain (pairs) | "
             "verdict | tok/J paired gain | tok/J verdict |", "|---|---|---|---|---|---|---|---|"]
    rows_w = {(r.workload, r.load): r for r in summarize(win)}
    for r in summarize(base):
        w = rows_w.get((r.workload, r.load))
        pw, pb = (w.pooled if w else None), r.pooled
        pooled_gain = gain(pw, pb).text(".3f") if pw and pb and len(w.ok) > 1 and len(r.ok) > 1 else "-"
        if pooled_gain != "-" and compare(pw, pb) == "tie":
            pooled_gain += " tie"

        def paired(metric: str, invert: bool = False) -> Interval | None:
            xs = [(level_value(a, r.load, metric), level_value(b, r.load, metric)) for a, b in both]
            xs = [(b, a) if invert else (a, b) for a, b in xs if a and b]
            return paired_gain(xs) if xs else None

        pt = paired("output_throughput")
        pj = paired("joules_per_output_token", invert=True)     # tokens per joule: the inverse ratio
        pt_text = "-" if pt is None else f"{pt.text('.3f')} ({pt.n})"
        lines.append(
            f"| {r.load} | {'-' if pw is None else pw.text()} ({len(w.ok) if w else 0}) | "
            f"{'-' if pb is None else pb.text()} ({len(r.ok)}) | {pooled_gain} | "
            f"{pt_text} | {verdict(pt)} | "
            f"{'-' if pj is None else pj.text('.3f')} | {verdict(pj)} |")
    return lines


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    root = Path(sys.argv[1])
    study = sys.argv[2] if len(sys.argv) > 2 else "e2e-llama8b"
    runs = launches(root, study) if root.is_dir() else []
    by_machine: dict[str, list[tuple[int, str, TrialResult]]] = defaultdict(list)
    for run in runs:
        by_machine[run[2].machine or "machine not recorded"].append(run)
    if not any({who for _, who, _ in rs} == {"winner", "default"} for rs in by_machine.values()):
        print(f"{root}: no machine ran both sides of {study}'s confirmation ({len(runs)} launches)")
        return 1
    for machine, rs in by_machine.items():
        win = [t for _, who, t in rs if who == "winner"]
        print(f"\n## {machine}: winner {len(win)} launches, default {len(rs) - len(win)}, "
              f"{len(pairs(rs))} pairs (run order {' '.join(who[0].upper() + str(n) for n, who, _ in rs)})")
        if win:
            print(f"winner: {win[0].params}")
        if {who for _, who, _ in rs} != {"winner", "default"}:
            print("one side only: no comparison on this machine")
            continue
        print()
        print("\n".join(table(rs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
