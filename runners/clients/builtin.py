"""The built-in benchmark client: one concurrency level against a running SGLang (or the stand-in).

Public API (`CLIENT` is this module as a `Client`, base.py):

- `run_level(base_url, concurrency, workload, num_prompts, *, backend, model, time_scale=1.0,
  request_timeout_s, progress=None, processes="auto", abort=None) -> LevelMetrics` (sync; the lifecycle calls
  it from its own thread). `abort` is a `threading.Event` or a callable returning True; once set (e.g. the log
  watcher saw a crash) the level ends within ~0.1 s, in-flight requests count as failed.
- `LevelMetrics` (base.py): `metrics` (exactly `sglang.bench_serving`'s result keys, see `metrics.METRIC_KEYS`,
  in modeled units: wall times / time_scale), `completed`, `failed`, `errors` (first few), `client_bound`,
  `wall_s`, `aborted`, `server_gone`, `processes`, `client` (lag/CPU evidence for client_bound).
- `progress(dict)`: called about every 0.25 s with done / failed / total / output_tokens (tokens streamed so far,
  counted chunk by chunk: the token-progress evidence for hang detection).

Never fooled: a failed request contributes nothing; a level whose server died reports failed > 0 and
completed < num_prompts; token counts are what the server streamed, never the planned lengths. When a request
is refused (server gone) the remaining requests are not sent and the level ends at once.

Capacity: streams are split over worker processes (`processes="auto"`: one per `STREAMS_PER_PROCESS`
concurrent streams, at most one per CPU core it may use), each running its own event loop on its share of the
concurrency; results are merged on the common monotonic clock. A run is flagged `client_bound` when the
event loop of a worker overslept (p99 lag > `LAG_BOUND_MS`) or a worker used most of a core.
"""
from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from tunectl.profile import WorkloadSpec
from tunectl.runners.clients._share import MAX_ERRORS, ShareResult, run_share
from tunectl.runners.clients.base import Abort, LevelMetrics, OpenLoad, Progress, Target
from tunectl.runners.clients.datasets import tokenized
from tunectl.runners.clients.metrics import METRIC_KEYS, ReqRecord, compute_metrics, slo_metrics
from tunectl.runners.clients.prompts import Prompt, PromptStream, count_requests, make_prompts, warmup_prompts
from tunectl.runners.clients.steady import MIN_SAMPLES, Control, Steady, StopRule, settled, steady, steady_window
from tunectl.workloads import DATASETS

__all__ = ["CLIENT", "METRIC_KEYS", "BuiltinClient", "LevelMetrics", "StopRule", "auto_processes", "run_level"]

STREAMS_PER_PROCESS = 128
LAG_BOUND_MS = 5.0
CPU_BOUND = 0.85

def auto_processes(concurrency: int) -> int:
    spare = len(os.sched_getaffinity(0))       # the parent only waits while its workers stream
    return max(1, min(spare, math.ceil(concurrency / STREAMS_PER_PROCESS)))


def _abort_fn(abort: Abort) -> Callable[[], bool]:
    if abort is None:
        return lambda: False
    return abort.is_set if isinstance(abort, threading.Event) else abort


def run_level(base_url: str, concurrency: int, workload: WorkloadSpec, num_prompts: int, *,
              backend: Literal["sglang", "sglang-oai"] = "sglang", model: str = "default",
              time_scale: float = 1.0, request_timeout_s: float = 600.0,
              progress: Callable[[dict[str, Any]], None] | None = None,
              processes: int | Literal["auto"] = "auto", abort: Abort = None,
              rule: StopRule | None = None, isolate: bool = False, slo: dict[str, float] | None = None,
              tokenizer: str | None = None) -> LevelMetrics:
    """Without `rule`: exactly `num_prompts` requests. With one: requests keep coming until the rule says the
    steady window is measured (at least `rule.min_prompts`), then the ones in flight finish. `isolate`: stream
    from worker processes even when one is enough (never in this process). `tokenizer`: a dataset workload's,
    unless the workload names its own."""
    should_abort = _abort_fn(abort)
    procs = auto_processes(concurrency) if processes == "auto" else max(1, int(processes))
    procs = max(1, min(procs, concurrency, num_prompts))
    try:
        convs = tokenized(workload, tokenizer or "") if workload.kind in DATASETS else None
    except Exception as e:     # noqa: BLE001 -- a tokenizer that cannot load fails the level with its reason
        return LevelMetrics(concurrency, num_prompts, workload.label, failed=num_prompts, errors=[
            f"workload {workload.label}: tokenizer {workload.tokenizer or tokenizer!r} cannot load: {e}"[:300]])
    prompts: list[Prompt] | PromptStream = make_prompts(workload, num_prompts, concurrency, convs) \
        if rule is None else PromptStream(workload, concurrency, limit=rule.max_prompts, convs=convs)
    out = LevelMetrics(concurrency, num_prompts, workload.label, processes=procs)
    wall0 = time.perf_counter()
    warm = asyncio.run(run_share(base_url, backend, model, warmup_prompts(workload), 1, request_timeout_s,
                                 should_abort))
    control = Control(rule, concurrency, time_scale, server_clock=warm.server_clock) if rule is not None else None
    if warm.server_gone or should_abort() or any(not r.success for r in warm.records):
        shares = [ShareResult(records=[], t0=wall0, t_end=wall0, aborted=warm.aborted or should_abort(),
                              server_gone=warm.server_gone, errors=["warmup: " + e for e in warm.errors])]
    elif procs == 1 and not isolate:
        shares = [_single(base_url, backend, model, prompts, concurrency, request_timeout_s, should_abort,
                          progress, control, time_scale)]
    else:
        from tunectl.runners.clients._procs import run_processes
        shares = run_processes(base_url, backend, model, prompts, concurrency, procs, request_timeout_s,
                               should_abort, progress, control, time_scale)
    if rule is not None:
        # What was started: a cap that comes before the planned requests were all sent ends the level (capped),
        # it fails no request. With none started (no server) the planned ones count as failed.
        out.num_prompts = sum(len(s.records) for s in shares) or num_prompts
        out.capped = bool(control and control.capped)
    _merge(out, shares, time_scale, rule)
    if slo and out.metrics:
        duration = out.metrics["duration"] * time_scale
        out.metrics.update(slo_metrics([r for s in shares for r in s.records], slo, out.num_prompts, duration,
                                       time_scale))
    out.wall_s = time.perf_counter() - wall0
    return out


def _single(base_url: str, backend: str, model: str, prompts: list[Prompt] | PromptStream, concurrency: int,
            timeout_s: float, should_abort: Callable[[], bool], progress: Callable[[dict[str, Any]], None] | None,
            control: Control | None, time_scale: float) -> ShareResult:
    counters = [0, 0, 0, 0]
    stop = threading.Event()
    total = count_requests(prompts) if isinstance(prompts, list) else 0
    reporter = _start_reporter(progress, lambda: counters, total, stop)
    more = (lambda started: not control.done(started)) if control is not None else None
    try:
        return asyncio.run(run_share(base_url, backend, model, prompts, concurrency, timeout_s, should_abort,
                                     counters, more=more, on_cycle=control.add if control is not None else None,
                                     time_scale=time_scale))
    finally:
        stop.set()
        if reporter:
            reporter.join()


def _start_reporter(progress: Callable[[dict[str, Any]], None] | None, read: Callable[[], Any], total: int,
                    stop: threading.Event) -> threading.Thread | None:
    if progress is None:
        return None

    def loop() -> None:
        while not stop.wait(0.25):
            c = read()
            progress({"done": int(c[0]), "failed": int(c[1]), "total": total or int(c[3]),
                      "output_tokens": int(c[2])})

    t = threading.Thread(target=loop, daemon=True, name="bench-progress")
    t.start()
    return t


def _chunks(records: list[ReqRecord]) -> list[tuple[float, float]]:
    """(time, tokens) of every token the successful requests streamed."""
    out: list[tuple[float, float]] = []
    for r in records:
        if r.success:
            t = r.start + r.ttft
            out.append((t, 1.0))
            for gap in r.itl:
                t += gap
                out.append((t, 1.0))
    return out


def _duration(started: list[ShareResult], records: list[ReqRecord]) -> float:
    """bench_serving's duration: the client's run on its own clock; in the server's clock (the stand-in's
    stamps): its first request's arrival to its last token."""
    if not started:
        return 0.0
    if any(s.server_clock for s in started):
        ok = [r for r in records if r.success]
        return max(r.start + r.latency for r in ok) - min(r.start for r in ok) if ok else 0.0
    return max(s.t_end for s in started) - min(s.t0 for s in started)


def _steady(shares: list[ShareResult], records: list[ReqRecord], concurrency: int, time_scale: float,
            rule: StopRule | None = None) -> Steady | None:
    """Cycles when a steady wave of them finished (with a stop rule: those it measured on the server's clock,
    `settled`); else the tokens streamed in the steady window when it spans at least one request; else None (the
    level's whole-run figures stand alone)."""
    cycles = [c for s in shares for c in s.cycles]
    st = steady(settled(cycles, rule, concurrency, time_scale) if rule else cycles, concurrency, time_scale)
    if st is not None and st.samples >= concurrency:
        return st
    ok = [r.latency for r in records if r.success]
    win = steady_window(_chunks(records), [r.start for r in records], concurrency, time_scale,
                        min_span=float(np.median(ok)) if ok else 0.0)
    if win is not None:
        return win
    return st if st is not None and st.samples >= max(MIN_SAMPLES, concurrency // 2) else None


def _merge(out: LevelMetrics, shares: list[ShareResult], time_scale: float, rule: StopRule | None = None) -> None:
    records: list[ReqRecord] = [r for s in shares for r in s.records]
    started = [s for s in shares if s.records]
    duration = _duration(started, records)
    out.completed = sum(r.success for r in records)
    out.failed = out.num_prompts - out.completed
    out.errors = [e for s in shares for e in s.errors][:MAX_ERRORS]
    out.aborted = any(s.aborted for s in shares)
    out.server_gone = any(s.server_gone for s in shares)
    out.metrics = compute_metrics(records, duration, time_scale, out.concurrency) if started else {}
    out.steady = _steady(shares, records, out.concurrency, time_scale, rule)
    if out.steady is not None and out.metrics:
        out.metrics["steady_output_throughput"] = out.steady.interval.value
        out.metrics["steady_duration"] = out.steady.window_s
    lags = [x for s in shares for x in s.lag_ms]
    busy = max((s.cpu_s / max(s.t_end - s.t0, 1e-9) for s in started), default=0.0)
    lag99 = float(np.percentile(lags, 99)) if lags else 0.0
    out.client = {"loop_lag_p99_ms": lag99, "cpu_busy_max": busy, "processes": len(shares)}
    out.client_bound = lag99 > LAG_BOUND_MS or busy > CPU_BOUND


class BuiltinClient:
    """tunectl's own client, in this process (split over worker processes at high concurrency)."""
    name = "builtin"
    streams_progress = True

    def run_level(self, target: Target, workload: WorkloadSpec, concurrency: int, num_prompts: int, *,
                  progress: Progress | None = None, abort: Abort = None) -> LevelMetrics:
        rule = None if target.precision is None else StopRule(
            min_prompts=num_prompts, min_s=target.min_level_s, precision=target.precision, max_s=target.max_level_s)
        return run_level(target.base_url, concurrency, workload, num_prompts, backend=target.backend,
                         model=target.model, time_scale=target.time_scale,
                         request_timeout_s=target.request_timeout_s, progress=progress, abort=abort, rule=rule,
                         isolate=target.relayed, slo=target.slo, tokenizer=target.tokenizer)

    def run_open(self, target: Target, workload: WorkloadSpec, load: OpenLoad, *,
                 progress: Progress | None = None, abort: Abort = None) -> LevelMetrics:
        from tunectl.runners.clients.openloop import run_open

        return run_open(target, workload, load, progress=progress, abort=abort)


CLIENT = BuiltinClient()
