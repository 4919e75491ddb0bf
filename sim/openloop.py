"""The stand-in's model under open-loop load, in a virtual clock: requests arrive at given modeled times.

`open_level(sched, arrivals, max_concurrency=None) -> OpenOutcome`: `arrivals` are (modeled seconds from the
level's start, input_len, output_len); the same `Scheduler` the live stand-in runs takes each request once the
clock reaches its arrival (an idle server waits for the next one), at most `max_concurrency` in flight (later
arrivals wait at the client, as behind `bench_serving --max-concurrency`; their latency counts from admission).
Returns each finished request's TTFT and E2E latency in modeled seconds, or the crash that ended the level.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from tunectl.sim.sched import Req, RuntimeCrash, Scheduler

_rid = itertools.count(10_000_000)


@dataclass
class OpenOutcome:
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    output_len: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    crash: RuntimeCrash | None = None


def open_level(sched: Scheduler, arrivals: list[tuple[float, int, int]],
               max_concurrency: int | None = None) -> OpenOutcome:
    out, now = OpenOutcome(), 0.0
    due = deque(sorted(arrivals))
    held: deque[Req] = deque()             # arrived, waiting for a client slot
    inflight = 0
    while due or held or inflight:
        while due and due[0][0] <= now:
            t, i, o = due.popleft()
            held.append(Req(next(_rid), i, o, arrival=t))
        while held and (max_concurrency is None or inflight < max_concurrency):
            r = held.popleft()
            r.arrival = max(r.arrival, now) if max_concurrency else r.arrival
            sched.add(r)
            inflight += 1
        step = sched.next_step()
        if step is None:
            if not due:
                break
            now = max(now, due[0][0])     # idle: the next arrival
            continue
        if step.kind == "hang":
            out.crash = RuntimeCrash("watchdog_timeout", "Scheduler watchdog timeout")
            break
        now += step.ms / 1000.0
        if step.crash is not None:
            out.crash = step.crash
            break
        for r in step.joined:
            r.first_token_t = now if r.first_token_t is None else r.first_token_t
        for r in step.finished:
            inflight -= 1
            out.ttft_s.append((r.first_token_t or now) - r.arrival)
            out.e2e_s.append(now - r.arrival)
            out.output_len.append(r.output_len)
    out.duration_s = now
    return out
