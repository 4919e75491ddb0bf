"""Split one level over worker processes: each runs its own event loop on a share of the streams.

Workers are spawned (not forked: the caller has threads), wait on a barrier so they start together, and send
back their `ShareResult`; times are `perf_counter` (CLOCK_MONOTONIC, common to all processes), so the parent
merges records directly. The parent turns `abort` into a shared event the workers poll, and a worker that dies
counts its requests as failed.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from typing import Any

from tunectl.runners._bench_client import ShareResult, run_share
from tunectl.runners._bench_workload import Prompt

_CTX = mp.get_context("spawn")


def _worker(idx: int, args: tuple[Any, ...], prompts: list[Prompt], conc: int, barrier: Any, stop: Any,
            counters: Any, results: Any) -> None:
    base_url, backend, model, timeout_s = args
    view = _Slot(counters, idx)
    try:
        barrier.wait(timeout=60)
        res = asyncio.run(run_share(base_url, backend, model, prompts, conc, timeout_s, stop.is_set, view))
    except Exception as e:  # noqa: BLE001 - the parent must get an answer from every worker
        now = time.perf_counter()
        res = ShareResult(records=[], t0=now, t_end=now, errors=[f"worker {idx}: {type(e).__name__}: {e}"])
    results.put((idx, res))


class _Slot:
    """counters[idx*3 : idx*3+3] of a shared array, indexable like a 3-list."""

    def __init__(self, arr: Any, idx: int):
        self.arr, self.base = arr, idx * 3

    def __getitem__(self, i: int) -> int:
        return self.arr[self.base + i]

    def __setitem__(self, i: int, v: int) -> None:
        self.arr[self.base + i] = v


def _split(prompts: list[Prompt], concurrency: int, procs: int) -> list[tuple[list[Prompt], int]]:
    """Each worker gets a share of the streams and prompts in proportion, so all finish together."""
    conc = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    cuts = [len(prompts) * sum(conc[:i]) // concurrency for i in range(procs + 1)]
    return [(prompts[cuts[i]:cuts[i + 1]], conc[i]) for i in range(procs)]


def run_processes(base_url: str, backend: str, model: str, prompts: list[Prompt], concurrency: int, procs: int,
                  timeout_s: float, should_abort: Callable[[], bool],
                  progress: Callable[[dict[str, Any]], None] | None) -> list[ShareResult]:
    barrier, stop, results = _CTX.Barrier(procs), _CTX.Event(), _CTX.Queue()
    counters = _CTX.RawArray("q", 3 * procs)
    parts = _split(prompts, concurrency, procs)
    workers = [_CTX.Process(target=_worker, daemon=True, name=f"bench-{i}",
                            args=(i, (base_url, backend, model, timeout_s), part, conc, barrier, stop, counters,
                                  results)) for i, (part, conc) in enumerate(parts)]
    for w in workers:
        w.start()
    got = _collect(workers, results, stop, should_abort, counters, len(prompts), progress)
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.kill()
    return [got.get(i) or _lost(i) for i in range(procs)]


def _totals(counters: Any, n: int) -> list[int]:
    return [sum(counters[k::3]) for k in range(3)][:n]


def _collect(workers: list[Any], results: Any, stop: Any, should_abort: Callable[[], bool], counters: Any,
             total: int, progress: Callable[[dict[str, Any]], None] | None) -> dict[int, ShareResult]:
    got: dict[int, ShareResult] = {}
    next_report = time.monotonic()
    while len(got) < len(workers):
        if should_abort() and not stop.is_set():
            stop.set()
        try:
            idx, res = results.get(timeout=0.05)
            got[idx] = res
        except queue.Empty:
            if all(not w.is_alive() for w in workers) and results.empty():
                break
        if progress and time.monotonic() >= next_report:
            done, failed, toks = _totals(counters, 3)
            progress({"done": done, "failed": failed, "total": total, "output_tokens": toks})
            next_report = time.monotonic() + 0.25
    if should_abort():
        for res in got.values():
            res.aborted = True
    return got


def _lost(idx: int) -> ShareResult:
    now = time.perf_counter()    # no records: its requests count as failed (num_prompts - completed)
    return ShareResult(records=[], t0=now, t_end=now, errors=[f"client worker {idx} died"])

