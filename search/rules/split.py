"""split: each half of the pair move that made the leader first, the halves in the order the local steps rank
them. The value model is additive, so it credits a two-knob gain to both new values; a passenger that costs a few
percent rides along in every step after unless one half is tried alone.

Evidence: docs/search.md, the round "A winning pair of backends is split".
"""
from __future__ import annotations

import random
from typing import Any, ClassVar

from optuna.trial import FrozenTrial
from tunectl.search import finalists as fin
from tunectl.search.rules.base import Context
from tunectl.search.sampler import complete
from tunectl.search.space import base_values, config_key
from tunectl.search.surrogate import ordered
from tunectl.search.trials import FLAT, outcome

from tunectl.profile import Profile


class Split:
    name: ClassVar[str] = "split"
    kind: ClassVar[str] = "walk"
    does: ClassVar[str] = "takes apart the pair move that made the leader first: each half alone"
    constants: ClassVar[tuple[str, ...]] = ("FLAT",)

    def propose(self, ctx: Context) -> list[dict[str, Any]]:
        walk = ctx.walk
        if walk is None:
            return []
        halves = splits(ctx.prof, walk.leader, ctx.done, ctx.steps.rng)
        return ctx.runnable(sorted(halves, key=lambda c: walk.rank.get(config_key(c), len(walk.rank))))


def splits(prof: Profile, incumbent: FrozenTrial, done: list[FrozenTrial], rng: random.Random) -> list[dict[str, Any]]:
    """The two halves of a pair move that made the incumbent: each of its two knobs taken back alone. Only for a
    local step that beat the config it stepped from (the best before it) by more than FLAT, moved two unordered
    knobs (choices, bools: backends) and set at least one value no served config had: the value model is additive,
    so it credits the gain to both new values, yet a backend's speed depends on the others (FlashInfer attention
    behind FA3 with one MoE runner, ahead with another), and a passenger that costs a few percent rides along in
    every step after. An ordered knob's share is left to the model (its position and square are fitted from every
    config along it)."""
    before = fin.candidates([t for t in done if t.number < incumbent.number])
    if not before or incumbent.user_attrs.get("proposed_by") != "local" \
            or incumbent.values[0] <= (1.0 + FLAT) * before[0].values[0]:
        return []
    parent, mine, base = dict(before[0].params), dict(incumbent.params), base_values(prof)
    # the knobs the step set: changed, or switched on at a value of its own (not those its moves switched off)
    diff = sorted(k for k in mine if (parent[k] if k in parent else base.get(k)) != mine[k])
    if len(diff) != 2 or any(ordered(prof.search.space[k]) for k in diff):
        return []
    served = {(k, config_key({k: t.params.get(k)})) for t in done if t.number < incumbent.number
              and outcome(t) == "ok" for k in diff}
    if all((k, config_key({k: mine[k]})) in served for k in diff):
        return []
    out = []
    for k in diff:
        cand = {n: v for n, v in mine.items() if n != k}
        if k in parent:
            cand[k] = parent[k]
        out.append(complete(prof.search, cand, rng, {**base, **parent}))
    return out


RULE = Split()
