"""Open-loop levels for the built-in client: requests sent on a schedule, whatever the server's pace.

`run_open(target, workload, load, *, progress=None, abort=None) -> LevelMetrics`

- A rate level (`load.rate`): `load.num_prompts` requests of the workload at the offsets of
  `tunectl.goodput.arrival_times` (Poisson, or gamma with `load.burstiness`), as `sglang.bench_serving
  --request-rate R` sends them; `load.max_concurrency` caps the requests in flight (bench_serving's
  `--max-concurrency` semaphore: a request waits for a slot, and its TTFT counts from when it is sent).
- A trace level (`workload.kind == "trace"`): the trace's requests at its timestamps / `workload.speedup`
  (`replay.py` builds the prompts; shared hash ids share tokens).

Offsets are in the server's clock: modeled seconds, sent at `offset x target.time_scale` wall seconds after the
level starts. Each request's send time is recorded beside its due time: the level reports `max_lateness_ms` and
`p99_lateness_ms` (modeled ms, like every latency), `timing_floor_ms` (LATE_FLOOR_MS or the loop's p99 lag, in
modeled ms: below it a latency is the host's jitter, tunectl.goodput.jitter_bound) and `late_requests`, the requests
sent later than
`max(LATE_FLOOR_MS wall, LATE_SHARE x their offset)`; any such request flags the level client_bound, as does an
event loop that woke late (p99 lag over the built-in client's LAG_BOUND_MS: it read the streams late). The metric keys
are `sglang.bench_serving`'s, with `request_rate` the rate asked for (a trace: its mean rate at the speed-up) and,
when the target has SLO limits, `slo_attainment` and `goodput` (tunectl.goodput).
"""
from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from tunectl.goodput import arrival_times
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients._share import MAX_ERRORS, _one, connect_failure
from tunectl.runners.clients.base import Abort, LevelMetrics, OpenLoad, Progress, Target
from tunectl.runners.clients.builtin import LAG_BOUND_MS, _abort_fn
from tunectl.runners.clients.metrics import ReqRecord, compute_metrics, slo_metrics
from tunectl.runners.clients.prompts import Prompt, make_prompts, warmup_prompts

LATE_FLOOR_MS = 5.0       # wall: a request sent within this of its due time is on time ...
LATE_SHARE = 0.01         # ... or within this share of its offset from the level's start


@dataclass
class Sent:
    due: float                 # wall perf_counter seconds
    rec: ReqRecord
    sent: float = 0.0          # when the client handed it over (before a max_concurrency slot)


@dataclass
class OpenRun:
    t0: float = 0.0
    t_end: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    aborted: bool = False
    server_gone: bool = False
    lag_ms: list[float] = field(default_factory=list)   # event-loop oversleep samples (reading streams late)


def schedule(workload: WorkloadSpec, load: OpenLoad) -> list[tuple[float, Prompt]]:
    """(offset in modeled seconds, prompt) for every request of the level."""
    if workload.kind == "trace":
        from tunectl.runners.clients.replay import trace_schedule

        return trace_schedule(workload)
    rate = float(load.rate or 0.0)
    prompts = make_prompts(workload, load.num_prompts, salt=int(rate * 1000))
    offsets = arrival_times(len(prompts), rate, load.burstiness, seed=workload.seed)
    return list(zip(offsets, prompts))


@dataclass(frozen=True)
class Conn:
    """What the sending process needs of the target (picklable)."""
    base_url: str
    backend: str
    model: str
    time_scale: float
    request_timeout_s: float


async def drive(target: Conn, plan: list[tuple[float, Prompt]], cap: int | None, should_abort: Callable[[], bool],
                counters: Any, warm: list[Prompt] | None = None) -> OpenRun:
    run = OpenRun()
    slots = asyncio.Semaphore(cap) if cap else None

    async def send(s: Sent, p: Prompt, session: aiohttp.ClientSession) -> None:
        s.sent = time.perf_counter()
        counters[3] += 1
        if slots is None:
            await _request(session, target, p, s.rec, counters, run)
        else:
            async with slots:
                await _request(session, target, p, s.rec, counters, run)
        counters[0 if s.rec.success else 1] += 1

    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=target.request_timeout_s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, read_bufsize=1 << 20) as session:
        if not await _warm(session, target, warm or [], run):
            return run
        tasks: list[asyncio.Task[None]] = []
        run.t0 = time.perf_counter()
        watch = asyncio.create_task(_watch_lag(run))
        for offset, p in plan:
            due = run.t0 + offset * target.time_scale
            while (delay := due - time.perf_counter()) > 0 and not should_abort():
                await asyncio.sleep(min(delay, 0.1))
            if should_abort() or run.server_gone:
                run.aborted = should_abort()
                break
            s = Sent(due, ReqRecord(input_len=p.input_len))
            run.sent.append(s)
            tasks.append(asyncio.create_task(send(s, p, session)))
        while tasks and not all(t.done() for t in tasks):
            await asyncio.sleep(0.01)
            if should_abort():
                run.aborted = True
                for t in tasks:
                    t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        run.t_end = time.perf_counter()
        watch.cancel()
    for s in run.sent:
        if not s.rec.success and not s.rec.error:
            s.rec.error = "aborted"
        if s.rec.error and len(run.errors) < MAX_ERRORS:
            run.errors.append(s.rec.error)
    return run


async def _watch_lag(run: OpenRun) -> None:
    """How late this loop wakes up: a busy loop reads streams late, and its latencies read high."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        run.lag_ms.append(max(0.0, (time.perf_counter() - t - 0.01) * 1000))


async def _request(session: aiohttp.ClientSession, target: Conn, p: Prompt, rec: ReqRecord, counters: Any,
                   run: OpenRun) -> None:
    """One request; its failure is in `rec` (a refused connection: the server is gone)."""
    try:
        await _one(session, target.base_url.rstrip("/"), target.backend, target.model, p, rec, counters)
    except aiohttp.ClientConnectorError as e:
        rec.error, run.server_gone = connect_failure(e), True
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]


async def _warm(session: aiohttp.ClientSession, target: Conn, prompts: list[Prompt], run: OpenRun) -> bool:
    """The warm-up requests, one at a time; False (the errors in `run`) when one fails."""
    for p in prompts:
        rec = ReqRecord(input_len=p.input_len)
        await _request(session, target, p, rec, [0, 0, 0, 0], run)
        if not rec.success:
            run.errors.append("warmup: " + (rec.error or "failed"))
            return False
    return True


def lateness(run: OpenRun, scale: float) -> dict[str, float]:
    """How late each request was sent: max and p99 in modeled ms, and the count beyond the wall tolerance."""
    if not run.sent:
        return {}
    late = np.array([max(0.0, s.sent - s.due) for s in run.sent])
    allowed = np.array([max(LATE_FLOOR_MS / 1000, LATE_SHARE * (s.due - run.t0)) for s in run.sent])
    return {"max_lateness_ms": float(late.max()) * 1000 / scale,
            "p99_lateness_ms": float(np.percentile(late, 99)) * 1000 / scale,
            "late_requests": int((late > allowed).sum())}


def offered_rate(workload: WorkloadSpec, load: OpenLoad, plan: list[tuple[float, Prompt]]) -> float:
    if workload.kind != "trace":
        return float(load.rate or 0.0)
    span = plan[-1][0] if plan else 0.0
    return (len(plan) - 1) / span if span > 0 else 0.0


def run_open(target: Target, workload: WorkloadSpec, load: OpenLoad, *, progress: Progress | None = None,
             abort: Abort = None) -> LevelMetrics:
    should_abort = _abort_fn(abort)
    plan = schedule(workload, load)
    out = LevelMetrics(load.max_concurrency or 0, len(plan), workload.label, processes=1)
    wall0 = time.perf_counter()
    conn = Conn(target.base_url, target.backend, target.model, target.time_scale, target.request_timeout_s)
    run = _in_process(conn, (warmup_prompts(workload), plan), load.max_concurrency, should_abort, progress)
    _fill(out, run, target, offered_rate(workload, load, plan), load)
    out.wall_s = time.perf_counter() - wall0
    return out


def _child(conn: Conn, work: tuple[list[Prompt], list[tuple[float, Prompt]]], cap: int | None, stop: Any,
           counters: Any, results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle: it stops and reaps us
    try:
        run = asyncio.run(drive(conn, work[1], cap, stop.is_set, counters, warm=work[0]))
    except Exception as e:  # noqa: BLE001 - the parent must get an answer
        run = OpenRun(errors=[f"client process: {type(e).__name__}: {e}"])
    results.put((0, run))


def _in_process(conn: Conn, work: tuple[list[Prompt], list[tuple[float, Prompt]]], cap: int | None,
                should_abort: Callable[[], bool], progress: Progress | None) -> OpenRun:
    """The schedule is kept by a process of its own: this one's threads (the ladder's log watch, the console)
    never hold its event loop up. `work`: the warm-up prompts (sent first, one at a time, on the same session:
    a fresh process's first connection costs tens of ms) and the schedule."""
    from tunectl.runners.clients._procs import _CTX, _collect, _reap, _Reporter, _Steer

    stop, results, counters = _CTX.Event(), _CTX.Queue(), _CTX.RawArray("q", 4)
    proc = _CTX.Process(target=_child, daemon=True, name="bench-open",
                        args=(conn, work, cap, stop, counters, results))
    proc.start()
    got = _collect([proc], results, stop, should_abort, _Reporter(progress, counters, len(work[1])),
                   _Steer(None, None, None, counters))
    _reap([proc], 0.2 if should_abort() else 5.0)
    return got.get(0) or OpenRun(errors=["the client process gave no result"], aborted=should_abort())


def _fill(out: LevelMetrics, run: OpenRun, target: Target, rate: float, load: OpenLoad) -> None:
    records = [s.rec for s in run.sent]
    scale = target.time_scale
    out.completed = sum(r.success for r in records)
    out.failed = out.num_prompts - out.completed
    out.errors, out.aborted, out.server_gone = run.errors, run.aborted, run.server_gone
    if records:
        duration = run.t_end - run.t0
        out.metrics = compute_metrics(records, duration, scale, load.max_concurrency or 0)
        out.metrics.update(request_rate=rate, burstiness=load.burstiness, **lateness(run, scale))
        if target.slo:
            out.metrics.update(slo_metrics(records, target.slo, out.num_prompts, duration, scale))
    late = int(out.metrics.get("late_requests", 0))
    lag99 = float(np.percentile(run.lag_ms, 99)) if run.lag_ms else 0.0
    if records:                  # what this client's timing (LATE_FLOOR_MS, or its loop's lag) reads as here
        out.metrics["timing_floor_ms"] = max(LATE_FLOOR_MS, lag99) / scale
    out.client = {"late_requests": late, "loop_lag_p99_ms": lag99, "processes": 1}
    out.client_bound = late > 0 or lag99 > LAG_BOUND_MS
    out.sends = [(s.due - run.t0, s.sent - run.t0) for s in run.sent]
