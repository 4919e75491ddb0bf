"""SGLang's memory as its logs and its OOM messages show it, and the changes a served config's log asks for.

Everything here speaks in SGLang flags (`mem-fraction-static`, `cuda-graph-max-bs`, ...), never in the search's
knobs: a config enters as a `view`, the value each flag of `TARGETS` takes in it (None where no knob sets it), and
the search (tunectl/search/repair.py) maps its knobs to that view and the results back to knobs. The log facts come
from the classifier (tunectl/sglang/crashes/classifier.py `LOG_FACTS`), read from the server's own log lines;
each rule below names the facts it reads, and tests/sglang/test_memory.py checks them on real SGLang logs.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunectl.models import RAISE

MEM_FRACTION, MAX_RUNNING = "mem-fraction-static", "max-running-requests"
GRAPH_MAX_BS, NO_GRAPHS = "cuda-graph-max-bs", "disable-cuda-graph"
KV_DTYPE = "kv-cache-dtype"
CHUNK = "chunked-prefill-size"
# the ordered flags that size a server's memory at startup: the static pool, the graphs, the prefill activations
# and the autotune dummy run (its batch is the request pool's size)
MEMORY_TARGETS = (MEM_FRACTION, GRAPH_MAX_BS, CHUNK, MAX_RUNNING)
# the flags a config's `view` gives
TARGETS = (*MEMORY_TARGETS, NO_GRAPHS, KV_DTYPE)

# the log facts that tell the value SGLang chose for a flag a launch left out (its own default for the model and GPU):
# `max_running_requests=` and `chunked_prefill_size=` on the pool line, the largest decode graph captured
RESOLVED_BY = {MAX_RUNNING: "max_running_requests", CHUNK: "chunked_prefill_size", GRAPH_MAX_BS: "graph_bs_max"}

Hint = tuple[list[tuple[str, Any]], dict[str, float]]     # (changes as (flag, value or LOWER/RAISE), bounds)

_TRIED = re.compile(r"Tried to allocate ([\d.]+) (MiB|GiB)")
_TOTAL = re.compile(r"total capacity of ([\d.]+) GiB")
_FREE = re.compile(r"of which ([\d.]+) (MiB|GiB) is free")


def _gib(m: re.Match[str] | None) -> float:
    return 0.0 if m is None else float(m.group(1)) / (1024.0 if m.group(2) == "MiB" else 1.0)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def oom_sizes(exception: str) -> tuple[float, float, float] | None:
    """(GiB the failed allocation asked for, GiB free then, GiB the GPU has) from a CUDA OOM message, else None."""
    tried, total = _TRIED.search(exception), _TOTAL.search(exception)
    if not tried or not total:
        return None
    return _gib(tried), _gib(_FREE.search(exception)), float(total.group(1))


def oom_missing(exception: str) -> float | None:
    """The share of the GPU a startup OOM asked for and did not get: the static pool must shrink by at least
    that much for the config to start (None: the message does not say)."""
    sizes = oom_sizes(exception)
    return None if sizes is None else sizes[0] / sizes[2]


def oom_surely_missing(exception: str) -> float | None:
    """The share surely missing: the failed allocation less what was free then (more allocations may have
    followed it: the need can be larger, never smaller). What a veto may rely on."""
    sizes = oom_sizes(exception)
    return None if sizes is None else max(0.0, sizes[0] - sizes[1]) / sizes[2]


def mem_fraction_bound(view: Mapping[str, Any], share: float) -> dict[str, float]:
    """The mem fraction at or below which a startup OOM that missed `share` of the GPU may start."""
    value = view.get(MEM_FRACTION)
    return {MEM_FRACTION: float(value) - share} if _number(value) else {}


def pool_bounds(facts: Mapping[str, float], tokens_per_request: int) -> dict[str, float]:
    """The KV pool (`max_total_num_tokens` in the server's log) holds this many requests of the workload's
    lengths: more running requests than that are retracted and prefilled again."""
    pool = facts.get("max_total_num_tokens")
    return {MAX_RUNNING: pool / max(1, tokens_per_request)} if pool else {}


def graph_memory(facts: Sequence[Mapping[str, float]]) -> Callable[[int], float] | None:
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
    the memory they leave, not flag by flag."""

    total_gb: float
    graph_gb: Callable[[int], float]

    def of(self, view: Mapping[str, Any]) -> float | None:
        """None where the config sets no mem fraction or runs without graphs (no graph size to add)."""
        mem, bs = view.get(MEM_FRACTION), view.get(GRAPH_MAX_BS)
        if not _number(mem) or not _number(bs) or view.get(NO_GRAPHS) is True:
            return None
        return float(mem) * self.total_gb + self.graph_gb(int(bs))

    def excess(self, view: Mapping[str, Any], other: Mapping[str, Any]) -> float:
        """How much more of the GPU (a share) `view` takes than `other` does; 0 where either is unknown."""
        mine, theirs = self.of(view), self.of(other)
        return 0.0 if mine is None or theirs is None else (mine - theirs) / self.total_gb


def footprint(facts: Sequence[Mapping[str, float]]) -> Footprint | None:
    """The footprint the logs give (None before a capture and the GPU's memory were logged)."""
    graph = graph_memory(facts)
    total = max((f["gpu_mem_gb"] for f in facts if f.get("gpu_mem_gb")), default=None)
    return None if graph is None or total is None else Footprint(float(total), graph)


def graph_room_bound(served: Mapping[str, Any], cand: Mapping[str, Any], facts: Mapping[str, float],
                     graph_gb: Callable[[int], float] | None, floor_gb: float | None) -> float | None:
    """The mem fraction at or below which `cand`, a change of the served config `served` whose log gave `facts`,
    leaves at least `floor_gb` free after startup, the least any served config was left with: graphs switched on
    or a larger max bs need memory the static pool has to give up (SGLang's tuning guide: graphs for large batches
    cost memory, lower mem-fraction-static). None where its graphs need no more memory than the served config's
    did, or where the log, the graph sizes or the floor are unknown."""
    total, free = facts.get("gpu_mem_gb"), facts.get("available_gpu_mem_gb")
    bs, was, now = cand.get(GRAPH_MAX_BS), served.get(MEM_FRACTION), cand.get(MEM_FRACTION)
    if (graph_gb is None or floor_gb is None or not total or free is None or cand.get(NO_GRAPHS)
            or not isinstance(bs, int) or not (_number(was) and _number(now))):
        return None
    more = graph_gb(bs) - facts.get("graph_mem_gb", 0.0)
    left = free - more - (now - was) * total
    if more <= 0 or left >= floor_gb:
        return None
    return now - (floor_gb - left) / total


def kv_relief(view: Mapping[str, Any], fp8: str | None, facts: Mapping[str, float] | None = None
              ) -> list[tuple[str, Any]]:
    """A KV pool that holds the batch back: an FP8 KV cache (half the bytes per token, twice the requests), `fp8`
    being the FP8 choice the config could take (fp8_e4m3, fp8_e5m2), where the config runs another; not where the
    server's log says its pool is 8-bit already (`kv_cache_bits`: `auto` resolves to FP8 for some checkpoints and
    GPUs)."""
    if (facts or {}).get("kv_cache_bits", 16) <= 8:
        return []
    kv = view.get(KV_DTYPE)
    return [(KV_DTYPE, fp8)] if fp8 is not None and isinstance(kv, str) and not kv.startswith("fp8") else []


def log_hints(view: Mapping[str, Any], flags: Mapping[str, Any], facts: Mapping[str, float], tokens_per_request: int,
              fp8: str | None) -> list[Hint]:
    """Changes a served config's own log asks for, as (changes, bounds) like a crash's (soft evidence, no crash).
    `view`: the config's values of `TARGETS`; `flags`: every flag it launched with; `fp8`: the FP8 KV choice it
    could take.
    - decode batches above the captured CUDA graph sizes ran without graphs (`decode_bs_nograph_max`: `cuda graph:
      False` at a batch larger than `cuda-graph-max-bs`, graphs on): raise the graph max bs to cover the largest
      such batch;
    - graphs off (`disable-cuda-graph`, or 0.5.17's `cuda-graph-backend-decode: disabled`, which the view gives as
      `disable-cuda-graph`): switch them on, with a graph max bs that covers the largest batch logged (not the
      knob's baseline, which `complete` would give a newly active knob);
    - the running batch stood at `max_running_requests` with requests queued and no retraction
      (`decode_queue_at_cap`, `retracted_reqs`: admission held them, not the KV pool): raise max-running-requests to
      running + queued, at most what the pool holds (`max_total_num_tokens`);
    - the running batch stood below that cap with requests queued and the KV pool full (`decode_queue_pool_full`:
      the pool held them): an FP8 KV cache where the config runs another, then a higher memory fraction (one grid
      step; the vetoes know where startup OOMs were)."""
    out: list[Hint] = []
    missed, graph_bs = facts.get("decode_bs_nograph_max", 0), view.get(GRAPH_MAX_BS)
    if not flags.get(NO_GRAPHS) and isinstance(graph_bs, int) and missed > graph_bs:
        out.append(([(GRAPH_MAX_BS, RAISE)], {GRAPH_MAX_BS: missed}))
    if view.get(NO_GRAPHS) is True and missed:
        out.append(([(NO_GRAPHS, False)], {GRAPH_MAX_BS: missed}))
    queued, cap = facts.get("decode_queue_at_cap", 0), facts.get("max_running_requests")
    running = view.get(MAX_RUNNING)
    if queued and cap and isinstance(running, int) and cap >= running and not facts.get("retracted_reqs"):
        want = cap + queued
        pool = pool_bounds(facts, tokens_per_request).get(MAX_RUNNING)
        if pool is None or pool > running:
            out.append(([(MAX_RUNNING, RAISE)], {MAX_RUNNING: min(want, pool) if pool else want}))
    if facts.get("decode_queue_pool_full"):
        out.append(([*kv_relief(view, fp8, facts), (MEM_FRACTION, RAISE)], {}))
    return out


def resolved(facts: Mapping[str, float]) -> dict[str, int]:
    """The flags of `RESOLVED_BY` whose value SGLang logged, as it chose it: {flag: value}."""
    return {flag: int(facts[key]) for flag, key in RESOLVED_BY.items() if _number(facts.get(key)) and facts[key] > 0}
