"""The search's own rules as data: which proposers and vetoes run, in what order (a profile's `search.policy`).

Each rule is one module of search/rules/ (its `RULE`: name, kind, what it does, the constants it reads, and
`propose` or `check`: search/rules/base.py). Between the sampler's proposals, `Steps.next` (search/steps.py) asks
the proposers in the policy's order; the first that has a runnable config queues it (recorded on the trial as
`proposed_by` and what it answers). Repair proposers give evidence (config, fixes, bounds, why) that `Steps`
makes runnable; walk proposers give candidate configs that `Steps` steps to. Each candidate passes the vetoes the
policy lists (any one drops it) before it is queued, and the sampler's own proposals pass them too. A rule left
out of the policy never runs; adding one is its module plus its name in the default order (tunectl/profile.py).
docs/search.md ("The policy") has the evidence behind each rule.
"""
from __future__ import annotations

from typing import Any

from tunectl.search.rules import PROPOSERS, VETOES

from tunectl.profile import Policy

RULES: dict[str, Any] = {**PROPOSERS, **VETOES}          # name -> rule, proposers then vetoes, in default order
# the proposers that repair a config (a crash, a full KV pool, a log hint); the others walk from the leader
REPAIR_PROPOSERS = tuple(n for n, r in PROPOSERS.items() if r.kind == "repair")


def as_dict(policy: Policy) -> dict[str, list[str]]:
    """What a study records it ran with (its summary's `policy`)."""
    return {"proposers": list(policy.proposers), "vetoes": list(policy.vetoes),
            "off": [n for n in RULES if n not in (*policy.proposers, *policy.vetoes)]}
