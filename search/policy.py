"""The search's own rules as data: which proposers and vetoes run, in what order (a profile's `search.policy`).

Between the sampler's proposals, `Steps.next` (search/steps.py) asks the proposers in the policy's order; the first
that has a runnable config queues it (recorded on the trial as `proposed_by` and what it answers). Each proposer
yields candidates by one interface: repair proposers (config, fixes, bounds, evidence) through `Steps._repair`, walk
proposers candidate configs through `Steps._step`; each candidate passes the vetoes the policy lists (their order
does not matter: any one drops it) before it is queued, and the sampler's own proposals pass them too. A rule left
out of the policy never runs; adding one is its function plus its name here and in tunectl/profile.py's tuple.
docs/search.md ("The policy") has the evidence behind each rule.
"""
from __future__ import annotations

from dataclasses import dataclass

from tunectl.profile import Policy


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str                # "repair" | "walk" | "veto"
    does: str
    constants: tuple[str, ...] = ()


RULES = {r.name: r for r in (
    Rule("load_repair", "repair", "repairs the fastest configs that crashed under load after serving more than the "
         "incumbent did at the same levels (the crash catalog's repairs)", ("REPAIRS_PER_CRASH",)),
    Rule("kv_pressure", "repair", "relieves the incumbent's KV pool when its server retracted requests (FP8 KV, a "
         "higher memory fraction, fewer running requests)", ("KV_PRESSURE_SHARE",)),
    Rule("startup_repair", "repair", "repairs configs that crashed at startup which the value model rates near the "
         "incumbent, or that were repairs themselves", ("STARTUP_REPAIR_SHARE", "REPAIRS_PER_CRASH")),
    Rule("log_hint", "repair", "acts on what the incumbent's (and its ties') server log asks for: decode batches "
         "above the captured graphs, requests queued at max-running-requests, a full KV pool"),
    Rule("split", "walk", "takes apart the pair move that made the leader first: each half alone"),
    Rule("local", "walk", "steps one knob away from the leader (best pooled estimate), best-rated first, "
         "past flat knobs", ("LOCAL_AFTER", "FLAT")),
    Rule("gpu", "veto", "drops a backend this GPU has no kernels for (its SM version)"),
    Rule("foresight", "veto", "drops a config the history says repeats a crash (same crash's cause, a memory "
         "footprint at or above one that ran out of memory); a local step it drops is tried with the crash's repair "
         "applied"),
    Rule("startup_risk", "veto", "drops a proposal the startup-crash model rates at or above VETO_RISK",
         ("VETO_RISK", "TPE_STARTUP")),
)}
# the proposers that repair a config (a crash, a full KV pool, a log hint); the others walk from the leader
REPAIR_PROPOSERS = tuple(n for n, r in RULES.items() if r.kind == "repair")


def as_dict(policy: Policy) -> dict[str, list[str]]:
    """What a study records it ran with (its summary's `policy`)."""
    return {"proposers": list(policy.proposers), "vetoes": list(policy.vetoes),
            "off": [n for n in RULES if n not in (*policy.proposers, *policy.vetoes)]}
