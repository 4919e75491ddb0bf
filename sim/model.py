"""Virtual-clock evaluation of the stand-in's performance and crash model (pure, no I/O, milliseconds per call).

The same `Setup` and `Scheduler` the live stand-in runs, driven by a closed-loop client like
`sglang.bench_serving --max-concurrency c` in a virtual clock. Used by search-efficiency benchmarks and tests.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tunectl.sim.card import Card, load_card
from tunectl.sim.power import Meter
from tunectl.sim.sched import BLOCK, Req, RuntimeCrash, Scheduler, block_keys
from tunectl.sim.setup import Setup, StartupCrash, resolve

__all__ = ["LevelOutcome", "VirtualLadder", "best_stable", "load_card", "resolve", "virtual_ladder"]


@dataclass
class LevelOutcome:
    concurrency: int
    output_throughput: float | None      # tok/s; None when the server crashed during this level
    completed: int = 0
    duration_s: float = 0.0
    mean_ttft_ms: float = 0.0
    p99_ttft_ms: float = 0.0
    # decode batches as the server logs them (sim/transcript.py): the level's largest, then the one with the
    # fullest KV pool; each (running requests, ran as a CUDA graph, queued requests, KV tokens in use, pool share)
    decode: list[tuple[int, bool, int, int, float]] = field(default_factory=list)
    spec_accept_length: float | None = None   # speculative decoding: tokens per round (None: off)
    gpu_power_w: float | None = None          # mean board power per GPU over the level (sim/power.py; None: no card power)


@dataclass
class VirtualLadder:
    levels: list[LevelOutcome] = field(default_factory=list)
    startup_s: float = 0.0                    # modeled seconds to ready (up to the crash if it crashed)
    startup_crash: StartupCrash | None = None
    crash: RuntimeCrash | None = None
    crash_level: int | None = None
    retractions: int = 0                      # requests sent back to the queue because the KV pool was full
    setup: Setup | None = None                # what the flags resolved to (sim/transcript.py renders its log)

    @property
    def crashed(self) -> bool:
        return self.startup_crash is not None or self.crash is not None

    @property
    def signature(self) -> str | None:
        c = self.startup_crash or self.crash
        return c.signature if c else None

    @property
    def best(self) -> float:
        return max((lv.output_throughput or 0.0 for lv in self.levels), default=0.0)

    def at(self, concurrency: int) -> float | None:
        return next((lv.output_throughput for lv in self.levels if lv.concurrency == concurrency), None)


Conversation = list[tuple[list[int], int]]          # turns of (prompt token ids, output length)


def virtual_ladder(card: Card | str, config: dict[str, Any], env: dict[str, str] | None = None,
                   patches: Iterable[str] = (), levels: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                   workload_kind: str = "random", input_len: int = 256, output_len: int = 128, seed: int = 0,
                   prompts_per_level: int = 1, min_prompts: int = 8, shared_prefix_len: int = 2048,
                   range_ratio: float = 1.0, turns: int = 1,
                   draw: Callable[[random.Random], tuple[int, int]] | None = None,
                   conversations: Callable[[int, int], list[Conversation]] | None = None,
                   noise: float = 1.0, sglang_version: str = "0.5.9",
                   machine: tuple[int | str, int] | None = None) -> VirtualLadder:
    """`range_ratio` < 1: each request's lengths drawn from [len x ratio, len] like `bench_serving
    --random-range-ratio`, so requests do not finish in lockstep waves; `draw(rng)`: (input, output) lengths
    drawn otherwise. `turns` > 1: conversations whose every turn resends the history (the previous prompt, its
    answer, a new message), one stream each, as the built-in client sends them. `conversations(level, n)`: a
    dataset's requests as token ids (their prefixes hashed like the live stand-in's); else synthetic prompts, whose
    random ids share nothing but the shared prefix and the history (so their blocks are named, not hashed).
    `noise`: the card's launch and drift noise x this, seeded by `seed` (0: the noise-free model, the true value).
    `sglang_version`: the version played (sim/spec.py). `machine`: the machine state's (key, launch index)
    (sim/noise.py `machine_state`; default: `seed`'s first)."""
    card = load_card(card) if isinstance(card, str) else card
    setup = resolve(card, config, env, list(patches), sglang_version)
    out = VirtualLadder(startup_s=setup.startup_s(), startup_crash=setup.crash, setup=setup)
    if setup.crash is not None:
        return out
    if setup.spec is not None:
        setup.spec.use_workload(workload_kind)      # the draft's acceptance on this workload (card `speculative:`)
    sched, rng = Scheduler(setup, seed, noise, machine=machine), random.Random(seed)
    rid, convs = itertools.count(), itertools.count()

    def length(n: int) -> int:
        return n if range_ratio >= 1.0 else rng.randint(max(1, int(n * range_ratio)), n)

    lengths = (lambda: draw(rng)) if draw is not None else (lambda: (length(input_len), length(output_len)))
    shared = shared_prefix_len if workload_kind == "shared_prefix" else 0
    for c in levels:
        n = max(min_prompts, prompts_per_level * c)
        if conversations is not None:
            reqs = [[Req(next(rid), max(1, len(ids)), out_len, block_keys(ids)) for ids, out_len in conv]
                    for conv in conversations(c, n)]
        else:
            reqs = _synthetic(n, turns, shared, lengths, rid, convs)
        level, crash = _run_level(sched, setup, c, reqs)
        level.spec_accept_length = setup.spec.accept_len() if setup.spec is not None else None
        out.levels.append(level)
        if crash is not None:
            out.crash, out.crash_level = crash, c
            break
    out.retractions = sched.retractions
    return out


def _synthetic(n: int, turns: int, shared: int, lengths: Callable[[], tuple[int, int]],
               rid: Iterator[int], convs: Iterator[int]) -> list[list[Req]]:
    """`n` requests in conversations of `turns`: blocks wholly in the shared prefix are common to all, the others
    are the conversation's own (a later turn holds every block of the turn before it)."""
    out: list[list[Req]] = []
    made = 0
    while made < n:
        k, chain, length, answer = next(convs), [], shared, 0
        for _ in range(min(turns, n - made)):
            new_in, new_out = lengths()
            length += answer + new_in
            keys: list[object] = [("shared", i) for i in range(shared // BLOCK)]
            if turns > 1:
                keys += [(k, i) for i in range(shared // BLOCK, length // BLOCK)]
            chain.append(Req(next(rid), length, new_out, keys))
            answer = new_out
        out.append(chain)
        made += len(chain)
    return out


def _run_level(sched: Scheduler, setup: Setup, c: int,
               convs: list[list[Req]]) -> tuple[LevelOutcome, RuntimeCrash | None]:
    """Closed loop: `c` streams, each sending a conversation's turns in order, then the next conversation."""
    now = start = 0.0
    todo = list(reversed(convs))
    after: dict[int, list[Req]] = {}

    def send(chain: list[Req]) -> None:
        chain[0].arrival = now
        after[chain[0].rid] = chain[1:]
        sched.add(chain[0])

    for _ in range(min(c, len(todo))):
        send(todo.pop())
    total = sum(len(x) for x in convs)
    done: list[Req] = []
    meter = Meter(setup.card)
    peak: tuple[int, bool, int, int, float] | None = None
    full: tuple[int, bool, int, int, float] | None = None
    while len(done) < total:
        step = sched.next_step()
        if step is None:
            break
        if step.kind == "hang":
            return LevelOutcome(c, None), RuntimeCrash("watchdog_timeout", _watchdog_text(setup))
        now += step.ms / 1000.0
        meter.step(setup, now, step.kind, step.bs, step.ms)
        if step.crash is not None:
            return LevelOutcome(c, None, len(done), now - start), step.crash
        if step.kind == "decode":
            snap = (step.bs, step.graph, len(sched.waiting), sched.kv_used, sched.kv_used / max(1, setup.kv_tokens))
            if peak is None or step.bs > peak[0]:
                peak = snap
            if full is None or snap[3] >= full[3]:
                full = snap
        for r in step.joined:
            r.first_token_t = now if r.first_token_t is None else r.first_token_t
        for r in step.finished:
            r.finish_t = now
            done.append(r)
            rest = after.pop(r.rid, [])
            if rest or todo:
                send(rest or todo.pop())
    dur = max(now - start, 1e-9)
    ttfts = sorted((r.first_token_t or 0.0) - r.arrival for r in done)
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else 0.0
    tput = sum(r.output_len for r in done) / dur
    decode = [x for x in (peak, full) if x is not None]
    return LevelOutcome(c, tput, len(done), dur, 1000 * sum(ttfts) / max(1, len(ttfts)), 1000 * p99,
                        decode[:1] if full == peak else decode, gpu_power_w=meter.average(start, 0.0, now)), None


def _watchdog_text(setup: Setup) -> str:
    return f"Scheduler watchdog timeout (self.watchdog_timeout={setup.watchdog_s:g}, self.soft=False)"


def best_stable(card: Card | str, base: dict[str, Any], space: dict[str, list[Any]],
                patch_knobs: dict[str, str] | None = None, seeds: Iterable[int] = (0, 1, 2),
                **ladder_kw: Any) -> tuple[float, dict[str, Any]]:
    """Exhaustive search over `space` (flag -> choices; a knob named in `patch_knobs` maps to a patch id and
    takes booleans). Stable = no crash on any seed; noise-free unless `noise` is given. Returns (best stable peak throughput, its assignment)."""
    card = load_card(card) if isinstance(card, str) else card
    patch_knobs, seeds = patch_knobs or {}, list(seeds)
    best: tuple[float, dict[str, Any]] = (0.0, {})
    names = list(space)
    for values in itertools.product(*(space[n] for n in names)):
        assign = dict(zip(names, values))
        config = {**base, **{k: v for k, v in assign.items() if k not in patch_knobs}}
        patches = [patch_knobs[k] for k, v in assign.items() if k in patch_knobs and v]
        peaks = []
        for sd in seeds:
            lad = virtual_ladder(card, config, patches=patches, seed=sd, **{"noise": 0.0, **ladder_kw})
            if lad.crashed:
                break
            peaks.append(lad.best)
        if len(peaks) == len(seeds) and min(peaks) > best[0]:
            best = (min(peaks), assign)
    return best
