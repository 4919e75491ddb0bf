"""The loop's own proposals between the sampler's: repair steps, local steps, and the vetoes on all of them.

Read from the finished trials of the study each time (so several workers and a resumed study see the same
history). `Steps.next` says what to queue before the sampler's next proposal; `Steps.veto` whether a proposal
should be dropped unrun. docs/search.md describes the rules; the crash catalog's repairs come in as `repairs`.
"""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState
from tunectl.search import finalists as fin
from tunectl.search import pooling
from tunectl.search.foresight import Seen, predicted_crash, repairs_crash
from tunectl.search.policy import REPAIR_PROPOSERS
from tunectl.search.repair import (
    GRAPH_MAX_BS,
    MAX_RUNNING,
    MEM_FRACTION,
    NO_GRAPHS,
    Footprint,
    RepairLookup,
    drives,
    footprint,
    graph_room,
    knob_value,
    log_hints,
    lookup,
    numeric,
    oom_bounds,
    oom_veto_bounds,
    pool_bounds,
    pool_relief,
    repaired_configs,
)
from tunectl.search.sampler import LOCAL_AFTER, TPE_STARTUP, VETO_RISK, complete, neighbours
from tunectl.search.space import base_values, config_key
from tunectl.search.study import host_of
from tunectl.search.surrogate import Admission, History, Surrogate, ordered, startup_risk

from tunectl import knobs
from tunectl.sglang import scopes
from tunectl.models import LOWER, RAISE, ladder_steps
from tunectl.profile import Profile, SearchSpec

# A startup crash is repaired when the value model rates its config at least this share of the incumbent's value.
STARTUP_REPAIR_SHARE = 0.9
FLAT = 0.01                    # a move that changed the value less than this share is no lead
KV_PRESSURE = "kv_pool_oom"         # the catalog signature whose repairs answer a full KV pool (retractions)
KV_PRESSURE_SHARE = 0.1        # retractions worth a repair: at least this share of the top level's requests
# Repair steps per crashed config: a repair that crashed again is repaired in turn, but the chain from one crash
# stops after this many (a crash whose first repairs did not serve is no lead worth the budget; the catalog lists
# up to five repairs per signature).
REPAIRS_PER_CRASH = 2


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


def _as_is(cand: dict[str, Any]) -> dict[str, Any]:
    return cand


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


SIZED = (MEM_FRACTION, GRAPH_MAX_BS, NO_GRAPHS)   # repairs whose memory the logs size (`Footprint`)


class Steps:
    def __init__(self, prof: Profile, repairs: RepairLookup | None, rng: random.Random,
                 gpu_sm: int | None = None):
        # `repairs`: the crash catalog's repairs per signature (None: no catalog, so no repair steps and only
        # the vetoes that need no repairs). Local steps keep going while they improve and fill knobs that become
        # active with their baseline values (the vetoes catch the crashes such a walk meets).
        self.prof, self.repairs, self.rng = prof, repairs, rng
        self.gpu_sm = gpu_sm            # a backend this GPU has no kernels for is never proposed (tunectl/sglang/scopes.py)
        self.admission = admission(prof)
        self.policy = prof.search.policy        # which rules run, in what order (search/policy.py)
        self._memo: dict[str, tuple[tuple[int, ...], Any]] = {}     # what one history gives, by name

    def next(self, trials: list[FrozenTrial]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(params, user_attrs) to queue before the sampler's next proposal: a repair whenever a config that
        out-served the incumbent crashed with a signature the catalog can repair, else a local step from the
        incumbent, the halves of the pair move that made it first (`splits`) (None: the sampler proposes: before
        LOCAL_AFTER trials, with no served config to step from, or with every neighbour run or vetoed)."""
        done = finished(trials)
        if len(done) < LOCAL_AFTER:
            return None
        seen = ran(trials)
        known = self.seen(done)
        walk = None                             # the walk's candidates, built when the first walk proposer asks
        for repairs, names in itertools.groupby(self.policy.proposers, key=lambda n: n in REPAIR_PROPOSERS):
            if repairs:                         # a run of repair proposers: one pass over their evidence, in order
                repair = self._repair(done, seen, known, in_flight_repairs(trials), tuple(names))
                if repair is not None:
                    return repair[1], {"role": "search", "proposed_by": "repair", "repair_of": repair[0],
                                       "repair_for": repair[2]}
                continue
            walk = walk or self._walk(done, seen, known)
            if walk is None:
                return None
            parent, by_proposer = walk
            for name in names:
                for cand in by_proposer[name]:
                    took = self._step(cand, parent, done, seen, known)
                    if took is not None:
                        return took
        return None

    def _walk(self, done: list[FrozenTrial], seen: set[str], known: list[Seen]
              ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | None:
        """The walk from the leader: its parent params and, per walk proposer, its candidates in the order they are
        tried: `split`, the halves of the pair move that made the leader first (`splits`, in the neighbours'
        order), and `local`, its neighbours one knob away (graphs switched on with the room they need). None with
        no served config to step from."""
        best = fin.candidates(done)
        if not best:
            return None
        best = self._leader(done, best)
        cands = neighbours(self.prof.search, dict(best[0].params), seen, self.rng, base_values(self.prof),
                           history(done, known), self._excluded(known), flat_knobs(best[0], done), self.admission)
        room = self._room(done)(best[0])
        halves = splits(self.prof, best[0], done, self.rng) if "split" in self.policy.proposers else []
        rank = {config_key(c): i for i, c in enumerate(cands)}
        halves = sorted(halves, key=lambda c: rank.get(config_key(c), len(rank)))

        def runnable(cs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [c for c in map(room, cs) if config_key(c) not in seen]

        return dict(best[0].params), {"split": runnable(halves), "local": runnable(cands)}

    def _step(self, cand: dict[str, Any], parent: dict[str, Any], done: list[FrozenTrial], seen: set[str],
              known: list[Seen]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A local step as it can run: itself when no veto flags it; when it would repeat a crash the catalog
        repairs, with that repair applied as well (`_runnable`: not one that takes the step back), e.g. a higher mem
        fraction with a smaller chunk where the higher one alone runs out of memory at graph capture. The pair move
        no single step reaches, since the crashing half is never run and so never asks for its repair. None: vetoed
        with no repair that runs."""
        risk, like = self.veto(cand, done, known)
        if risk < VETO_RISK:
            return cand, {"role": "search", "proposed_by": "local"}
        if like is None or not like.fixes:
            return None
        fixed = self._runnable(cand, seen, known, base_values(self.prof), self._footprint(done), parent)
        if fixed is None or config_key(fixed) == config_key(cand) or self.veto(fixed, done, known)[0] >= VETO_RISK:
            return None
        return fixed, {"role": "search", "proposed_by": "local", "step_repaired": like.number}

    def veto(self, params: dict[str, Any], done: list[FrozenTrial],
             known: list[Seen] | None = None) -> tuple[float, Seen | None]:
        """The odds that a proposal crashes as the history foresees, and the crash it would repeat (a backend the
        GPU has no kernels for: 1, before any crash; then the rules of search/foresight.py, then the startup-crash
        odds). `known`: `seen(done)`, when the caller has it."""
        on = self.policy.vetoes
        if "gpu" in on and scopes.gpu_lacks(self.prof, params, self.gpu_sm):
            return 1.0, None
        known = self.seen(done) if known is None else known
        like = predicted_crash(self.prof.search, params, known, self._footprint(done)) if "foresight" in on else None
        if like is not None:
            return 1.0, like
        risky = "startup_risk" in on and len(done) >= TPE_STARTUP
        return (self._startup_risk(done, known)(params) if risky else 0.0), None

    def _leader(self, done: list[FrozenTrial], best: list[FrozenTrial]) -> list[FrozenTrial]:
        """The served configs with the one to step from first: the best pooled estimate (search/pooling.py: its
        reading weighed against what the other configs' readings predict for it), not the luckiest reading."""
        if not self.prof.search.pool:
            return best

        def build() -> list[FrozenTrial]:
            est, _ = pooling.estimates(self.prof.search, self.admission, [(dict(t.params), [float(t.values[0])])
                                       for t in best], self.prof.search.finalists.noise)
            if all(e is None for e in est):
                return best
            key = {t.number: (e[0] if e is not None else math.log(max(float(t.values[0]), 1e-9)))
                   for t, e in zip(best, est)}
            return sorted(best, key=lambda t: -key[t.number])

        return self._per_history("leader", done, build)

    def _per_history(self, name: str, done: list[FrozenTrial], build: Callable[[], Any]) -> Any:
        """`build()`, once per history (the finished trials): vetoes ask for it once per candidate."""
        key = tuple(t.number for t in done)
        hit = self._memo.get(name)
        if hit is None or hit[0] != key:
            hit = self._memo[name] = (key, build())
        return hit[1]

    def _footprint(self, done: list[FrozenTrial]) -> Footprint | None:
        return self._per_history("footprint", done, lambda: footprint([facts(t) for t in done]))

    def _startup_risk(self, done: list[FrozenTrial], known: list[Seen]) -> Callable[[dict[str, Any]], float]:
        def build() -> Callable[[dict[str, Any]], float]:
            rows = history(done, known)
            return lambda p: startup_risk(p, rows)

        return self._per_history("startup_risk", done, build)

    def _repair(self, done: list[FrozenTrial], seen: set[str], known: list[Seen],
                pending: list[tuple[int, str]], kinds: Sequence[str] = REPAIR_PROPOSERS
                ) -> tuple[int, dict[str, Any], str] | None:
        """The first untried repair of, in this order: the fastest configs that crashed under load after serving
        more than the incumbent did at the same levels; the incumbent when the server retracted requests (the KV
        pool was full: soft evidence); configs that crashed at startup which the value model rates near the
        incumbent, or that were repair steps themselves (a hint from the server's log whose config crashed); the
        incumbent, then the configs that tied it (`peers`), when its log asks for a change (search/repair.py
        `log_hints`: decode batches above the captured graph sizes, requests queued at max-running-requests). Each
        repair once, with the bounds the server's log gives (how much memory an OOM missed, how many requests the
        KV pool holds); at most REPAIRS_PER_CRASH per chain (`chain_key`: per config and piece of evidence), the
        repairs in flight (`pending`: the configs they repair and what for; parallel trials) counted, and none for
        a config whose repair is in flight."""
        best = fin.candidates(done)
        fixed = {t.user_attrs.get("repair_of") for t in best} | {n for n, _ in pending}
        base = base_values(self.prof)
        counts, by_number = repair_counts(done), {t.number: t for t in done}
        for n, why in pending:
            if n in by_number:
                key = chain_key(by_number[n], by_number, why)
                counts[key] = counts.get(key, 0) + 1
        room_from = self._room(done)
        for t, fixes, bounds, why in self._to_repair(done, best[0] if best else None, known, kinds):
            if t.number in fixed or counts.get(chain_key(t, by_number, why), 0) >= REPAIRS_PER_CRASH:
                continue                        # one of its repairs already serves the whole ladder, or spent
            room = room_from(t) if outcome(t) == "ok" else _as_is
            for cand in repaired_configs(self.prof.search, dict(t.params), fixes,
                                         lambda p: complete(self.prof.search, p, self.rng, base), bounds):
                cand = self._runnable(room(cand), seen, known, base, self._footprint(done), dict(t.params))
                if cand is not None:
                    return t.number, cand, why
        return None

    def _room(self, done: list[FrozenTrial]) -> Callable[[FrozenTrial], Callable[[dict[str, Any]], dict[str, Any]]]:
        """For a served config, what its steps become: one that switches CUDA graphs on from a config that ran
        without them comes with the mem fraction lowered as far as the graphs need (`graph_room`: their size from
        the graphs the servers logged, the floor the least free memory any served config was left with); any other
        step, and every step from a config that ran with graphs, as it is."""
        fp = self._footprint(done)
        graph_gb = fp.graph_gb if fp is not None else None
        floor = min((facts(t)["available_gpu_mem_gb"] for t in done
                     if outcome(t) == "ok" and "available_gpu_mem_gb" in facts(t)), default=None)

        def room_from(served: FrozenTrial) -> Callable[[dict[str, Any]], dict[str, Any]]:
            off = knobs.merge(self.prof, dict(served.params))[0].get(NO_GRAPHS) is True or \
                knob_value(self.prof.search, dict(served.params), NO_GRAPHS) is True   # 0.5.17: a stand-in knob
            if graph_gb is None or floor is None or not off:
                return _as_is                   # nothing to size graphs by, or graphs on already
            params, logged = dict(served.params), facts(served)
            return lambda cand: graph_room(self.prof.search, cand, params, logged, graph_gb, floor)

        return room_from

    def _runnable(self, cand: dict[str, Any], seen: set[str], known: list[Seen],
                  base: dict[str, Any], fp: Footprint | None = None,
                  parent: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """A repair candidate as it can run: itself when unseen and no veto flags it; when it would repeat a crash
        the catalog can repair (graphs switched on, or larger, at a mem fraction where capture already ran out of
        memory), the first of that crash's repairs applied to it as well that leaves it unseen and unflagged (the
        mem fraction lowered as far as the crash's OOM says, plus what the candidate takes beyond the crashed
        config: `fp`, the study's footprint); else None. Not a repair that takes back the step's own move from
        `parent` (`undoes`), and where the footprint says the candidate takes more than the crashed config did,
        only one whose memory the logs size (`SIZED`: a smaller chunk frees what no log measured)."""
        on = self.policy.vetoes
        if "gpu" in on and scopes.gpu_lacks(self.prof, cand, self.gpu_sm):
            return None
        search = self.prof.search
        like = predicted_crash(search, cand, known, fp) if "foresight" in on else None
        if like is None:
            return cand if config_key(cand) not in seen else None
        if not like.fixes or config_key(cand) in seen:
            return None
        more, bounds = 0.0, {}
        if like.crash_phase == "startup":
            if fp is not None and (MEM_FRACTION, LOWER) in like.fixes:       # an OOM: weigh both footprints
                more = fp.excess(search, cand, like.params)
            bounds = oom_bounds(like.exception, cand, search, more) if more > 0 else \
                oom_bounds(like.exception, like.params, search)
        fixes = [f for f in like.fixes if (parent is None or not undoes(search, parent, cand, f))
                 and (more <= 0 or f[0] in SIZED)]
        for two in repaired_configs(search, cand, fixes, lambda p: complete(search, p, self.rng, base), bounds):
            if config_key(two) not in seen and predicted_crash(search, two, known, fp) is None \
                    and not ("gpu" in on and scopes.gpu_lacks(self.prof, two, self.gpu_sm)):
                return two
        return None

    def _to_repair(self, done: list[FrozenTrial], incumbent: FrozenTrial | None, known: list[Seen],
                   kinds: Sequence[str] = REPAIR_PROPOSERS) -> list[tuple[FrozenTrial, Any, dict[str, float], str]]:
        """(config, its repairs, their bounds, the evidence they answer) in the order `_repair` tries them: the
        evidence of each repair proposer in `kinds` (search/policy.py), in that order; `known`: `seen(done)`."""
        return [r for kind in kinds for r in self._evidence(done, incumbent, known, kind)]

    def _evidence(self, done: list[FrozenTrial], incumbent: FrozenTrial | None, known: list[Seen],
                  kind: str) -> list[tuple[FrozenTrial, Any, dict[str, float], str]]:
        """One repair proposer's evidence, in the order it is tried."""
        wl = self.prof.bench.workloads[0]
        if kind == "load_repair":
            return [(t, self._fixes(t), {}, str(t.user_attrs.get("crash_signature", "")))
                    for t in sorted((t for t in done if outpaced(t, incumbent)), key=lambda t: -t.values[0])]
        if incumbent is None:
            return []
        if kind == "kv_pressure":
            logged = facts(incumbent)
            top = max((st.concurrency for st in ladder_steps(incumbent.user_attrs.get("ladder"))
                       if st.status == "ok"), default=0)
            if logged.get("retracted_reqs", 0) >= KV_PRESSURE_SHARE * top > 0:
                fixes = [*pool_relief(self.prof.search, dict(incumbent.params), logged),
                         *lookup(self.repairs, KV_PRESSURE)]
                return [(incumbent, self._unlost(fixes, lost_moves(done)),
                         pool_bounds(logged, wl.input_len + wl.output_len), KV_PRESSURE)]
            return []
        if kind == "startup_repair":
            out = []
            crashed = [t for t in done if outcome(t) == "startup" and self._fixes(t)]
            if crashed and incumbent.values:
                model = Surrogate(self.prof.search, history(done, known), self.admission)
                for t in sorted(crashed, key=lambda t: -t.number):
                    if t.user_attrs.get("proposed_by") == "repair" or \
                            model.value.predict(dict(t.params)) >= STARTUP_REPAIR_SHARE * incumbent.values[0]:
                        exc = str(t.user_attrs.get("crash_exception", ""))
                        out.append((t, self._fixes(t), oom_bounds(exc, dict(t.params), self.prof.search),
                                    str(t.user_attrs.get("crash_signature", ""))))
            return out
        out = []                                # log_hint
        lost = lost_moves(done)
        for peer in peers(incumbent, done):
            flags = knobs.merge(self.prof, dict(peer.params))[0]
            for fixes, bounds in log_hints(self.prof.search, dict(peer.params), flags, facts(peer),
                                           wl.input_len + wl.output_len):
                out.append((peer, self._unlost(fixes, lost), bounds,
                            "hint:" + ",".join(sorted({str(target) for target, _ in fixes}))))
        return out

    def _unlost(self, fixes: Sequence[tuple[str, Any]], lost: set[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Soft-evidence repairs less the moves that already lost (`lost_moves`)."""
        space = self.prof.search.space
        return [(target, change) for target, change in fixes
                if not any(drives(name, spec, target) and (name, change) in lost for name, spec in space.items())]

    def _fixes(self, t: FrozenTrial) -> Any:
        return lookup(self.repairs, t.user_attrs.get("crash_signature"), str(t.user_attrs.get("crash_exception", "")))

    def _excluded(self, known: list[Seen]) -> Callable[[dict[str, Any]], frozenset[int]]:
        """The history rows a candidate's own risk does not depend on: crashes it repairs (it applies one of
        their catalog repairs: fp8 KV crashed with the chunked prefix cache on, not with it off)."""
        fixable = [i for i, s in enumerate(known) if s.crash_phase and s.fixes]

        def excluded(cand: dict[str, Any]) -> frozenset[int]:
            return frozenset(i for i in fixable if repairs_crash(self.prof.search, cand, known[i]))

        return excluded

    def seen(self, done: list[FrozenTrial]) -> list[Seen]:
        out = []
        for t in done:
            a = t.user_attrs
            phase = None if a.get("crash_class") is None else "startup" if outcome(t) == "startup" else "load"
            fixes = lookup(self.repairs, a.get("crash_signature"), str(a.get("crash_exception", ""))) \
                if phase else ()
            exc = str(a.get("crash_exception", ""))
            bounds = oom_veto_bounds(exc, dict(t.params), self.prof.search) if phase == "startup" else {}
            out.append(Seen(dict(t.params), phase, fixes, {c: v for (_, c), v in level_values(t).items()},
                            a.get("crash_level"), t.number, bounds, exc))
        return out
