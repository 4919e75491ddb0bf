"""How often `tunectl confirm` calls a true difference, and how often it calls one that is not there: its paired
verdict (tunectl.stats.paired_gain, the launches in the order tunectl.confirm.order gives) against the pooled one
(each side's launches pooled, tunectl.stats.compare), on launches drawn with a known truth.

Each launch reads truth x machine x exp(N(0, sd)): `sd` the launch-to-launch noise within a regime of the machine
(a real H200 read the same config within 1-3% at a stretch, docs/real-gpu.md "The third lease"), `machine` 1 until
a step, then `step` (that H200 stepped +12% at 256 streams after its fourth launch), the step placed after a launch
drawn uniformly (or never, with --step 1). A verdict is right when it names the side the truth favours (or "tie"
when the truth is a tie), wrong when it names the other side or a side when the truth is a tie.

    python bench/confirm_pairs.py [--reps 2000] [--step 1.12] [--seed 0]
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tunectl.confirm import order                                     # noqa: E402
from tunectl.stats import Interval, compare, paired_gain, pooled        # noqa: E402


def verdicts(gain: float, n: int, sd: float, step: float, rng: random.Random) -> tuple[str, str]:
    """(pooled, paired) verdicts for one confirmation of n launches each: "above", "below" or "tie"."""
    sides = order(n)
    at = rng.randrange(len(sides) + 1) if step != 1 else len(sides)      # the step comes after launch `at`
    reads = [(1.0 if s == "winner" else 1.0 / gain) * (step if i >= at else 1.0) * math.exp(rng.gauss(0.0, sd))
             for i, s in enumerate(sides)]
    w = [Interval.of(v, None) for v, s in zip(reads, sides) if s == "winner"]
    b = [Interval.of(v, None) for v, s in zip(reads, sides) if s == "baseline"]
    pooled_v = compare(pooled(w), pooled(b))
    pairs = [(reads[i], reads[i + 1]) if sides[i] == "winner" else (reads[i + 1], reads[i])
             for i in range(0, len(sides), 2)]
    p = paired_gain(pairs)
    paired_v = "above" if p.low > 1 else "below" if p.high < 1 else "tie"
    return pooled_v, paired_v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--step", type=float, default=1.12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print(f"{a.reps} confirmations per row; the machine steps x{a.step} after a uniformly drawn launch"
          if a.step != 1 else f"{a.reps} confirmations per row; no step")
    print("\n| launches each | noise sd | true gain | pooled: right / wrong | paired: right / wrong |")
    print("|---|---|---|---|---|")
    for n in (3, 5):
        for sd in (0.01, 0.03):
            for g in (1.0, 0.98, 1.05):
                truth = "tie" if g == 1 else "above" if g > 1 else "below"
                got = [verdicts(g, n, sd, a.step, rng) for _ in range(a.reps)]
                cells = []
                for k in (0, 1):
                    right = sum(v[k] == truth for v in got) / a.reps
                    wrong = sum(v[k] != truth and v[k] != "tie" for v in got) / a.reps
                    cells.append(f"{right:.0%} / {wrong:.1%}")
                print(f"| {n} | {sd:.0%} | {g:.2f} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
