"""Which proposals will crash like a config already seen: the vetoes that keep the budget off crashing configs.

Three rules, all read from the study's own crashes; a proposal they flag is never run (no budget used):

- **Keeps the crash** (`keeps_crash`): the crash's signature has catalog repairs the space can express, and the
  proposal applies none of them: each repair knob is where the crashed config had it, or further the wrong way
  (a `LOWER` repair of mem-fraction-static 0.88: any value >= 0.88; where the OOM message says how much memory
  was missing, any value not lowered that far: `Seen.bounds`, the same bound the repair step moves by). The rule
  stands until a config that keeps
  the crash by it did not crash: for a startup crash, one that started (the catalog's repairs were not the
  whole story; for an OOM, one that needed at least the proposal's memory: mem fraction, graph max bs, chunk
  size and max running requests as large, `as_demanding`); for a load crash, one that served as much as the
  crashed one did at the level it crashed at (a baseline capped at 64 running requests never reaches the batches
  that crash, so it refutes nothing). Once the servers' logs size the CUDA graphs (`Footprint`: mem fraction x the
  GPU's memory, plus the graphs at the config's max bs), a startup OOM's mem fraction and graph max bs repairs
  count as one: a proposal applies them where its static pool and graphs take less memory than the crashed
  config's did (0.88 with graphs to 512 keeps a capture OOM at 0.91 with graphs to 256 when the larger graphs take
  more than the 3 points of mem fraction gave back); `as_demanding` weighs the two knobs the same way.
- **Unexplained startup crash** (`suspects`): a startup crash the catalog has no repairs for; the knob values of
  the crashed config that no config that started has ever had, only its choices (strings, booleans) where it has
  new ones: a backend the hardware lacks, not the new mem fraction it happened to run with; of those, the ones its
  exception names where it names some. A proposal with all of them is flagged.
- **Memory ceiling** (`memory_ceiling`): two startup OOMs (crashes whose repairs lower the mem fraction) at or
  below the proposal's mem fraction, and no config at or above it that needed as much memory (`as_demanding`:
  graphs, chunks and running requests as large) ever started. The first rule lets a config
  that crashed at 0.94 with graphs to 512 be tried at 0.94 with graphs to 256 (it applies a repair); after the
  second OOM at that height the fraction itself is the lead.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tunectl.search.repair import (
    GRAPH_MAX_BS,
    LOWER,
    MEM_FRACTION,
    MEMORY_TARGETS,
    RAISE,
    Footprint,
    drives,
    knob_value,
    numeric,
)

from tunectl.profile import SearchSpec


@dataclass
class Seen:
    """One finished trial, as the vetoes read it."""

    params: dict[str, Any]
    crash_phase: str | None = None                  # "startup" | "load" | None (served the whole ladder)
    fixes: Sequence[tuple[str, Any]] = ()          # the catalog's repairs for its crash signature
    levels: dict[float, float] = field(default_factory=dict)   # stable throughput per load (`load_levels`)
    crash_level: float | None = None                # the load it crashed at: a concurrency, or a request rate
    number: int = -1
    bounds: dict[str, float] = field(default_factory=dict)   # how far a repair target must move (an OOM's size)
    exception: str = ""                             # the crash's exception line


JOINT = (MEM_FRACTION, GRAPH_MAX_BS)     # the repair targets a footprint weighs together


def freed(search: SearchSpec, params: dict[str, Any], crashed: Seen, fp: Footprint | None) -> bool | None:
    """For a startup OOM (its repairs lower the mem fraction) and a proposal that, like the crashed config, runs
    graphs: does the proposal's static pool and graphs take less memory than the crashed config's (`Footprint`),
    by what its OOM surely missed where the message says (`Seen.bounds`)? None where the footprint cannot tell."""
    if fp is None or crashed.crash_phase != "startup" or (MEM_FRACTION, LOWER) not in crashed.fixes:
        return None
    mine, theirs = fp.of(search, params), fp.of(search, crashed.params)
    if mine is None or theirs is None:
        return None
    far, was = crashed.bounds.get(MEM_FRACTION), knob_value(search, crashed.params, MEM_FRACTION)
    missed = (float(was) - far) * fp.total_gb if far is not None and numeric([was]) else 0.0
    return mine < theirs - max(missed, 1e-6)


def keeps_crash(search: SearchSpec, params: dict[str, Any], crashed: Seen, fp: Footprint | None = None) -> bool:
    """The proposal applies none of the crash's repairs (and at least one repair is a knob of the space). With a
    footprint, a startup OOM's mem fraction and graph max bs repairs count as one: applied where the proposal
    frees memory (`freed`), whichever of the two it moved."""
    expressed, joint = False, freed(search, params, crashed, fp)
    for target, change in crashed.fixes:
        if joint is not None and target in JOINT:
            if joint:
                return False
            expressed = True
            continue
        for name, spec in search.space.items():
            if not drives(name, spec, target) or name not in crashed.params:
                continue
            expressed = True
            mine, theirs = params.get(name), crashed.params[name]
            if mine is None:
                return False                        # the knob is off in the proposal: a different setup
            far = crashed.bounds.get(target)
            if change == LOWER and mine < theirs and (far is None or mine <= far + 1e-9) \
                    or change == RAISE and mine > theirs and (far is None or mine >= far - 1e-9):
                return False
            if change not in (LOWER, RAISE) and mine != theirs:
                return False
    return expressed


def repairs_crash(search: SearchSpec, params: dict[str, Any], crashed: Seen) -> bool:
    """The proposal applies at least one of the crash's catalog repairs the space expresses."""
    return bool(crashed.fixes) and not keeps_crash(search, params, crashed) and any(
        drives(name, spec, target) and name in crashed.params
        for target, _ in crashed.fixes for name, spec in search.space.items())


def _load_at(crashed: Seen) -> float:
    """What the crashed config served just below its crash level; 0 when unknown."""
    below = [c for c in crashed.levels if crashed.crash_level is None or c < crashed.crash_level]
    return crashed.levels[max(below)] if below else 0.0


def as_demanding(search: SearchSpec, started: dict[str, Any], params: dict[str, Any],
                 fp: Footprint | None = None) -> bool:
    """`started` needs at least the memory `params` needs, as far as the ordered knobs that size memory say (mem
    fraction, graph max bs, chunk size, max running requests; each active in `params` is active in `started` and
    at least as large there; with a footprint, the mem fraction and graphs by the memory they take together):
    had `params` run out of memory at startup, so would `started`."""
    mine_gb, theirs_gb = (fp.of(search, params), fp.of(search, started)) if fp is not None else (None, None)
    joint = mine_gb is not None and theirs_gb is not None
    if joint and theirs_gb < mine_gb:           # type: ignore[operator]
        return False
    for target in MEMORY_TARGETS:
        if joint and target in JOINT:
            continue
        mine, theirs = knob_value(search, params, target), knob_value(search, started, target)
        if numeric([mine]) and not (numeric([theirs]) and theirs >= mine):
            return False
    return True


def _refuted(search: SearchSpec, crashed: Seen, seen: list[Seen], params: dict[str, Any] | None = None,
             fp: Footprint | None = None) -> bool:
    """A config that keeps the crash did not crash so: it started (startup crash), or served as much as the crashed
    one did just below its crash level at a load at least that high (load crash: a concurrency, or a capacity
    search's request rate). For a startup OOM (its repairs lower the mem fraction) and a
    proposal, only a started config that needs at least the proposal's memory refutes it (`as_demanding`): one that
    started with chunks of 8,192 says nothing about the autotune workspace of chunks of 16,384."""
    if crashed.crash_phase == "startup":
        oom = params is not None and (MEM_FRACTION, LOWER) in crashed.fixes
        return any(s.crash_phase != "startup" and keeps_crash(search, s.params, crashed, fp)
                   and (not oom or as_demanding(search, s.params, params, fp)) for s in seen)
    need, level = _load_at(crashed), crashed.crash_level
    return level is not None and any(
        s.crash_phase is None and keeps_crash(search, s.params, crashed)
        and any(load >= level and served >= need for load, served in s.levels.items()) for s in seen)


def suspects(crashed: Seen, seen: list[Seen]) -> dict[str, Any]:
    """The crashed config's values no started config had. Where some of them are choices (a backend, a runner, a
    dtype, a switch: strings and booleans), only those: a crash the catalog cannot explain is a missing kernel or an
    unsupported combination, not a number (numbers crash with OOMs and timeouts, which the catalog repairs). Where
    the exception names some of those choices ("flashinfer_cutlass MoE runner ... requires SM90"), only those: a
    config that ran a new runner and a new attention backend at once crashed for the one its message names."""
    started = [s.params for s in seen if s.crash_phase != "startup"]
    new = {k: v for k, v in crashed.params.items() if all(p.get(k) != v for p in started)}
    choices = {k: v for k, v in new.items() if isinstance(v, (str, bool))}
    named = {k: v for k, v in choices.items() if isinstance(v, str) and named_in(v, crashed.exception)}
    return named or choices or new


def named_in(value: str, text: str) -> bool:
    """`value` appears in `text` as a whole name (not inside a longer one: flashinfer is not in flashinfer_cutlass)."""
    return bool(value) and re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text) is not None


def memory_ceiling(search: SearchSpec, params: dict[str, Any], seen: list[Seen],
                   fp: Footprint | None = None) -> Seen | None:
    """The proposal's mem fraction is at or above two startup crashes whose repairs lower it (OOMs), and no config
    at or above it that needed as much memory has ever started (one that started with graphs off or to 32 says
    nothing about graphs to 256 at the same fraction): the last such crash."""
    mine = knob_value(search, params, MEM_FRACTION)
    if not isinstance(mine, (int, float)):
        return None
    ooms = []
    for s in seen:
        theirs = knob_value(search, s.params, MEM_FRACTION)
        if not isinstance(theirs, (int, float)):
            continue
        if s.crash_phase != "startup" and theirs >= mine - 1e-9 and as_demanding(search, s.params, params, fp):
            return None                 # a config this high, needing as much memory, started: no ceiling here
        if s.crash_phase == "startup" and theirs <= mine + 1e-9 and (MEM_FRACTION, LOWER) in s.fixes:
            ooms.append(s)
    return ooms[-1] if len(ooms) >= 2 else None


def predicted_crash(search: SearchSpec, params: dict[str, Any], seen: list[Seen],
                    fp: Footprint | None = None) -> Seen | None:
    """The finished crash this proposal would repeat, if a rule says so (`fp`: the study's footprint, where its
    logs give one)."""
    hit = memory_ceiling(search, params, seen, fp)
    if hit is not None:
        return hit
    for crashed in seen:
        if crashed.crash_phase is None:
            continue
        if keeps_crash(search, params, crashed, fp) and not _refuted(search, crashed, seen, params, fp):
            return crashed
        if crashed.crash_phase == "startup" and not crashed.fixes:    # the catalog explains the others
            sus = suspects(crashed, seen)
            if sus and all(params.get(k) == v for k, v in sus.items()):
                return crashed
    return None
