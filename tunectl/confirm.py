"""The winner against a baseline on fresh launches of one machine, interleaved and judged in pairs
(`tunectl confirm`).

Why pairs: on a real H200 the same two configs read 12% more at 256 streams from the fifth launch of a lease on,
both alike (docs/real-gpu.md, "The third lease"). Pooled side by side, such a step widens both intervals until
everything is a tie; within a pair of launches run back to back it cancels.

- `order(n)`: the launch order for n launches of each side, in blocks of two that alternate which side goes first
  (W B B W W B ...): every launch runs next to one of the other side, and a drift over the run hits both alike.
- `pairs(runs)`: (winner, baseline) launches run next to each other on one machine (a launch whose neighbour ran
  on other GPUs is not paired), each launch in one pair at most.
- `judge(runs, prof)`: per level and for the objective, each side's launches pooled (95% interval), the
  conservative pooled gain and the paired gain (`tunectl.stats.paired_gain`) with its verdict: "winner ahead" or
  "baseline ahead" only when the paired interval excludes 1, "tie" otherwise, "no verdict" on fewer than 2 pairs;
  and, from 3 pairs, the noise the pairs tell apart (`tunectl.stats.pair_noise`): what a fresh launch adds and the
  machine's drift over the run.
- `resolution(rows)`: on a tie, what the pairs can tell apart: the interval's half-width, and the pairs it would
  take (at the spread these pairs showed) for an interval narrow enough to tell the gain measured from none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tunectl.launches import reading, summarize
from tunectl.models import TrialResult
from tunectl.objective import score
from tunectl.profile import Profile
from tunectl.stats import Interval, gain, pair_noise, paired_gain, pooled, t95

SIDES = ("winner", "baseline")
ROLE = {"winner": "confirm-winner", "baseline": "confirm-baseline"}
SIDE = {v: k for k, v in ROLE.items()}


def order(n: int) -> list[str]:
    """n launches of each side: W B, B W, W B, ..."""
    return [s for i in range(n) for s in (SIDES if i % 2 == 0 else SIDES[::-1])]


def side(t: TrialResult) -> str | None:
    return SIDE.get(t.role)


def pairs(runs: list[TrialResult]) -> list[tuple[TrialResult, TrialResult]]:
    """(winner, baseline) launches next to each other in run order, on one machine; each launch in one pair."""
    runs = [t for t in runs if side(t)]
    out, i = [], 0
    while i + 1 < len(runs):
        a, b = runs[i], runs[i + 1]
        if side(a) != side(b) and a.machine == b.machine:
            out.append((a, b) if side(a) == "winner" else (b, a))
            i += 2
        else:
            i += 1
    return out


def verdict(p: Interval | None) -> str:
    if p is None:
        return "-"
    if p.n < 2:
        return "no verdict: one pair"
    if p.low > 1:
        return "winner ahead"
    if p.high < 1:
        return "baseline ahead"
    return "tie"


@dataclass
class Row:
    """One level (or the objective): each side's pooled launches, the pooled and the paired gain."""

    label: str
    winner: Interval | None
    baseline: Interval | None
    pooled_gain: Interval | None
    paired: Interval | None
    verdict: str
    missing: dict[str, int]            # launches per side with no reading here (crashed, failed requests, not run)
    noise: dict[str, float] | None = None   # what the pairs tell apart (3+ pairs): a fresh launch, the machine's drift

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.to_dict() if isinstance(v, Interval) else v) for k, v in self.__dict__.items()}


def _row(label: str, w: list[float | None], b: list[float | None], pair_values: list[tuple[float, float]],
         w_iv: list[Interval], b_iv: list[Interval]) -> Row:
    pw, pb = (pooled(w_iv) if w_iv else None), (pooled(b_iv) if b_iv else None)
    pg = gain(pw, pb) if pw and pb and len(w_iv) > 1 and len(b_iv) > 1 else None
    pp = paired_gain(pair_values) if pair_values else None
    sds = pair_noise(pair_values)
    return Row(label, pw, pb, pg, pp, verdict(pp),
               {"winner": sum(v is None for v in w), "baseline": sum(v is None for v in b)},
               None if sds is None else {"launch": sds[0], "machine": sds[1]})


def judge(runs: list[TrialResult], prof: Profile) -> list[Row]:
    """Per level (a launch's steady reading where it has one, else its whole-run throughput), then the objective
    (each launch's `objective.score`: the same number the search ranks by)."""
    wins = [t for t in runs if side(t) == "winner"]
    bases = [t for t in runs if side(t) == "baseline"]
    both = pairs(runs)
    rows: list[Row] = []
    by_side = [{(r.workload, r.load): r for r in summarize(ts)} for ts in (wins, bases)]
    for key in dict.fromkeys([*by_side[1], *by_side[0]]):     # every level either side measured, none hidden
        wr, br = (d.get(key) for d in by_side)

        def at(t: TrialResult) -> float | None:
            lv = next((lv for lv in t.levels if (lv.workload, lv.load) == key), None)
            got = reading(lv) if lv is not None else None
            return got.value if got is not None and got.value > 0 else None

        pv = [(a, b) for a, b in ((at(x), at(y)) for x, y in both) if a and b]
        label = key[1] if len(prof.bench.workloads) < 2 else f"{key[0]} {key[1]}"
        rows.append(_row(label, wr.readings if wr else [None] * len(wins), br.readings if br else [None] * len(bases),
                         pv, wr.ok if wr else [], br.ok if br else []))

    def obj(t: TrialResult) -> float | None:
        # a launch that crashed under load keeps what its stable levels measured (as the search scores it); the
        # crash itself is the conclusion's to say
        if t.status not in ("ok", "crashed") or not t.levels:
            return None
        v = score(t, prof).value
        return v if v > 0 else None

    w_obj, b_obj = [obj(t) for t in wins], [obj(t) for t in bases]
    pv = [(a, b) for a, b in ((obj(x), obj(y)) for x, y in both) if a and b]
    rows.append(_row("objective", w_obj, b_obj, pv, [Interval.of(v, None) for v in w_obj if v],
                     [Interval.of(v, None) for v in b_obj if v]))
    return rows


def noise_line(rows: list[Row] | list[dict[str, Any]]) -> str | None:
    """The objective's spread as the pairs tell it apart: what a fresh launch adds, and the machine's drift over
    the run (which the pairs cancel and pooled intervals do not); `rows` as judged or as confirm.json keeps them."""
    last = rows[-1] if rows else None
    row = last.to_dict() if isinstance(last, Row) else last
    n = (row or {}).get("noise")
    if not n:
        return None
    pairs = ((row or {}).get("paired") or {}).get("n", 0)
    return (f"noise (objective, {pairs} pairs): a fresh launch {n['launch']:.1%}, the machine's drift over the run "
            f"{n['machine']:.1%} (cancelled within a pair)")


def crashes(runs: list[TrialResult]) -> dict[str, tuple[int, int]]:
    """Per side: (launches that crashed, launches)."""
    return {sd: (sum(1 for t in runs if side(t) == sd and t.status == "crashed"),
                 sum(1 for t in runs if side(t) == sd)) for sd in SIDES}


def conclusion(rows: list[Row], against: str, crashed: dict[str, tuple[int, int]] | None = None) -> str:
    """One sentence on the objective's row, and on the launches that crashed."""
    r = rows[-1]
    crash = ""
    if crashed and any(k for k, _ in crashed.values()):
        (wk, wn), (bk, bn) = crashed["winner"], crashed["baseline"]
        crash = f"; the winner crashed in {wk} of {wn} launches ({against}: {bk} of {bn})"
    if r.paired is None:
        return f"no verdict: no pair of launches of the winner and {against} both measured the objective{crash}"
    p = r.paired
    said = {"winner ahead": f"the winner is ahead of {against}", "baseline ahead": f"{against} is ahead of the winner",
            "tie": f"the winner ties {against}", "no verdict: one pair": "no verdict yet (one pair: the "
            "launch-to-launch spread is unknown)"}[r.verdict]
    return f"{said}: {p.value:.3f}x ({p.low:.3f}-{p.high:.3f}, {p.n} pair{'s' if p.n != 1 else ''} of launches){crash}"


MAX_PAIRS = 50      # past this many pairs of launches a difference is below what a serving team acts on: "a tie"


def resolution(rows: list[Row] | list[dict[str, Any]], again: str | None = None) -> str | None:
    """On a tie of the objective with 2+ pairs: how wide the tie is, and how many pairs (at the spread of the log
    ratios these pairs showed) would make the interval exclude 1 if the gain is what they measured: the cost of
    telling the difference, for the user to weigh. None for a verdict, one pair, or pairs that agree exactly.
    `again`: the command that adds launches to these (`tunectl confirm --study NAME`), named in the line."""
    r = rows[-1] if rows else None
    if r is None:
        return None
    p = r.paired if isinstance(r, Row) else (Interval(**r["paired"]) if r.get("paired") else None)
    if p is None or p.n < 2 or verdict(p) != "tie" or p.low <= 0:
        return None
    half = math.log(p.high / p.low) / 2                              # = t95(n-1) * sd / sqrt(n), log scale
    sd = half * math.sqrt(p.n) / t95(p.n - 1)
    if sd <= 0:
        return None
    width = f"a tie within {math.exp(half) - 1:.1%} either way ({p.n} pairs)"
    effect = abs(math.log(p.value))
    need = next((m for m in range(p.n + 1, MAX_PAIRS + 1) if t95(m - 1) * sd / math.sqrt(m) < effect), None)
    if need is None:
        return (f"{width}: the {abs(p.value - 1):.1%} the pairs measured would take more than {MAX_PAIRS} pairs "
                "of launches to tell from none; the two serve alike here")
    how = f"`{again} --launches {need}`" if again else f"the same command with --launches {need}"
    return (f"{width}: telling the {abs(p.value - 1):.1%} the pairs measured from none would take about {need} "
            f"pairs at this spread ({how} adds them to these)")


def recorded(root: Any, study: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The latest `tunectl confirm` of `params` as study's winner (its confirm.json), if one ran."""
    from tunectl.store import StudyStore, list_studies, read_json

    found = None
    for name in list_studies(root):
        store = StudyStore(name, root)
        info = store.read_study()
        if info.get("kind") != "confirm" or info.get("of") != study or info.get("winner") != params:
            continue
        try:
            doc = read_json(store.dir / "confirm.json")
        except (OSError, ValueError):
            continue
        if found is None or doc.get("finished_at", 0) >= found.get("finished_at", 0):
            found = doc
    return found
