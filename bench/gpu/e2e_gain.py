"""The end-to-end real search's gain (bench/gpu/e2e.sh): the winner and SGLang's default, each on its fresh launches
(`<study>-confirm-winner-<n>`, `<study>-confirm-default-<n>` under RESULTS, n the launch's place in the run order),
judged machine by machine (each trial records its machine: launches on two machines are never pooled, since two
machines of one model can read 20% apart).

Per machine and level, as `tunectl confirm` judges (tunectl/confirm.py `judge`, with the study's profile,
profiles/real-llama8b-h100.yaml; the last row is its objective):
- each side's launches pooled into a 95% interval (tunectl.stats.pooled: the launch-to-launch spread, t with n-1
  degrees of freedom) and the conservative gain of the two (tunectl.stats.gain);
- the paired gain (tunectl.stats.paired_gain): each winner launch with the default launch run next to it (the
  order W D D W W D puts every launch beside one of the other side), the geometric mean of the pairs' ratios and
  the t interval of their logs. A step of the machine between pairs (lease 3's H200 read 12% more at 256 streams
  from its fifth launch on, both sides alike) widens the pooled intervals but cancels within a pair, so the
  verdict is the paired one: "winner ahead" or "default ahead" when its interval excludes 1, else a tie; no
  verdict on one pair.
The same for output tokens per joule where the levels measured the board's power. From 3 pairs, the noise the pairs
tell apart (tunectl.stats.pair_noise): what a fresh launch adds (the pairs' ratios) and the machine's drift over the
run (the pairs' means), the sds a card's `noise.launch` and `noise.machine` play (sim/noise.py). What the search
itself claimed is not printed here: `tunectl best` says it.

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
from tunectl.models import TrialResult
from tunectl.profile import load_profile
from tunectl.stats import Interval, compare, paired_gain
from tunectl.store import StudyStore

PROFILE = load_profile(ROOT / "profiles" / "real-llama8b-h100.yaml")


def launches(root: Path, study: str) -> list[tuple[int, str, TrialResult]]:
    """(place in the run order, "winner" | "default", the launch's trial), in run order; each trial's role set to
    its side, as `tunectl confirm` records it."""
    pat = re.compile(rf"^{re.escape(study)}-confirm-(winner|default)-(\d+)$")
    out = []
    for p in root.iterdir():
        if m := pat.match(p.name):
            for t in StudyStore(p.name, root).trials():
                t.role = cf.ROLE["winner" if m[1] == "winner" else "baseline"]
                out.append((int(m[2]), m[1], t))
    return sorted(out, key=lambda x: x[0])


def pairs(runs: list[tuple[int, str, TrialResult]]) -> list[tuple[TrialResult, TrialResult]]:
    """(winner, default) launches run next to each other on one machine: `tunectl confirm`'s pairing."""
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
    """`tunectl confirm`'s rows (tunectl/confirm.py `judge`: each side pooled, the pooled and the paired gain, the
    verdict), with tokens per joule paired beside them."""
    both = pairs(runs)
    lines = ["| level | winner (95% interval) | default (95% interval) | pooled gain | paired gain (pairs) | "
             "verdict | tok/J paired gain | tok/J verdict | a fresh launch | the machine's drift |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cf.judge([t for _, _, t in runs], PROFILE):
        pooled_gain = "-" if r.pooled_gain is None else \
            r.pooled_gain.text(".3f") + (" tie" if compare(r.winner, r.baseline) == "tie" else "")
        xs = [(level_value(b, r.label, "joules_per_output_token"), level_value(a, r.label, "joules_per_output_token"))
              for a, b in both]                                  # tokens per joule: the inverse ratio of J/token
        pj = paired_gain([x for x in xs if x[0] and x[1]]) if any(x[0] and x[1] for x in xs) else None
        side = {"winner": r.winner, "baseline": r.baseline}
        cells = [f"{'-' if v is None else v.text(',.0f' if v.value >= 100 else ',.3f')} ({v.n if v else 0})"
                 for v in side.values()]
        paired = "-" if r.paired is None else f"{r.paired.text('.3f')} ({r.paired.n})"
        lines.append(f"| {r.label} | {cells[0]} | {cells[1]} | {pooled_gain} | {paired} | {verdict(r.paired)} | "
                     f"{'-' if pj is None else pj.text('.3f')} | {verdict(pj)} | "
                     + ("- | - |" if r.noise is None else f"{r.noise['launch']:.1%} | {r.noise['machine']:.1%} |"))
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
