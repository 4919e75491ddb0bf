"""Repair steps: a config that crashed with a classified signature, changed by the crash catalog's repairs.

The catalog (tunectl/crashes/catalog.py) gives each signature its workarounds as `(target, change)`: the target is an
SGLang flag without dashes, an environment variable or `patch:<id>`; the change a value to set or a direction
(`LOWER`/`RAISE`: the knob's next grid value that way). The search gets them through `Hooks.repairs` (it never
imports the runners) and keeps the ones its space can express: a repair on a flag that is not a knob, or to a
value outside the knob's range, is dropped. A config that was fast up to a load crash (e.g. 1,950 tok/s at 256,
then page_table_1_flattened at 512) is one flag away from a fast stable config more often than any random
neighbour is.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunectl import knobs
from tunectl.flags import bundled_flags
from tunectl.models import LOWER, RAISE
from tunectl.profile import ParamSpec, SearchSpec
from tunectl.search.space import GRID_POINTS, grid_space, is_active, knob_order
from tunectl.versions import ANY, FlagGone, bundled_versions, deprecations, translate

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


_TRIED = re.compile(r"Tried to allocate ([\d.]+) (MiB|GiB)")
_TOTAL = re.compile(r"total capacity of ([\d.]+) GiB")
_FREE = re.compile(r"of which ([\d.]+) (MiB|GiB) is free")


def _gib(m: re.Match[str] | None) -> float:
    return 0.0 if m is None else float(m.group(1)) / (1024.0 if m.group(2) == "MiB" else 1.0)


def oom_sizes(exception: str) -> tuple[float, float, float] | None:
    """(GiB the failed allocation asked for, GiB free then, GiB the GPU has) from a CUDA OOM message, else None."""
    tried, total = _TRIED.search(exception), _TOTAL.search(exception)
    if not tried or not total:
        return None
    return _gib(tried), _gib(_FREE.search(exception)), float(total.group(1))


def oom_bounds(exception: str, params: dict[str, Any], search: SearchSpec, share: float = 0.0) -> dict[str, float]:
    """A startup CUDA OOM says how much memory was missing and how big the GPU is: the static pool must shrink
    by at least that share, so `mem-fraction-static <lower>` goes that far at once. `share`: how much more of the
    GPU `params` take than the crashed config did (`Footprint`), to shrink by as well."""
    sizes = oom_sizes(exception)
    return {} if sizes is None else mem_fraction_bound(search, params, sizes[0] / sizes[2] + max(0.0, share))


def oom_veto_bounds(exception: str, params: dict[str, Any], search: SearchSpec) -> dict[str, float]:
    """The same for the vetoes, which must not ban a config that would start: only the memory surely missing, the
    failed allocation less what was free then (more allocations may have followed it: the need can be larger,
    never smaller)."""
    sizes = oom_sizes(exception)
    return {} if sizes is None else mem_fraction_bound(search, params, max(0.0, sizes[0] - sizes[1]) / sizes[2])


def mem_fraction_bound(search: SearchSpec, params: dict[str, Any], share: float) -> dict[str, float]:
    """The mem fraction at or below which a startup OOM that missed `share` of the GPU may start."""
    value = knob_value(search, params, MEM_FRACTION)
    return {MEM_FRACTION: float(value) - share} if isinstance(value, (int, float)) else {}


def pool_bounds(facts: dict[str, float], tokens_per_request: int) -> dict[str, float]:
    """The KV pool (`max_total_num_tokens` in the server's log) holds this many requests of the workload's
    lengths: more running requests than that are retracted and prefilled again."""
    pool = facts.get("max_total_num_tokens")
    return {MAX_RUNNING: pool / max(1, tokens_per_request)} if pool else {}


MEM_FRACTION, MAX_RUNNING = "mem-fraction-static", "max-running-requests"
GRAPH_MAX_BS, NO_GRAPHS = "cuda-graph-max-bs", "disable-cuda-graph"
KV_DTYPE = "kv-cache-dtype"
CHUNK = "chunked-prefill-size"
# the ordered knobs that size a server's memory at startup: the static pool, the graphs, the prefill activations
# and the autotune dummy run (its batch is the request pool's size)
MEMORY_TARGETS = (MEM_FRACTION, GRAPH_MAX_BS, CHUNK, MAX_RUNNING)


def knob_value(search: SearchSpec, params: dict[str, Any], target: str) -> Any:
    """The value `params` give the knob that drives `target` (None: no such knob, or it is not active)."""
    return next((as_target(name, spec, target, params[name]) for name, spec in search.space.items()
                 if name in params and drives(name, spec, target)), None)


def log_hints(search: SearchSpec, params: dict[str, Any], flags: dict[str, Any], facts: dict[str, float],
              tokens_per_request: int) -> list[tuple[list[tuple[str, Any]], dict[str, float]]]:
    """Changes a served config's own log asks for, as (repairs, bounds) like a crash's (soft evidence, no crash):
    - decode batches above the captured CUDA graph sizes ran without graphs (`cuda graph: False` at a batch larger
      than `cuda-graph-max-bs`, graphs on): raise the graph max bs to cover the largest such batch;
    - graphs off (`disable-cuda-graph`, or 0.5.17's `cuda-graph-backend-decode: disabled` knob, a `stand_ins`):
      switch them on, with a graph max bs that covers the largest batch logged (not the knob's baseline, which
      `complete` would give a newly active knob);
    - the running batch stood at `max_running_requests` with requests queued and no retraction (admission held
      them, not the KV pool): raise max-running-requests to running + queued, at most what the pool holds;
    - the running batch stood below that cap with requests queued and the KV pool full (the pool held them): an
      FP8 KV cache (half the bytes per token, so twice the requests) where the space has one and the config runs
      another, then a higher memory fraction (one grid step; the vetoes know where startup OOMs were)."""
    out: list[tuple[list[tuple[str, Any]], dict[str, float]]] = []
    missed, graph_bs = facts.get("decode_bs_nograph_max", 0), knob_value(search, params, GRAPH_MAX_BS)
    if not flags.get(NO_GRAPHS) and isinstance(graph_bs, int) and missed > graph_bs:
        out.append(([(GRAPH_MAX_BS, RAISE)], {GRAPH_MAX_BS: missed}))
    if knob_value(search, params, NO_GRAPHS) is True and missed:
        out.append(([(NO_GRAPHS, False)], {GRAPH_MAX_BS: missed}))
    queued, cap = facts.get("decode_queue_at_cap", 0), facts.get("max_running_requests")
    running = knob_value(search, params, MAX_RUNNING)
    if queued and cap and isinstance(running, int) and cap >= running and not facts.get("retracted_reqs"):
        want = cap + queued
        pool = pool_bounds(facts, tokens_per_request).get(MAX_RUNNING)
        if pool is None or pool > running:
            out.append(([(MAX_RUNNING, RAISE)], {MAX_RUNNING: min(want, pool) if pool else want}))
    if facts.get("decode_queue_pool_full"):
        out.append(([*pool_relief(search, params, facts), (MEM_FRACTION, RAISE)], {}))
    return out


def graph_memory(facts: Sequence[dict[str, float]]) -> Callable[[int], float] | None:
    """GiB the decode CUDA graphs up to a max bs take, from the servers' logs (`graph_mem_gb` at `graph_bs_max`):
    a line through the sizes seen at two or more max bs, else in proportion to the one seen (an overestimate where
    part of the memory is fixed). None before any capture was logged."""
    seen: dict[int, float] = {}
    for f in facts:
        bs, gb = f.get("graph_bs_max"), f.get("graph_mem_gb")
        if bs and gb is not None:
            seen[int(bs)] = max(seen.get(int(bs), 0.0), float(gb))
    if not seen:
        return None
    if len(seen) == 1:
        (b0, g0), = seen.items()
        return lambda b: g0 * b / b0
    xs, ys = list(seen), list(seen.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs))
    return lambda b: max(0.0, my + slope * (b - mx))


@dataclass(frozen=True)
class Footprint:
    """GB per GPU a config's static pool (mem fraction x the GPU's memory) and decode CUDA graphs (`graph_gb` at
    its max bs) take, as the servers' logs size them: what a startup OOM weighs configs by. Two configs that trade
    a lower mem fraction for larger graphs (0.88 with graphs to 512 against 0.91 with graphs to 256) compare by
    the memory they leave, not knob by knob."""

    total_gb: float
    graph_gb: Callable[[int], float]

    def of(self, search: SearchSpec, params: dict[str, Any]) -> float | None:
        """None where the config has no mem fraction knob or runs without graphs (no graph size to add)."""
        mem, bs = knob_value(search, params, MEM_FRACTION), knob_value(search, params, GRAPH_MAX_BS)
        if not numeric([mem]) or not numeric([bs]) or knob_value(search, params, NO_GRAPHS) is True:
            return None
        return float(mem) * self.total_gb + self.graph_gb(int(bs))

    def excess(self, search: SearchSpec, params: dict[str, Any], other: dict[str, Any]) -> float:
        """How much more of the GPU (a share) `params` take than `other` does; 0 where either is unknown."""
        mine, theirs = self.of(search, params), self.of(search, other)
        return 0.0 if mine is None or theirs is None else (mine - theirs) / self.total_gb


def footprint(facts: Sequence[dict[str, float]]) -> Footprint | None:
    """The footprint the logs give (None before a capture and the GPU's memory were logged)."""
    graph = graph_memory(facts)
    total = max((f["gpu_mem_gb"] for f in facts if f.get("gpu_mem_gb")), default=None)
    return None if graph is None or total is None else Footprint(float(total), graph)


def graph_room(search: SearchSpec, cand: dict[str, Any], params: dict[str, Any], facts: dict[str, float],
               graph_gb: Callable[[int], float] | None, floor_gb: float | None) -> dict[str, Any]:
    """`cand`, a change of the served config `params` whose log gave `facts`, with the mem fraction lowered (to a
    grid value) so that the CUDA graphs it captures leave at least `floor_gb` free after startup, the least any
    served config was left with: graphs switched on or a larger max bs need memory the static pool has to give up
    (SGLang's tuning guide: graphs for large batches cost memory, lower mem-fraction-static). As it is where its
    graphs need no more memory than the served config's did, where the log, the graph sizes or the floor are
    unknown, or where no grid value is low enough."""
    total, free = facts.get("gpu_mem_gb"), facts.get("available_gpu_mem_gb")
    bs, was, now = (knob_value(search, cand, GRAPH_MAX_BS), knob_value(search, params, MEM_FRACTION),
                    knob_value(search, cand, MEM_FRACTION))
    if (graph_gb is None or floor_gb is None or not total or free is None or knob_value(search, cand, NO_GRAPHS)
            or not isinstance(bs, int) or not numeric((was, now))):
        return cand
    more = graph_gb(bs) - facts.get("graph_mem_gb", 0.0)
    left = free - more - (now - was) * total
    if more <= 0 or left >= floor_gb:
        return cand
    bound = now - (floor_gb - left) / total
    grid = grid_space(search, points=GRID_POINTS)
    for name, spec in search.space.items():
        if name in cand and drives(name, spec, MEM_FRACTION) and numeric(grid[name]):
            lower = [v for v in grid[name] if v <= bound]
            return {**cand, name: max(lower)} if lower else cand
    return cand


def pool_relief(search: SearchSpec, params: dict[str, Any],
                facts: dict[str, float] | None = None) -> list[tuple[str, Any]]:
    """A KV pool that holds the batch back: an FP8 KV cache (half the bytes per token, twice the requests), where
    the space has an FP8 choice (fp8_e4m3, fp8_e5m2) and the config runs another; not where the server's log says
    its pool is 8-bit already (`kv_cache_bits`: `auto` resolves to FP8 for some checkpoints and GPUs)."""
    if (facts or {}).get("kv_cache_bits", 16) <= 8:
        return []
    kv = knob_value(search, params, KV_DTYPE)
    fp8 = next((c for name, spec in search.space.items() if drives(name, spec, KV_DTYPE)
                for c in spec.choices or () if isinstance(c, str) and c.startswith("fp8")), None)
    return [(KV_DTYPE, fp8)] if fp8 is not None and isinstance(kv, str) and not kv.startswith("fp8") else []


def lookup(repairs: RepairLookup | None, signature: str | None, text: str = "") -> Sequence[tuple[str, Any]]:
    if repairs is None or not signature:
        return ()
    return repairs(signature, text)
