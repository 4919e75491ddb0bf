"""The live stand-in's scheduler loop: the shared Scheduler in scaled wall time, one asyncio task.

Modeled time advances by each step's modeled duration; the loop sleeps until `start + modeled * scale` on the
wall clock, so several due steps run back to back when the host is busy (no drift accumulates).
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
GATHER_QUIET_S = float(os.environ.get("TUNECTL_SIM_GATHER_MS", "3")) / 1000  # wall: a burst has landed when no request came for this long ...
GATHER_MAX_S = 0.5      # ... or after this long


@dataclass
class Update:
    generated: int
    finished: bool


class Engine:
    def __init__(self, setup: Setup, scale: float, seed: int, log: Log,
                 on_crash: Callable[[RuntimeCrash], None]):
        self.setup, self.scale, self.log, self.on_crash = setup, scale, log, on_crash
        self.sched = Scheduler(setup, seed)
        self.queues: dict[int, asyncio.Queue[Update]] = {}
        self.wake = asyncio.Event()
        self.t0 = time.monotonic()
        self.vnow = 0.0                   # modeled seconds since t0
        self.decode_steps = 0
        self.last_gen_throughput = 0.0
        self.metrics = Metrics()
        self._tok_since_log, self._vt_last_log = 0, 0.0

    def modeled_now(self) -> float:
        return (time.monotonic() - self.t0) / self.scale

    def submit(self, req: Req) -> asyncio.Queue[Update]:
        q: asyncio.Queue[Update] = asyncio.Queue()
        self.queues[req.rid] = q
        req.arrival = self.modeled_now()
        self.sched.add(req)
        self.wake.set()
        return q

    def inflight(self) -> int:
        return len(self.queues)

    async def run(self) -> None:
        while True:
            step = self.sched.next_step()
            if step is None:
                await self._gather()
                continue
            if step.kind == "hang":
                await self._hang()
                return
            self.vnow += step.ms / 1000.0          # busy: modeled time runs on, late steps catch up
            delay = self.t0 + self.vnow * self.scale - time.monotonic()
            await asyncio.sleep(delay if delay > 0.001 else 0)
            if step.crash is not None:
                self.on_crash(step.crash)
                return
            self._deliver(step)
            self._log_step(step)

    async def _gather(self) -> None:
        """Idle: wait for work, then let a burst of arrivals finish landing (the client's dispatch jitter is
        scaled up by 1/scale) and start the modeled clock at the first arrival, like a real burst."""
        self.wake.clear()
        await self.wake.wait()
        first = self.modeled_now()
        deadline = time.monotonic() + GATHER_MAX_S
        while time.monotonic() < deadline:
            self.wake.clear()
            await asyncio.sleep(GATHER_QUIET_S)
            if not self.wake.is_set():
                break
        self.vnow = max(self.vnow, first)

    async def _hang(self) -> None:
        await asyncio.sleep(self.setup.watchdog_s * self.scale)
        msg = f"Scheduler watchdog timeout (self.watchdog_timeout={self.setup.watchdog_s:g}, self.soft=False)"
        self.on_crash(RuntimeCrash("watchdog_timeout", msg))

    def _deliver(self, step: Step) -> None:
        sched, every, m = self.sched, self.setup.stream_interval, self.metrics
        for r in step.joined:
            r.first_token_t = self.vnow if r.first_token_t is None else r.first_token_t
            m.observe_ttft(self.vnow - r.arrival)
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
                    self.queues[r.rid].put_nowait(Update(g, False))
        else:
            for r in step.joined:
                if r.output_len > 1 and not r.done:
                    self.queues[r.rid].put_nowait(Update(1, False))
        for r in step.finished:
            r.finish_t = self.vnow
            q = self.queues.pop(r.rid, None)
            if q is not None:
                q.put_nowait(Update(r.output_len, True))
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
