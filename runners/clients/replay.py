"""Prompts for a `kind: trace` workload (tunectl.traces): the trace's lengths and timing, token ids made up.

Each Mooncake hash id is a block of `HASH_BLOCK` token ids drawn from a generator seeded by the workload seed and
the hash id, so requests naming the same hash id send the same tokens there (a prefix a radix cache hits) and
a rerun sends the same prompts. A prompt is its blocks in order, cut to `input_length`; tokens beyond its blocks
(or all of them: an Azure trace has no hash ids) are the request's own.
"""
from __future__ import annotations

import random
from functools import lru_cache

from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.prompts import Prompt, _ids
from tunectl.traces import HASH_BLOCK, TraceRequest, load_trace


@lru_cache(maxsize=4096)
def _block(seed: int, hash_id: int, vocab: int | None) -> tuple[int, ...]:
    return tuple(_ids(random.Random(f"{seed}:hash:{hash_id}"), HASH_BLOCK, vocab))


def trace_prompt(req: TraceRequest, index: int, seed: int, vocab: int | None = None) -> Prompt:
    ids: list[int] = []
    for h in req.hash_ids:
        if len(ids) >= req.input_len:
            break
        ids.extend(_block(seed, h, vocab))
    ids = ids[:req.input_len]
    if len(ids) < req.input_len:
        ids.extend(_ids(random.Random(f"{seed}:trace:{index}"), req.input_len - len(ids), vocab))
    return Prompt(ids, req.output_len)


def trace_schedule(workload: WorkloadSpec) -> list[tuple[float, Prompt]]:
    """(offset in modeled seconds at the workload's speed-up, prompt) for every request of the trace."""
    trace = load_trace(workload.path or "")
    return [(r.t_s / workload.speedup, trace_prompt(r, i, workload.seed, workload.vocab_size))
            for i, r in enumerate(trace.requests)]
