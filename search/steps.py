"""The loop's own proposals between the sampler's, and the vetoes on all of them, run as the policy orders the
rules (search/rules/: one module per proposer and veto; search/policy.py).

`Steps.next` says what to queue before the sampler's next proposal; `Steps.veto` whether a proposal should be
dropped unrun. What the rules share lives here: the repair budget per chain of repairs, how a repair's changes
become a runnable config (grid values, bounds, the room graphs need, the vetoes), a walk step run as it is or with
the repair of the crash it would repeat. Read from the finished trials each time (search/trials.py), so several
workers and a resumed study see the same history. docs/search.md describes the rules; the crash catalog's repairs
come in as `repairs`.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from optuna.trial import FrozenTrial
from tunectl.search import finalists as fin
from tunectl.search import pooling
from tunectl.search.foresight import Seen, predicted_crash, repairs_crash
from tunectl.search.policy import REPAIR_PROPOSERS
from tunectl.search.repair import (
    GRAPH_MAX_BS,
    MEM_FRACTION,
    NO_GRAPHS,
    Footprint,
    RepairLookup,
    drives,
    footprint,
    graph_room,
    knob_value,
    lookup,
    oom_bounds,
    oom_veto_bounds,
    repaired_configs,
)
from tunectl.search.rules import PROPOSERS, VETOES
from tunectl.search.rules import gpu as gpu_rule
from tunectl.search.rules.base import Context, Evidence, Walk
from tunectl.search.rules.split import splits  # noqa: F401  (importable from here, as before the rules' split)
from tunectl.search.sampler import LOCAL_AFTER, VETO_RISK, complete, neighbours
from tunectl.search.space import base_values, config_key
from tunectl.search.surrogate import startup_risk
from tunectl.search.trials import (  # noqa: F401  (importable from here, as before the rules' split)
    FLAT,
    admission,
    chain_key,
    counted,
    facts,
    finished,
    flat_knobs,
    history,
    in_flight_repairs,
    level_values,
    load_levels,
    lost_moves,
    outcome,
    ran,
    repair_counts,
    undoes,
)

from tunectl import knobs
from tunectl.models import LOWER
from tunectl.profile import Profile

# Repair steps per crashed config: a repair that crashed again is repaired in turn, but the chain from one crash
# stops after this many (a crash whose first repairs did not serve is no lead worth the budget; the catalog lists
# up to five repairs per signature).
REPAIRS_PER_CRASH = 2
SIZED = (MEM_FRACTION, GRAPH_MAX_BS, NO_GRAPHS)   # repairs whose memory the logs size (`Footprint`)


def _as_is(cand: dict[str, Any]) -> dict[str, Any]:
    return cand


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
        """(params, user_attrs) to queue before the sampler's next proposal: the first runnable config of the
        policy's proposers, asked in its order (repair proposers: their evidence through `_repair`; walk proposers:
        their candidates through `_step`). None: the sampler proposes (before LOCAL_AFTER trials, with no served
        config to step from, or with every candidate run or vetoed)."""
        done = finished(trials)
        if len(done) < LOCAL_AFTER:
            return None
        seen = ran(trials)
        known = self.seen(done)
        best = fin.candidates(done)
        ctx = Context(self, done, known, best[0] if best else None, seen)
        pending = in_flight_repairs(trials)
        for name in self.policy.proposers:
            rule = PROPOSERS[name]
            if rule.kind == "repair":
                repair = self._repair(done, seen, known, pending, (name,), ctx)
                if repair is not None:
                    return repair[1], {"role": "search", "proposed_by": "repair", "repair_of": repair[0],
                                       "repair_for": repair[2]}
                continue
            if ctx.walk is None:
                return None                     # no served config to step from
            for cand in rule.propose(ctx):
                took = self._step(cand, ctx.walk.parent, done, seen, known)
                if took is not None:
                    return took
        return None

    def _walk_base(self, done: list[FrozenTrial], seen: set[str], known: list[Seen],
                   best: list[FrozenTrial]) -> Walk:
        """The walk from the leader (`Context.walk`): its params, its neighbours one knob away in the order tried
        (best-rated first, past flat knobs), their rank, and the room a step from it makes for graphs."""
        leader = self._leader(done, best)[0]
        cands = neighbours(self.prof.search, dict(leader.params), seen, self.rng, base_values(self.prof),
                           history(done, known), self._excluded(known), flat_knobs(leader, done), self.admission)
        return Walk(leader, dict(leader.params), cands, {config_key(c): i for i, c in enumerate(cands)},
                    self._room(done)(leader))

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
        """The odds that a proposal crashes as the history foresees, and the crash it would repeat: the first
        objection of the policy's vetoes, asked in the rules' order (search/rules/: a backend the GPU has no
        kernels for, a crash the history foresees, the startup-crash odds); (0, None) when none objects. `known`:
        `seen(done)`, when the caller has it."""
        ctx = Context(self, done, self.seen(done) if known is None else known)
        for name, rule in VETOES.items():
            if name in self.policy.vetoes:
                verdict = rule.check(params, ctx)
                if verdict is not None:
                    return verdict
        return 0.0, None

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
                pending: list[tuple[int, str]], kinds: Sequence[str] = REPAIR_PROPOSERS,
                ctx: Context | None = None) -> tuple[int, dict[str, Any], str] | None:
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
        ctx = ctx or Context(self, done, known, best[0] if best else None, seen)
        for t, fixes, bounds, why in (e for kind in kinds for e in PROPOSERS[kind].propose(ctx)):
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
        if "gpu" in on and gpu_rule.lacks(self.prof, cand, self.gpu_sm):
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
                    and not ("gpu" in on and gpu_rule.lacks(self.prof, two, self.gpu_sm)):
                return two
        return None

    def _to_repair(self, done: list[FrozenTrial], incumbent: FrozenTrial | None, known: list[Seen],
                   kinds: Sequence[str] = REPAIR_PROPOSERS) -> list[Evidence]:
        """(config, its repairs, their bounds, the evidence they answer) in the order `_repair` tries them: the
        evidence of each repair proposer in `kinds` (search/rules/), in that order; `known`: `seen(done)`."""
        ctx = Context(self, done, known, incumbent)
        return [e for kind in kinds for e in PROPOSERS[kind].propose(ctx)]

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
            levels, crash_load = load_levels(t)
            out.append(Seen(dict(t.params), phase, fixes, levels, crash_load, t.number, bounds, exc))
        return out
