"""Continuous batching over a resolved Setup: the one scheduler both the live stand-in and the virtual model run.

The scheduler does not know about clocks: `next_step()` decides and applies one step and returns its modeled
duration; the caller advances its own clock (asyncio in scaled wall time, or a virtual counter).
"""
from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from operator import attrgetter

from tunectl.sim.noise import Speed
from tunectl.sim.setup import Setup

BLOCK = 64   # radix cache granularity of the stand-in (tokens)
RETRACT_STEPS = 20   # a retraction frees room for this many decode steps (SGLang's retract_decode_steps)


def block_keys(ids: list[int]) -> list[object]:
    """Chained hashes of the prompt's BLOCK-token prefixes (what a radix cache would match)."""
    keys: list[object] = []
    h = 0
    for i in range(len(ids) // BLOCK):
        h = hash((h, tuple(ids[i * BLOCK:(i + 1) * BLOCK])))
        keys.append(h)
    return keys


@dataclass
class Req:
    rid: int
    input_len: int
    output_len: int
    block_keys: list[object] = field(default_factory=list)   # hashes of prefixes at BLOCK boundaries
    arrival: float = 0.0
    prefilled: int = 0
    cached: int = 0
    start_step: int = -1
    first_token_t: float | None = None
    finish_t: float | None = None
    fresh: bool = True
    done: int = 0          # tokens generated before a retraction (re-prefilled with the prompt when it rejoins)

    @property
    def fill_len(self) -> int:
        return self.input_len + self.done


@dataclass
class RuntimeCrash:
    signature: str      # "page_table_1_flattened" | "decode_oom" | "watchdog_timeout"
    exception: str


@dataclass
class Step:
    kind: str                   # "prefill" | "decode" | "hang"
    ms: float
    bs: int = 0
    new_seq: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    graph: bool = False
    joined: list[Req] = field(default_factory=list)     # got their first token in this step
    finished: list[Req] = field(default_factory=list)
    crash: RuntimeCrash | None = None
    retracted: int = 0          # requests sent back to the queue because the KV pool was full
    ratio: tuple[float, float] = (0.0, 0.0)   # new_token_ratio before -> after the retraction


PT1_EXC = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"
DECODE_OOM_EXC = "RuntimeError: Decode out of memory. Try to lower your batch size."


class Scheduler:
    def __init__(self, setup: Setup, seed: int = 0, noise: float = 1.0, launch: int | str | None = None,
                 machine: tuple[int | str, int] | None = None):
        """`noise`: the card's noise x this (0: noise-free); `launch`: what seeds it (default: `seed`); `machine`:
        the machine state's (key, launch index) (sim/noise.py)."""
        self.s = setup
        self.rng = random.Random(seed)
        self.speed = Speed(setup.card.noise, seed if launch is None else launch, noise, machine)
        self.waiting: deque[Req] = deque()
        self.running: dict[int, Req] = {}
        self._finish: list[tuple[int, int]] = []
        self.counter = 0
        self.kv_used = 0
        self.radix: OrderedDict[object, None] = OrderedDict()      # prefix blocks, least recently used first
        self.radix_blocks = max(1, setup.kv_tokens // BLOCK)         # bounded by the KV pool, as SGLang's tree is
        self.hung = False
        self.base_ratio = setup.card.admission.new_token_ratio
        self.ratio = self.base_ratio
        self.reserved = 0          # tokens the running requests still generate (their share is held back)
        self.retractions = 0

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, rid: int) -> None:
        """As SGLang's abort_request: a waiting request leaves the queue (what it had prefilled freed), a running
        one leaves the batch, its KV and its reserved share freed (its stale finish entry is skipped)."""
        for r in self.waiting:
            if r.rid == rid:
                self.waiting.remove(r)
                if not r.fresh:                       # admitted: its cached and prefilled tokens are in the pool
                    self.kv_used -= r.prefilled
                return
        r = self.running.pop(rid, None)
        if r is not None:
            g = self.generated(r)
            self.kv_used -= r.input_len + g
            self.reserved -= r.output_len - g

    def generated(self, r: Req) -> int:
        return 0 if r.start_step < 0 else min(r.output_len, 1 + self.counter - r.start_step)

    def _finish_step(self, r: Req) -> int:
        return r.start_step + r.output_len - 1

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def flush_cache(self) -> None:
        self.radix.clear()

    def next_step(self) -> Step | None:
        step = self._next()
        if step is not None and step.ms > 0:
            # this launch's speed at this point of its work (sim/noise.py); eager decode steps move with the CPU
            step.ms = self.speed(step.ms, step.kind == "decode" and not step.graph)
        return step

    def _next(self) -> Step | None:
        if self.hung:
            return Step("hang", 0.0)
        if self.waiting and len(self.running) < self.s.max_running:
            step = self._prefill()
            if step is not None:
                return step
        if self.running:
            return self._decode()
        return None

    # ------------------------------------------------------------------------------------- prefill
    def _prefill(self) -> Step | None:
        budget, batch, tokens, prefix_sum, cached = self.s.chunk, [], 0, 0, 0
        held, added = self.ratio * self.reserved, 0.0
        while self.waiting and budget > 0 and len(self.running) + len(batch) < self.s.max_running:
            r = self.waiting[0]
            if r.fresh:
                need = r.fill_len - self._radix_hit(r) + self.ratio * (r.output_len - r.done)
                if self.kv_used + held + added + need > self.s.kv_tokens and (self.running or batch):
                    break
                added += self.ratio * (r.output_len - r.done)
                r.fresh = False
                r.cached = r.prefilled = self._radix_hit(r)
                cached += r.cached
                self.kv_used += r.cached
            take = min(r.fill_len - r.prefilled, budget)
            prefix_sum += r.prefilled
            r.prefilled += take
            tokens, budget = tokens + take, budget - take
            self.kv_used += take
            batch.append(r)
            if r.prefilled < r.fill_len:
                break
            self.waiting.popleft()
        if not batch:
            return None
        step = Step("prefill", self.s.prefill_ms(tokens), new_seq=len(batch), new_tokens=tokens,
                    cached_tokens=cached)
        step.crash = self._pt1_crash(len(batch), len(self.running), prefix_sum)
        for r in batch:
            if r.prefilled >= r.fill_len:
                self._join(r, step)
        return step

    def _radix_hit(self, r: Req) -> int:
        if not self.s.radix:
            return 0
        n = 0
        for key in r.block_keys:
            if key not in self.radix:
                break
            n += 1
        return min(n * BLOCK, r.fill_len - 1)

    def _join(self, r: Req, step: Step) -> None:
        if self.s.radix:
            for key in r.block_keys:
                self.radix[key] = None
                self.radix.move_to_end(key)
            while len(self.radix) > self.radix_blocks:
                self.radix.popitem(last=False)
        r.start_step = self.counter - r.done          # a rejoining request keeps the tokens it had
        self.kv_used += 1
        step.joined.append(r)
        if r.done + 1 >= r.output_len:
            step.finished.append(r)
            self.kv_used -= r.fill_len + 1
            return
        self.running[r.rid] = r
        self.reserved += r.output_len - r.done - 1
        heapq.heappush(self._finish, (self._finish_step(r), r.rid))

    def _pt1_crash(self, n: int, running: int, prefix_sum: int) -> RuntimeCrash | None:
        if not self.s.pt1_prone:
            return None
        gap = self.s.pt1_threshold - prefix_sum
        if gap <= 0:
            return RuntimeCrash("page_table_1_flattened", PT1_EXC)
        if running == 0:
            return None
        cfg = self.s.card.page_table_1_flattened
        assert cfg is not None
        hazard = (n / cfg.ref_batch_reqs) * math.exp(-gap / (cfg.tokens_per_running * running))
        if self.rng.random() < 1.0 - math.exp(-hazard):
            return RuntimeCrash("page_table_1_flattened", PT1_EXC)
        return None

    # -------------------------------------------------------------------------------------- decode
    def _decode(self) -> Step:
        bs = len(self.running)
        if self.s.hang and self.s.card.hang is not None and bs >= self.s.card.hang.min_bs:
            self.hung = True
            return Step("hang", 0.0, bs=bs)
        retracted, before = 0, self.ratio
        if self.kv_used + bs > self.s.kv_tokens:
            retracted = self._retract(bs)
            bs = len(self.running)
        step = Step("decode", self.s.decode_ms(bs, self.kv_used), bs=bs, graph=self.s.graph_used(bs),
                    retracted=retracted, ratio=(before, self.ratio))
        if self.kv_used + bs > self.s.kv_tokens:
            step.crash = RuntimeCrash("decode_oom", DECODE_OOM_EXC)
            return step
        self.counter += 1
        self.kv_used += bs
        self.reserved -= bs
        if not retracted and self.ratio > self.base_ratio:
            self.ratio = max(self.base_ratio,
                             self.ratio - (1.0 - self.base_ratio) / self.s.card.admission.retract_decay_steps)
        while self._finish and self._finish[0][0] <= self.counter:
            at, rid = heapq.heappop(self._finish)
            r = self.running.get(rid)
            if r is None or self._finish_step(r) != at:
                continue                          # retracted since: a stale entry
            del self.running[rid]
            self.kv_used -= r.input_len + r.output_len
            step.finished.append(r)
        return step

    def _retract(self, bs: int) -> int:
        """The KV pool cannot take one more token per running request: send requests back to the queue (the
        youngest first, as SGLang does) until the rest can decode RETRACT_STEPS more steps, and make admission
        conservative (ratio -> 1). A single request that still does not fit is a decode OOM."""
        order = sorted(self.running.values(), key=attrgetter("start_step"), reverse=True)
        n = 0
        for r in order:
            if self.kv_used + len(self.running) * RETRACT_STEPS <= self.s.kv_tokens or len(self.running) <= 1:
                break
            g = self.generated(r)
            del self.running[r.rid]
            self.kv_used -= r.input_len + g
            self.reserved -= r.output_len - g
            r.done, r.fresh, r.prefilled = g, True, 0
            self.waiting.appendleft(r)
            n += 1
        if n:
            self.retractions += n
            self.ratio = 1.0
        return n
