"""Continuous batching over a resolved Setup: the one scheduler both the live stand-in and the virtual model run.

The scheduler does not know about clocks: `next_step()` decides and applies one step and returns its modeled
duration; the caller advances its own clock (asyncio in scaled wall time, or a virtual counter).
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from tunectl.sim.card import Setup

BLOCK = 64   # radix cache granularity of the stand-in (tokens)


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


PT1_EXC = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"
DECODE_OOM_EXC = "RuntimeError: Decode out of memory. Try to lower your batch size."


class Scheduler:
    def __init__(self, setup: Setup, seed: int = 0):
        self.s = setup
        self.rng = random.Random(seed)
        self.waiting: deque[Req] = deque()
        self.running: dict[int, Req] = {}
        self._finish: list[tuple[int, int]] = []
        self.counter = 0
        self.kv_used = 0
        self.radix: set[object] = set()
        self.hung = False

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def generated(self, r: Req) -> int:
        return 0 if r.start_step < 0 else min(r.output_len, 1 + self.counter - r.start_step)

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def flush_cache(self) -> None:
        self.radix.clear()

    def next_step(self) -> Step | None:
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
        ratio = self.s.card["admission"]["new_token_ratio"]
        while self.waiting and budget > 0 and len(self.running) + len(batch) < self.s.max_running:
            r = self.waiting[0]
            if r.fresh:
                need = r.input_len - self._radix_hit(r) + ratio * r.output_len
                if self.kv_used + need > self.s.kv_tokens and (self.running or batch):
                    break
                r.fresh = False
                r.cached = r.prefilled = self._radix_hit(r)
                cached += r.cached
                self.kv_used += r.cached
            take = min(r.input_len - r.prefilled, budget)
            prefix_sum += r.prefilled
            r.prefilled += take
            tokens, budget = tokens + take, budget - take
            self.kv_used += take
            batch.append(r)
            if r.prefilled < r.input_len:
                break
            self.waiting.popleft()
        if not batch:
            return None
        step = Step("prefill", self.s.prefill_ms(tokens), new_seq=len(batch), new_tokens=tokens,
                    cached_tokens=cached)
        step.crash = self._pt1_crash(len(batch), len(self.running), prefix_sum)
        for r in batch:
            if r.prefilled >= r.input_len:
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
        return min(n * BLOCK, r.input_len - 1)

    def _join(self, r: Req, step: Step) -> None:
        if self.s.radix:
            self.radix.update(r.block_keys)
        r.start_step = self.counter
        self.kv_used += 1
        step.joined.append(r)
        if r.output_len <= 1:
            step.finished.append(r)
            self.kv_used -= r.input_len + 1
            return
        self.running[r.rid] = r
        heapq.heappush(self._finish, (self.counter + r.output_len - 1, r.rid))

    def _pt1_crash(self, n: int, running: int, prefix_sum: int) -> RuntimeCrash | None:
        if not self.s.pt1_prone:
            return None
        gap = self.s.pt1_threshold - prefix_sum
        if gap <= 0:
            return RuntimeCrash("page_table_1_flattened", PT1_EXC)
        if running == 0:
            return None
        cfg = self.s.card["page_table_1_flattened"]
        hazard = (n / cfg["ref_batch_reqs"]) * math.exp(-gap / (cfg["tokens_per_running"] * running))
        if self.rng.random() < 1.0 - math.exp(-hazard):
            return RuntimeCrash("page_table_1_flattened", PT1_EXC)
        return None

    # -------------------------------------------------------------------------------------- decode
    def _decode(self) -> Step:
        bs = len(self.running)
        if self.s.hang and bs >= self.s.card["hang"]["min_bs"]:
            self.hung = True
            return Step("hang", 0.0, bs=bs)
        step = Step("decode", self.s.decode_ms(bs), bs=bs, graph=self.s.graph_used(bs))
        self.counter += 1
        self.kv_used += bs
        if self.kv_used > self.s.kv_tokens:
            step.crash = RuntimeCrash("decode_oom", DECODE_OOM_EXC)
        while self._finish and self._finish[0][0] <= self.counter:
            _, rid = heapq.heappop(self._finish)
            r = self.running.pop(rid)
            self.kv_used -= r.input_len + r.output_len
            step.finished.append(r)
        return step
