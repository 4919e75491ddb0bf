"""The live stand-in's scheduler loop: the shared Scheduler on its own modeled clock, one asyncio task.

The modeled clock is virtual: it advances by each step's modeled duration (and, while the server is idle, by the
idle wall time / scale), so what the server does (batches, crashes, hangs, token times) does not depend on how
busy the host is. Wall time paces it: steps end no earlier than `anchor + modeled x scale`, late steps run back to
back until on time again; time spent waiting for a client (below) moves the anchor, it is not made up for.

A closed-loop client answers a finished request with its next one at once; on a busy host that answer can come
late in wall time. The loop waits for it: each request finished by a step is expected to be replaced before the
next step runs, until all replacements came or none came for `QUIET_S` of wall time (the client stopped: the
expectation is dropped until the next arrival). Only requests of clients that read the server's clock are waited
for (they send `X-Sim-Clock: wait`); an idle server's clock runs on in scaled wall time, so a client that measures
on its own clock (the real `sglang.bench_serving`) reads what it did on a wall-time clock. A burst of new streams
(an idle server woken, or more waiting requests than the replacements expected) is gathered until `QUIET_S` passes without
an arrival (at most `GATHER_MAX_S`) before the next step.
Arrivals are stamped with the modeled time at which the next step can take them (`vnow`); every streamed update
carries the modeled time of the step that produced it (served to clients in `meta_info.sim_clock_ts`).
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Callable

from tunectl.sim.setup import Setup
from tunectl.sim.logs import Log
from tunectl.sim.metrics import Metrics
from tunectl.sim.sched import Req, RuntimeCrash, Scheduler, Step

DECODE_LOG_INTERVAL = 40
QUIET_S = float(os.environ.get("TUNECTL_SIM_GATHER_MS", "20")) / 1000  # wall: the client is done sending when
GATHER_MAX_S = 0.5      # no request came for this long (a burst: at most this long)


@dataclass
class Update:
    generated: int
    finished: bool
    t: float = 0.0          # modeled time of the step that produced it


class Engine:
    def __init__(self, setup: Setup, scale: float, seed: int, log: Log,
                 on_crash: Callable[[RuntimeCrash], None]):
        self.setup, self.scale, self.log, self.on_crash = setup, scale, log, on_crash
        self.sched = Scheduler(setup, seed)
        self.queues: dict[int, asyncio.Queue[Update]] = {}
        self.wake = asyncio.Event()
        self.vnow = 0.0                   # modeled seconds: the sum of the steps run so far
        self.expect = 0                   # replacements awaited for requests finished by the last steps
        self.armed = True                 # False once the client let a replacement window pass in silence
        self.burst = False                # requests beyond the expected replacements came: gather them first
        self._anchor = time.monotonic()   # wall time at modeled time 0, moved on after waits for a client
        self.decode_steps = 0
        self.last_gen_throughput = 0.0
        self.metrics = Metrics()
        self._tok_since_log, self._vt_last_log = 0, 0.0

    def modeled_now(self) -> float:
        return self.vnow

    def submit(self, req: Req) -> asyncio.Queue[Update]:
        q: asyncio.Queue[Update] = asyncio.Queue()
        self.queues[req.rid] = q
        req.arrival = self.vnow
        self.sched.add(req)
        self.burst = self.burst or (req.waits and self.expect == 0)   # not a replacement: new streams arrive
        self.expect, self.armed = max(0, self.expect - 1), True
        self.wake.set()
        return q

    def inflight(self) -> int:
        return len(self.queues)

    async def run(self) -> None:
        while True:
            await self._replacements()
            step = self.sched.next_step()
            if step is None:
                await self._gather()
                continue
            if step.kind == "hang":
                await self._hang()
                return
            self.vnow += step.ms / 1000.0
            await self._pace()
            if step.crash is not None:
                self.on_crash(step.crash)
                return
            self._deliver(step)
            self._log_step(step)
            if self.armed:
                self.expect += sum(r.waits for r in step.finished)

    async def _pace(self) -> None:
        """Wall time paces the clock: a step ends no earlier than `anchor + vnow x scale`; late steps run back to
        back until the clock is on time again (a client on its own clock sees modeled = wall / scale)."""
        delay = self._anchor + self.vnow * self.scale - time.monotonic()
        await asyncio.sleep(delay if delay > 0.0005 else 0)

    def _reanchor(self) -> None:
        """Time spent waiting for a client is not made up for: pace on from here."""
        self._anchor = time.monotonic() - self.vnow * self.scale

    async def _quiet(self, until: Callable[[], bool], max_s: float) -> bool:
        """Wait until `until()` or no arrival for QUIET_S (at most max_s); True if `until()` came true."""
        deadline = time.monotonic() + max_s
        while not until() and time.monotonic() < deadline:
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), QUIET_S)
            except asyncio.TimeoutError:
                for _ in range(3):          # requests already read but not yet handled get their turn
                    await asyncio.sleep(0)
                if not self.wake.is_set():
                    break
        return until()

    async def _replacements(self) -> None:
        if not self.expect and not self.burst:
            return
        if self.expect and not await self._quiet(lambda: self.expect == 0, GATHER_MAX_S):
            self.expect, self.armed = 0, False
        if self.burst:
            await self._quiet(lambda: False, GATHER_MAX_S)
            self.burst = False
        self._reanchor()

    async def _gather(self) -> None:
        """Idle: wait for work, then let a burst of arrivals finish landing before the first step. Idle time
        runs the clock on (scaled wall time: a client that does not read the server's clock measures on its own)."""
        idle = time.monotonic()
        self.wake.clear()
        await self.wake.wait()
        self.vnow += (time.monotonic() - idle) / self.scale
        for r in self.sched.waiting:
            r.arrival = self.vnow
        await self._quiet(lambda: False, GATHER_MAX_S)
        self.expect, self.burst = 0, False
        self._reanchor()

    async def _hang(self) -> None:
        await asyncio.sleep(self.setup.watchdog_s * self.scale)
        msg = f"Scheduler watchdog timeout (self.watchdog_timeout={self.setup.watchdog_s:g}, self.soft=False)"
        self.on_crash(RuntimeCrash("watchdog_timeout", msg))

    def _deliver(self, step: Step) -> None:
        sched, every, m = self.sched, self.setup.stream_interval, self.metrics
        t = self.vnow
        for r in step.joined:
            r.first_token_t = t if r.first_token_t is None else r.first_token_t
            m.observe_ttft(t - r.arrival)
        m.prompt_tokens += step.new_tokens
        if step.kind == "prefill":
            m.cached_tokens += step.cached_tokens
            m.cache_hit_rate = step.cached_tokens / max(1, step.cached_tokens + step.new_tokens)
        m.generation_tokens += step.bs if step.kind == "decode" else len(step.joined)
        m.running, m.queued = len(sched.running), len(sched.waiting)
        if step.kind == "decode":
            for r in sched.running.values():
                g = sched.generated(r)
                if g % every == 0:
                    self.queues[r.rid].put_nowait(Update(g, False, t))
        else:
            for r in step.joined:
                if r.output_len > 1 and not r.done:
                    self.queues[r.rid].put_nowait(Update(1, False, t))
        for r in step.finished:
            r.finish_t = t
            q = self.queues.pop(r.rid, None)
            if q is not None:
                q.put_nowait(Update(r.output_len, True, t))
        self._tok_since_log += step.bs if step.kind == "decode" else len(step.joined)

    def _log_step(self, step: Step) -> None:
        s = self.sched
        usage = s.kv_used / max(1, self.setup.kv_tokens)
        if step.retracted:
            self.log(f"KV cache pool is full. Retract requests. #retracted_reqs: {step.retracted}, "
                     f"#new_token_ratio: {step.ratio[0]:.4f} -> {step.ratio[1]:.4f}", rank=True)
        if step.kind == "prefill":
            self.log(f"Prefill batch, #new-seq: {step.new_seq}, #new-token: {step.new_tokens}, "
                     f"#cached-token: {step.cached_tokens}, token usage: {usage:.2f}, "
                     f"#running-req: {len(s.running) - len(step.joined)}, #queue-req: {len(s.waiting)}", rank=True)
            return
        self.decode_steps += 1
        if self.decode_steps % DECODE_LOG_INTERVAL:
            return
        dt = max(1e-9, self.vnow - self._vt_last_log)
        self.last_gen_throughput = self.metrics.gen_throughput = self._tok_since_log / dt
        self._tok_since_log, self._vt_last_log = 0, self.vnow
        self.log(f"Decode batch, #running-req: {step.bs}, #token: {s.kv_used}, token usage: {usage:.2f}, "
                 f"cuda graph: {step.graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                 f"#queue-req: {len(s.waiting)}", rank=True)
