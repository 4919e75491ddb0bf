"""Repair steps: a config that crashed with a classified signature, changed by the crash catalog's repairs.

The catalog (tunectl/sglang/crashes/catalog.py) gives each signature its workarounds as `(target, change)`: the target is an
SGLang flag without dashes, an environment variable or `patch:<id>`; the change a value to set or a direction
(`LOWER`/`RAISE`: the knob's next grid value that way). The search gets them through `Hooks.repairs` (it never
imports the runners) and keeps the ones its space can express: a repair on a flag that is not a knob, or to a
value outside the knob's range, is dropped. A config that was fast up to a load crash (e.g. 1,950 tok/s at 256,
then page_table_1_flattened at 512) is one flag away from a fast stable config more often than any random
neighbour is.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunectl import knobs
from tunectl.models import LOWER, RAISE
from tunectl.profile import ParamSpec, SearchSpec
from tunectl.search.space import GRID_POINTS, grid_space, is_active, knob_order
from tunectl.sglang import memory
from tunectl.sglang.flags import bundled_flags
from tunectl.sglang.memory import (  # noqa: F401  (the flags the search's rules name, from the physics' room)
    CHUNK,
    GRAPH_MAX_BS,
    KV_DTYPE,
    MAX_RUNNING,
    MEM_FRACTION,
    MEMORY_TARGETS,
    NO_GRAPHS,
    graph_memory,
    pool_bounds,
)
from tunectl.sglang.versions import ANY, FlagGone, bundled_versions, deprecations, translate

RepairLookup = Callable[[str, str], Sequence[tuple[str, Any]]]   # (signature, exception line) -> repairs


@functools.lru_cache(maxsize=256)
def spellings(flag: str) -> frozenset[str]:
    """A flag's names across the bundled SGLang versions where only the name changed: the search's own targets
    (graph max bs, mem fraction, ...) are spelled as 0.5.9 spells them, a knob as its profile's version does
    (`cuda-graph-max-bs` is 0.5.17's deprecated alias of `cuda-graph-max-bs-decode` and gone in 0.5.23). Not a
    flag a deprecation replaces by others with set values (`disable-cuda-graph`: its `stand_ins`)."""
    out = {flag}
    for src in bundled_versions():
        for dst in bundled_versions():
            try:
                moved = translate(flag, ANY, src, dst).flags
            except (FlagGone, KeyError, ValueError):
                continue
            if len(moved) == 1 and set(moved.values()) == {ANY}:
                out |= set(moved)
    return frozenset(out)


@functools.lru_cache(maxsize=256)
def stand_ins(flag: str) -> dict[str, Any]:
    """The flags a deprecation replaces switch `flag` by in the bundled versions, each with the value that stands
    for `flag` on: 0.5.17 and 0.5.23 turn graphs off with `cuda-graph-backend-{decode,prefill}: disabled`, their
    `disable-cuda-graph` is a deprecated alias for both (the crash repairs are resolved the same way)."""
    out: dict[str, Any] = {}
    for version in bundled_versions():
        spec, dep = bundled_flags(version).get(flag), deprecations(version).get(flag)
        if spec is not None and dep is not None and not spec.takes_value:
            out.update((n, v) for n, v in dep.replaced_by if v is not None)
    return out


def _stand_in(name: str, spec: ParamSpec, target: str) -> str | None:
    own = knobs.target(name, spec)
    key = own.key.replace("_", "-")
    return key if own.kind == "flag" and key in stand_ins(target.replace("_", "-")) else None


def drives(name: str, spec: ParamSpec, target: str) -> bool:
    """Does knob `name` set the repair's target (flag, under any of its `spellings` or `stand_ins`; env variable or
    patch)?"""
    own = knobs.target(name, spec)
    if own.kind == "flag":
        return own.key.replace("_", "-") in spellings(target.replace("_", "-")) or bool(_stand_in(name, spec, target))
    return own.key == target


def as_target(name: str, spec: ParamSpec, target: str, value: Any) -> Any:
    """Knob `name`'s value as the target's: a stand-in's value says whether the switch is on (`disabled` -> True)."""
    key = _stand_in(name, spec, target)
    return value if key is None or value is None else value == stand_ins(target.replace("_", "-"))[key]


def knob_change(name: str, spec: ParamSpec, target: str, change: Any) -> Any:
    """The repair's change as knob `name` takes it: on a stand-in, the switch set is its value (`disabled`), the
    switch unset the knob's default or first other choice (`full`), a direction nothing (None)."""
    key = _stand_in(name, spec, target)
    if key is None:
        return change
    off = stand_ins(target.replace("_", "-"))[key]       # the value that stands for the switch set (graphs off)
    if change is True:
        return off
    others = [c for c in [spec.default, *(spec.choices or ())] if c is not None and c != off]
    return others[0] if change is False and others else None


def _allowed(spec: ParamSpec, values: list[Any], value: Any) -> bool:
    if spec.type == "bool":
        return isinstance(value, bool)
    if spec.choices is not None:
        return value in spec.choices
    if spec.type in ("int", "float") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return spec.low is not None and spec.high is not None and spec.low <= value <= spec.high
    return value in values


def numeric(values: Sequence[Any]) -> bool:
    """An ordered grid: numbers only (bools are not)."""
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def repaired_value(spec: ParamSpec, values: list[Any], current: Any, change: Any, bound: float | None = None) -> Any:
    """The knob's value after the change, or None when the change does not apply (same value, out of range).
    `bound`: how far the direction must go at least (read from the server), else one grid step."""
    if change in (LOWER, RAISE):
        if current is None or spec.type == "bool" or spec.type == "categorical" and spec.choices is not None \
                and not numeric(values):
            return None
        ordered = sorted(values)
        way = [v for v in ordered if v < current] if change == LOWER else [v for v in ordered if v > current]
        if bound is not None:
            far = [v for v in way if (v <= bound if change == LOWER else v >= bound)]
            way = far or (way[:1] if change == LOWER else way[-1:])     # short of the bound: go all the way
        return (way[-1] if change == LOWER else way[0]) if way else None
    if change == current or not _allowed(spec, values, change):
        return None
    return change


def repair_moves(search: SearchSpec, params: dict[str, Any], repairs: Sequence[tuple[str, Any]],
                 bounds: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One change per repair the space can express, in the catalog's order: {knob: new value}."""
    grid = grid_space(search, points=GRID_POINTS)
    moves: list[dict[str, Any]] = []
    for target, change in repairs:
        for name in knob_order(search.space):
            spec = search.space[name]
            if not drives(name, spec, target) or not is_active(spec, params):
                continue
            value = repaired_value(spec, grid[name], params.get(name), knob_change(name, spec, target, change),
                                   (bounds or {}).get(target))
            if value is not None and {name: value} not in moves:
                moves.append({name: value})
    return moves


def repaired_configs(search: SearchSpec, params: dict[str, Any], repairs: Sequence[tuple[str, Any]],
                     complete: Callable[[dict[str, Any]], dict[str, Any]],
                     bounds: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The config with each repair applied (knobs that become active are drawn by `complete`, except one whose
    target has a bound: it takes the first grid value that reaches it, e.g. graphs switched on with a max bs that
    covers the batch the log showed)."""
    grid = grid_space(search, points=GRID_POINTS) if bounds else {}
    out = []
    for move in repair_moves(search, params, repairs, bounds):
        cand = complete({**params, **move})
        for name in [n for n in knob_order(search.space) if n not in params and n not in move]:
            spec = search.space[name]              # newly active: `complete` may have drawn no value for it
            bound = next((b for t, b in (bounds or {}).items() if drives(name, spec, t)), None)
            if is_active(spec, cand) and bound is not None and numeric(grid[name]):
                values = sorted(grid[name])
                cand[name] = next((v for v in values if v >= bound), values[-1])
        out.append(cand)
    return out


def knob_value(search: SearchSpec, params: dict[str, Any], target: str) -> Any:
    """The value `params` give the knob that drives `target` (None: no such knob, or it is not active)."""
    return next((as_target(name, spec, target, params[name]) for name, spec in search.space.items()
                 if name in params and drives(name, spec, target)), None)


def view(search: SearchSpec, params: dict[str, Any]) -> dict[str, Any]:
    """`params` as SGLang's memory physics reads a config (tunectl/sglang/memory.py): the value of each flag it
    weighs, through the knobs that drive it."""
    return {target: knob_value(search, params, target) for target in memory.TARGETS}


def fp8_choice(search: SearchSpec) -> str | None:
    """The space's FP8 KV cache choice (fp8_e4m3, fp8_e5m2), if it has one."""
    return next((c for name, spec in search.space.items() if drives(name, spec, KV_DTYPE)
                 for c in spec.choices or () if isinstance(c, str) and c.startswith("fp8")), None)


def oom_bounds(exception: str, params: dict[str, Any], search: SearchSpec, share: float = 0.0) -> dict[str, float]:
    """A startup CUDA OOM says how much memory was missing and how big the GPU is: the static pool must shrink
    by at least that share, so `mem-fraction-static <lower>` goes that far at once. `share`: how much more of the
    GPU `params` take than the crashed config did (`Footprint`), to shrink by as well."""
    missing = memory.oom_missing(exception)
    return {} if missing is None else memory.mem_fraction_bound(view(search, params), missing + max(0.0, share))


def oom_veto_bounds(exception: str, params: dict[str, Any], search: SearchSpec) -> dict[str, float]:
    """The same for the vetoes, which must not ban a config that would start: only the memory surely missing."""
    missing = memory.oom_surely_missing(exception)
    return {} if missing is None else memory.mem_fraction_bound(view(search, params), missing)


def log_hints(search: SearchSpec, params: dict[str, Any], flags: dict[str, Any], facts: dict[str, float],
              tokens_per_request: int) -> list[memory.Hint]:
    """The changes a served config's own log asks for (tunectl/sglang/memory.py `log_hints`), for `params`."""
    return memory.log_hints(view(search, params), flags, facts, tokens_per_request, fp8_choice(search))


@dataclass(frozen=True)
class Footprint:
    """The study's memory footprint (tunectl/sglang/memory.py `Footprint`) read through the space's knobs."""

    physics: memory.Footprint

    @property
    def total_gb(self) -> float:
        return self.physics.total_gb

    @property
    def graph_gb(self) -> Callable[[int], float]:
        return self.physics.graph_gb

    def of(self, search: SearchSpec, params: dict[str, Any]) -> float | None:
        return self.physics.of(view(search, params))

    def excess(self, search: SearchSpec, params: dict[str, Any], other: dict[str, Any]) -> float:
        return self.physics.excess(view(search, params), view(search, other))


def footprint(facts: Sequence[dict[str, float]]) -> Footprint | None:
    """The footprint the logs give (None before a capture and the GPU's memory were logged)."""
    fp = memory.footprint(facts)
    return None if fp is None else Footprint(fp)


def graph_room(search: SearchSpec, cand: dict[str, Any], params: dict[str, Any], facts: dict[str, float],
               graph_gb: Callable[[int], float] | None, floor_gb: float | None) -> dict[str, Any]:
    """`cand`, a change of the served config `params` whose log gave `facts`, with the mem fraction lowered to the
    highest grid value at or below `memory.graph_room_bound` (its graphs leave at least `floor_gb` free); as it is
    where no bound applies or no grid value is low enough."""
    bound = memory.graph_room_bound(view(search, params), view(search, cand), facts, graph_gb, floor_gb)
    if bound is None:
        return cand
    grid = grid_space(search, points=GRID_POINTS)
    for name, spec in search.space.items():
        if name in cand and drives(name, spec, MEM_FRACTION) and numeric(grid[name]):
            lower = [v for v in grid[name] if v <= bound]
            return {**cand, name: max(lower)} if lower else cand
    return cand


def pool_relief(search: SearchSpec, params: dict[str, Any],
                facts: dict[str, float] | None = None) -> list[tuple[str, Any]]:
    """An FP8 KV cache for a pool that holds the batch back (tunectl/sglang/memory.py `kv_relief`)."""
    return memory.kv_relief(view(search, params), fp8_choice(search), facts)


def lookup(repairs: RepairLookup | None, signature: str | None, text: str = "") -> Sequence[tuple[str, Any]]:
    if repairs is None or not signature:
        return ()
    return repairs(signature, text)
