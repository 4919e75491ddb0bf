"""Split one level over worker processes: each runs its own event loop on a share of the streams.

Workers come from a fork server (the caller has threads, so no plain fork; the server is started once per
process with the client modules preloaded, so later levels start their workers in milliseconds), wait on a
barrier so they start together, and send back their `ShareResult`; times are `perf_counter` (CLOCK_MONOTONIC,
common to all processes) or the server's clock (the stand-in's stamps), common to all of them either way, so the
parent merges records directly. The parent turns `abort` into a shared event the workers poll, and a worker that
dies counts its requests as failed; after an abort, workers that do not answer within ABORT_GRACE_S are killed,
so a level ends within about a second of a crash. A worker whose parent is gone (kill -9 of tunectl mid-level)
exits at once (`_orphan_guard`): it would otherwise wait on the server until its request timeout, or forever
putting its result into a queue nobody reads, and keep the fork server alive with it.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import select
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from tunectl.runners.clients._share import ShareResult, run_share
from tunectl.runners.clients.prompts import Prompt, PromptStream, count_requests
from tunectl.runners.clients.steady import Control, Cycle

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["tunectl.runners.clients._share", "tunectl.runners.clients.prompts"])
ABORT_GRACE_S = 0.5         # after an abort, workers that have not answered by then are killed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphan_guard(parent: int) -> None:
    """Exit this process as soon as `parent` (the process running the level) is gone. The fork server, not the
    parent, is this process's parent, so PR_SET_PDEATHSIG would not fire; a pidfd says when the parent exits
    (Linux 5.3+), else a poll once a second."""
    def watch() -> None:
        try:
            fd = os.pidfd_open(parent)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            select.select([fd], [], [])                  # readable once the process has exited
        else:
            while _alive(parent):
                time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="orphan-guard").start()


def _worker(idx: int, args: tuple[Any, ...], prompts: list[Prompt] | PromptStream, conc: int, barrier: Any,
            stop: Any, counters: Any, results: Any, enough: Any, cycles: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle: it stops and reaps us
    base_url, backend, model, timeout_s, scale, total, level, parent = args
    # each share is its own level on the stand-in's clock (`<level>.<idx>`, its own streams): the clock waits for
    # each share's requests, and a share that stops sending releases only its own (a busy host delays the shares
    # unevenly; one share's release must not leave the clock running past another's late replacements)
    streams, level = conc, f"{level}.{idx}"
    _orphan_guard(parent)
    view = _Slot(counters, idx)
    on_cycle = None
    if cycles is not None:
        cycles.cancel_join_thread()      # the parent reads the final cycles from the result, not from here
        on_cycle = lambda c: cycles.put((c.start, c.end, c.next_start, c.tokens, c.server,  # noqa: E731
                                         idx * 100_000 + c.slot))
    try:
        barrier.wait(timeout=60)
        res = asyncio.run(run_share(base_url, backend, model, prompts, conc, timeout_s, stop.is_set, view,
                                    more=lambda _n: not enough.is_set(), on_cycle=on_cycle, time_scale=scale,
                                    streams=streams, level=level, total=total))
    except Exception as e:  # noqa: BLE001 - the parent must get an answer from every worker
        now = time.perf_counter()
        res = ShareResult(records=[], t0=now, t_end=now, errors=[f"worker {idx}: {type(e).__name__}: {e}"])
    results.put((idx, res))


class _Slot:
    """counters[idx*4 : idx*4+4] (done, failed, tokens, started) of a shared array, indexable like a 4-list."""

    def __init__(self, arr: Any, idx: int):
        self.arr, self.base = arr, idx * 4

    def __getitem__(self, i: int) -> int:
        return self.arr[self.base + i]

    def __setitem__(self, i: int, v: int) -> None:
        self.arr[self.base + i] = v


def _split(prompts: list[Prompt], concurrency: int, procs: int) -> list[tuple[list[Prompt], int]]:
    """Each worker gets a share of the streams and prompts in proportion, so all finish together."""
    conc = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    cuts = [len(prompts) * sum(conc[:i]) // concurrency for i in range(procs + 1)]
    return [(prompts[cuts[i]:cuts[i + 1]], conc[i]) for i in range(procs)]


def _stream_split(stream: PromptStream, concurrency: int, procs: int) -> list[tuple[PromptStream, int]]:
    conc = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    return [(stream.split(i, stream.limit * conc[i] // concurrency + 1), conc[i]) for i in range(procs)]


def run_processes(base_url: str, backend: str, model: str, prompts: list[Prompt] | PromptStream, concurrency: int,
                  procs: int, timeout_s: float, should_abort: Callable[[], bool],
                  progress: Callable[[dict[str, Any]], None] | None,
                  control: Control | None = None, time_scale: float = 1.0) -> list[ShareResult]:
    """`prompts`: a fixed list (split in proportion), or a PromptStream with a `control` deciding on-line (from
    the cycles the workers send) when the level has measured enough."""
    barrier, stop, results, enough = _CTX.Barrier(procs), _CTX.Event(), _CTX.Queue(), _CTX.Event()
    level = uuid.uuid4().hex[:12]          # the level's id; each share adds its index (the stand-in waits for each)
    cycles = _CTX.Queue() if control is not None else None
    counters = _CTX.RawArray("q", 4 * procs)
    parts = _stream_split(prompts, concurrency, procs) if isinstance(prompts, PromptStream) else \
        _split(prompts, concurrency, procs)
    shared = (base_url, backend, model, timeout_s, time_scale, concurrency, level, os.getpid())
    workers = [_CTX.Process(target=_worker, daemon=True, name=f"bench-{i}",
                            args=(i, shared, part, conc, barrier, stop, counters, results, enough, cycles))
               for i, (part, conc) in enumerate(parts)]
    for w in workers:
        w.start()
    report = _Reporter(progress, counters, count_requests(prompts) if isinstance(prompts, list) else 0)
    got = _collect(workers, results, stop, should_abort, report, _Steer(control, cycles, enough, counters))
    aborted = should_abort()
    _reap(workers, 0.2 if aborted else 5.0)
    shares = [got.get(i) or _lost(i) for i in range(procs)]
    for res in shares:
        res.aborted = res.aborted or aborted
    return shares


class _Steer:
    """The parent's side of an open-length level: feeds the workers' cycles to the Control, sets `enough`."""

    def __init__(self, control: Control | None, cycles: Any, enough: Any, counters: Any):
        self.control, self.cycles, self.enough, self.counters = control, cycles, enough, counters

    def __call__(self) -> None:
        if self.control is None:
            return
        while True:                      # always drained: a worker with unread items could not exit
            try:
                item = self.cycles.get_nowait()
            except queue.Empty:
                break
            if not self.enough.is_set():
                self.control.add(Cycle(*item))
        started = sum(self.counters[3::4])
        if started and not self.enough.is_set() and self.control.done(started):
            self.enough.set()


def _reap(workers: list[Any], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for w in workers:
        w.join(timeout=max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.is_alive():
            w.kill()
    for w in workers:
        w.join(timeout=5)


class _Reporter:
    def __init__(self, progress: Callable[[dict[str, Any]], None] | None, counters: Any, total: int):
        self.progress, self.counters, self.total, self.next = progress, counters, total, 0.0

    def __call__(self) -> None:
        if self.progress and time.monotonic() >= self.next:
            done, failed, toks, started = (sum(self.counters[k::4]) for k in range(4))
            self.progress({"done": done, "failed": failed, "total": self.total or started, "output_tokens": toks})
            self.next = time.monotonic() + 0.25


def _collect(workers: list[Any], results: Any, stop: Any, should_abort: Callable[[], bool],
             report: _Reporter, steer: _Steer) -> dict[int, ShareResult]:
    """Gather the workers' results; after an abort wait at most ABORT_GRACE_S for them."""
    got: dict[int, ShareResult] = {}
    abort_at: float | None = None
    while len(got) < len(workers):
        if abort_at is None and should_abort():
            stop.set()
            abort_at = time.monotonic()
        if abort_at is not None and time.monotonic() - abort_at > ABORT_GRACE_S:
            break
        try:
            idx, res = results.get(timeout=0.05)
            got[idx] = res
        except queue.Empty:
            if all(not w.is_alive() for w in workers) and results.empty():
                break
        report()
        steer()
    return got


def _lost(idx: int) -> ShareResult:
    now = time.perf_counter()    # no records: its requests count as failed (num_prompts - completed)
    return ShareResult(records=[], t0=now, t_end=now, errors=[f"client worker {idx} gave no result"])
