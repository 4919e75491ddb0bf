"""The live stand-in's scheduler loop: the shared Scheduler on its own modeled clock, one asyncio task.

The modeled clock is virtual: it advances by each step's modeled duration (and, while the server is idle, by the
idle wall time / scale), so what the server does (batches, crashes, hangs, token times) does not depend on how
busy the host is. Wall time paces it: steps end no earlier than `anchor + modeled x scale`, late steps run back to
back until on time again; time spent waiting for a client (below) moves the anchor, it is not made up for.

A closed-loop client answers a finished request with its next one at once; on a busy host that answer can come
late in wall time. A client that reads the server's clock says how many requests it keeps in flight
(`X-Sim-Clock: streams=N; level=ID`), and the loop waits for it: no step runs while fewer than N requests are in
flight, until they are (its next requests came, or a new level's burst has landed), the client says that level
sends no more (`streams=0`, on any request) or none came for `SILENT_S` of wall time (a client gone silent). A client
split over worker processes declares each share as its own level (`ID.k`, its own streams): the loop waits for each
share's requests, and a share that stops sending releases only its own.
Other clients (the real `sglang.bench_serving`) are not waited for, and an idle server's clock runs on in scaled wall
time, so a client that measures on its own clock reads what it did on a wall-time clock; a burst of theirs that wakes an
idle
server is gathered until `QUIET_S` passes without an arrival (at most `GATHER_MAX_S`).
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
from tunectl.sim.spec import accept_part
from tunectl.sim.metrics import Metrics
from tunectl.sim.power import Meter
from tunectl.sim.sched import Req, RuntimeCrash, Scheduler, Step

DECODE_LOG_INTERVAL = 40
QUIET_S = float(os.environ.get("TUNECTL_SIM_GATHER_MS", "3")) / 1000  # wall: the client is done sending when
GATHER_MAX_S = 0.5      # no request came for this long (a burst: at most this long)
SILENT_S = 2.0          # a clock-reading client that sent nothing for this long (wall) is not waited for
WAIT_MAX_S = 10.0       # the longest wait for its requests


@dataclass
class Update:
    generated: int
    finished: bool
    t: float = 0.0          # modeled time of the step that produced it


class Engine:
    def __init__(self, setup: Setup, scale: float, seed: int, log: Log,
                 on_crash: Callable[[RuntimeCrash], None], noise: float = 1.0, launch: int | str | None = None,
                 machine: tuple[int | str, int] | None = None):
        self.setup, self.scale, self.log, self.on_crash = setup, scale, log, on_crash
        self.sched = Scheduler(setup, seed, noise, launch, machine)
        self.queues: dict[int, asyncio.Queue[Update]] = {}
        self.wake = asyncio.Event()
        self.vnow = 0.0                   # modeled seconds: the sum of the steps run so far
        self.want: dict[str, int] = {}    # per clock-reading client (level id): the requests it keeps in flight
        self.level_of: dict[int, str] = {}   # request -> the client (level id) that sent it
        self.released: set[str] = set()   # levels whose client said it sends no more
        self.whole: dict[str, int] = {}   # a level split in shares: its streams in all, until a share is released
        self._anchor = time.monotonic()   # wall time at modeled time 0, moved on after waits for a client
        self.decode_steps = 0
        self.last_gen_throughput = 0.0
        self.metrics = Metrics()
        self.metrics.spec_accept_length = setup.spec.accept_len() if setup.spec is not None else 0.0
        self.power = Meter(setup.card)    # what the GPUs draw (sim/power.py), read by tunectl.sim.smi
        self._tok_since_log, self._vt_last_log = 0, 0.0

    def modeled_now(self) -> float:
        return self.vnow

    def clock_now(self) -> float:
        """Modeled now: with requests in flight the clock of the last step (waits for a client are not modeled
        time); idle, scaled wall time since the last step."""
        return self.vnow if self.queues else max(self.vnow, (time.monotonic() - self._anchor) / self.scale)

    def submit(self, req: Req, clock: tuple[int, str, int] | None = None) -> asyncio.Queue[Update]:
        q: asyncio.Queue[Update] = asyncio.Queue()
        self.queues[req.rid] = q
        req.arrival = self.vnow
        self.sched.add(req)
        if clock is not None:
            self.level_of[req.rid] = clock[1]
            self.declare(*clock)
        self.wake.set()
        return q

    def abort(self, rid: int) -> None:
        """The client of request `rid` went away: the scheduler drops it (sim/sched.py `abort`), nobody waits for
        its updates."""
        self.queues.pop(rid, None)
        self.level_of.pop(rid, None)
        self.sched.abort(rid)
        self.metrics.running, self.metrics.queued = len(self.sched.running), len(self.sched.waiting)
        self.wake.set()

    def declare(self, streams: int, level: str, total: int = 0) -> None:
        """A clock-reading client keeps `streams` requests in flight for `level`; 0: that level sends no more.
        `total`: the client is one share (`<group>.<k>`) of a level of `total` streams: until a share of it is
        released, the loop waits for all of them (the other shares' first requests may land later)."""
        group = level.rsplit(".", 1)[0]
        if streams == 0:
            self.released.add(level)
            self.want.pop(level, None)
            self.whole.pop(group, None)
        elif level not in self.released:
            self.want[level] = streams
            if total and group not in {lv.rsplit(".", 1)[0] for lv in self.released}:
                self.whole[group] = total
        self.wake.set()

    @property
    def armed(self) -> bool:
        return bool(self.want)

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
            self.power.step(self.setup, self.vnow, step.kind, step.bs, step.ms)
            self._log_step(step)

    async def _pace(self) -> None:
        """Wall time paces the clock: a step ends no earlier than `anchor + vnow x scale`; late steps run back to
        back until the clock is on time again (a client on its own clock sees modeled = wall / scale)."""
        delay = self._anchor + self.vnow * self.scale - time.monotonic()
        await asyncio.sleep(delay if delay > 0.0005 else 0)

    def _reanchor(self) -> None:
        """Time spent waiting for a client is not made up for: pace on from here."""
        self._anchor = time.monotonic() - self.vnow * self.scale

    async def _quiet(self, until: Callable[[], bool], max_s: float, quiet_s: float = QUIET_S) -> bool:
        """Wait until `until()` or no arrival for quiet_s (at most max_s); True if `until()` came true."""
        deadline = time.monotonic() + max_s
        while not until() and time.monotonic() < deadline:
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), quiet_s)
            except asyncio.TimeoutError:
                for _ in range(3):          # requests already read but not yet handled get their turn
                    await asyncio.sleep(0)
                if not self.wake.is_set():
                    break
        return until()

    def _short(self) -> bool:
        """A clock-reading client has fewer of its requests in flight than it keeps."""
        if not self.want:
            return False
        have: dict[str, int] = {}
        for rid in self.queues:
            lv = self.level_of.get(rid)
            if lv is not None:
                have[lv] = have.get(lv, 0) + 1
                group = lv.rsplit(".", 1)[0]
                have[group + "/"] = have.get(group + "/", 0) + 1
        return any(have.get(lv, 0) < n for lv, n in self.want.items()) or \
            any(have.get(group + "/", 0) < n for group, n in self.whole.items())

    async def _replacements(self) -> None:
        """Before a step: the clock-reading client's requests are all in flight, or it has stopped sending."""
        if not self._short():
            return
        if not await self._quiet(lambda: not self._short(), WAIT_MAX_S, SILENT_S):
            self.want.clear()                       # a client gone silent: not waited for any more
            self.whole.clear()
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
        if self.armed:
            await self._replacements()
        else:
            await self._quiet(lambda: False, GATHER_MAX_S)
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
            self.level_of.pop(r.rid, None)
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
                 f"{accept_part(self.setup)}cuda graph: {step.graph}, "
                 f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                 f"#queue-req: {len(s.waiting)}", rank=True)
