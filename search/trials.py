"""What the finished trials of a study say, read the same way by every rule: each one's outcome and values per
level, the chains of repairs, the configs that tie the incumbent, the moves that already lost, which trials count.

Read from the trials' user attributes each time (so several workers and a resumed study see the same history).
"""
from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial, TrialState
from tunectl.search import finalists as fin
from tunectl.search.foresight import Seen
from tunectl.search.repair import MAX_RUNNING, drives, numeric
from tunectl.search.space import config_key
from tunectl.search.study import host_of
from tunectl.search.surrogate import Admission, History

from tunectl.models import LOWER, RAISE, ladder_steps
from tunectl.profile import Profile, SearchSpec

FLAT = 0.01                    # a move that changed the value less than this share is no lead


def outcome(t: FrozenTrial) -> str:
    if t.state != TrialState.COMPLETE:
        return "pruned"
    if "crash_class" not in t.user_attrs and not t.user_attrs.get("degenerate"):
        return "ok"
    return "startup" if t.user_attrs.get("crash_phase") == "startup" or not t.values or not t.values[0] else "load"


def history(done: list[FrozenTrial], known: list[Seen] | None = None) -> History:
    """(params, outcome, value) per finished trial; a startup crash the catalog explains (it has repairs, e.g. an
    OOM) reads "explained": it says something about its repair knobs (the vetoes use it), nothing about the
    config's other values (a disabled radix cache did not make the pool too big)."""
    rows = []
    for i, t in enumerate(done):
        out = outcome(t)
        if out == "startup" and known is not None and known[i].fixes:
            out = "explained"
        rows.append((t.params, out, t.values[0] if t.values else 0.0))
    return rows


def facts(t: FrozenTrial) -> dict[str, float]:
    """What the trial's server logged (tunectl/sglang/crashes/classifier.py LOG_FACTS)."""
    return t.user_attrs.get("server_facts") or {}


def load_levels(t: FrozenTrial) -> tuple[dict[float, float], float | None]:
    """The load each served level offered -> its throughput, and the load it crashed at (None: no load crash).
    The load is the concurrency, or for a capacity search's open-loop probes the request rate (`LadderStep.load`):
    those levels all run at concurrency 0, so keyed by it they would read as one level, crashed at 0."""
    steps = ladder_steps(t.user_attrs.get("ladder"))
    crashed = next((s.load for s in steps if s.status == "crashed"), t.user_attrs.get("crash_level"))
    return ({s.load: s.output_throughput for s in steps if s.status == "ok"},
            crashed if t.user_attrs.get("crash_phase") == "load" else None)


def level_values(t: FrozenTrial) -> dict[tuple[str, int], float]:
    return {(s.workload, s.concurrency): s.output_throughput for s in ladder_steps(t.user_attrs.get("ladder"))
            if s.status == "ok"}


def outpaced(t: FrozenTrial, incumbent: FrozenTrial | None) -> bool:
    """A config that crashed under load after serving more than the incumbent did at the same levels."""
    if t.state != TrialState.COMPLETE or t.user_attrs.get("crash_phase") != "load" or not t.values:
        return False
    if incumbent is None:
        return t.values[0] > 0
    mine, theirs = level_values(t), level_values(incumbent)
    top = max(mine, key=lambda k: k[1], default=None)
    return top is not None and mine[top] > theirs.get(top, incumbent.values[0])


def lost_moves(done: list[FrozenTrial]) -> set[tuple[str, Any]]:
    """Soft-evidence moves that already lost: (knob, RAISE | LOWER | value) of a repair step whose config served
    the whole ladder but no more than FLAT above the served config it changed. A log hint or the KV-pressure
    repair that did not pay from one incumbent is not proposed again from the next (lowering max-running to what
    the pool holds, when the retractions it avoids cost less than the cap does; a higher mem fraction for a pool
    that fills only at a level above the one that counts)."""
    by_number = {t.number: t for t in done}
    out: set[tuple[str, Any]] = set()
    for t in done:
        parent = by_number.get(t.user_attrs.get("repair_of"))      # type: ignore[arg-type]
        if (t.user_attrs.get("proposed_by") != "repair" or parent is None or outcome(parent) != "ok"
                or outcome(t) != "ok" or t.values[0] > (1.0 + FLAT) * parent.values[0]):
            continue
        for k in set(t.params) & set(parent.params):
            was, now = parent.params[k], t.params[k]
            if was == now:
                continue
            out.add((k, (RAISE if now > was else LOWER) if numeric((was, now)) else now))
    return out


def chain_key(t: FrozenTrial, by_number: dict[int, FrozenTrial], reason: str = "") -> tuple[int, str]:
    """(the config a chain of repairs started from, the evidence its first repair answered: `repair_for`, a crash
    signature or a log hint). A repair that crashed in turn belongs to the chain of the config it repaired.
    `reason`: what a repair of `t` would answer. One incumbent's log hints are separate chains: a higher mem
    fraction for its full KV pool that crashed and was repaired does not spend the budget of its graphs, which its
    log says are too small."""
    while (t.user_attrs.get("proposed_by") == "repair" and outcome(t) != "ok"
           and t.user_attrs.get("repair_of") in by_number):
        reason = str(t.user_attrs.get("repair_for", ""))
        t = by_number[t.user_attrs["repair_of"]]
    return t.number, reason


def repair_counts(done: list[FrozenTrial]) -> dict[tuple[int, str], int]:
    """Repair steps run per chain (keyed by `chain_key` of the config each one repaired)."""
    by_number = {t.number: t for t in done}
    counts: dict[tuple[int, str], int] = {}
    for t in done:
        parent = by_number.get(t.user_attrs.get("repair_of"))       # type: ignore[arg-type]
        if t.user_attrs.get("proposed_by") == "repair" and parent is not None:
            key = chain_key(parent, by_number, str(t.user_attrs.get("repair_for", "")))
            counts[key] = counts.get(key, 0) + 1
    return counts


def in_flight_repairs(trials: list[FrozenTrial]) -> list[tuple[int, str]]:
    """The configs that repairs still running or queued repair, with the evidence each answers."""
    return [(int(t.user_attrs["repair_of"]), str(t.user_attrs.get("repair_for", ""))) for t in trials
            if t.state in (TrialState.RUNNING, TrialState.WAITING)
            and t.user_attrs.get("proposed_by") == "repair" and "repair_of" in t.user_attrs]


def flat_knobs(incumbent: FrozenTrial, done: list[FrozenTrial]) -> set[str]:
    """Knobs already moved alone from the incumbent with no effect (within FLAT of its value, served fully):
    local steps leave them, the budget goes to knobs that may matter."""
    mine, value = incumbent.params, incumbent.values[0]
    out = set()
    for t in done:
        if outcome(t) != "ok" or t.number == incumbent.number:
            continue
        diff = {k for k in set(mine) | set(t.params) if mine.get(k) != t.params.get(k)}
        if len(diff) == 1 and abs(t.values[0] - value) <= FLAT * value:
            out |= diff
    return out


def peers(incumbent: FrozenTrial, done: list[FrozenTrial]) -> list[FrozenTrial]:
    """The incumbent and the configs that served the whole ladder within FLAT of it, fastest first: a tie is no
    lead over the incumbent, but its log is as good a witness of what the server lacks (graphs captured for
    batches smaller than the ones it ran, with the same throughput as graphs off)."""
    value = incumbent.values[0]
    ties = [t for t in done if outcome(t) == "ok" and t.number != incumbent.number
            and t.values[0] >= (1.0 - FLAT) * value]
    return [incumbent, *sorted(ties, key=lambda t: -t.values[0])]


def admission(prof: Profile) -> Admission | None:
    """The knob that caps the running batch (drives max-running-requests) and the most requests the ladder keeps
    in flight (its top level; open-loop: `max_concurrency`), for the value model's hinge; None when either is
    unknown."""
    name = next((n for n, spec in prof.search.space.items() if drives(n, spec, MAX_RUNNING)), None)
    top = prof.bench.max_concurrency if prof.bench.rates else max(prof.bench.levels, default=None)
    return (name, float(top)) if name is not None and top else None


def counted(t: FrozenTrial) -> bool:
    """Trials that use the search budget: search/baseline, not duplicates, not failed attempts, not a RUNNING trial
    no host claimed (its worker died right after the ask: `fail_hostless` queues it again)."""
    return (fin.role(t) in fin.SEARCH_ROLES and "duplicate_of" not in t.user_attrs
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
            and not (t.state == TrialState.RUNNING and host_of(t) is None))


def ran(trials: list[FrozenTrial]) -> set[str]:
    """The configs run, running or queued (`config_key`; not those told FAIL unrun: vetoed, re-gridded, ...)."""
    return {config_key(t.params) for t in trials if t.state != TrialState.FAIL}


def finished(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if counted(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def undoes(search: SearchSpec, parent: dict[str, Any], cand: dict[str, Any], fix: tuple[str, Any]) -> bool:
    """Would the repair `fix` take back the move from `parent` to `cand` (lower the mem fraction a KV-pool
    repair raised, set a value the parent had)? Such a repair makes the step pointless, not runnable."""
    target, change = fix
    for name, spec in search.space.items():
        if not drives(name, spec, target) or name not in cand or parent.get(name) == cand[name]:
            continue
        was, now = parent.get(name), cand[name]
        if change in (LOWER, RAISE):
            return numeric((was, now)) and (now > was if change == LOWER else now < was)
        return change == was
    return False
