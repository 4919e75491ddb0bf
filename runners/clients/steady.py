"""The steady window of a level and its 95% confidence interval; when a level has measured enough.

Every client stream (slot) runs requests back to back. A `Cycle` is one request seen from its slot: from its start
to the start of the slot's next request (the slot's last request: to its own end), with the tokens it streamed.
Over cycles, a closed loop of `c` streams serves `c x sum(tokens) / sum(cycle time)` tokens per second
(renewal-reward / Little's law; phase-free: waves of equal requests do not bias it).

- Warm-up excluded: only requests started after the level's first completion count (the first wave and its
  ramp-up are left out). Selecting by start time, not by completion, keeps long requests in their share.
- Drain excluded: the idle tail of each stream after its last request is no cycle time; the streams that
  finished early do not dilute the rate of the ones still draining.
- The interval: the steady requests in start order are cut into `BATCHES` batches; the batch throughputs give a
  Student-t interval around the steady value.

When the steady requests do not yet hold one full wave (fewer than `c`: long queues, a level cut by its cap),
cycles would favour the streams that happened to cycle fast; `steady_window` then counts the tokens streamed
between the end of warm-up and the last request start instead (10 equal sub-windows give the interval).

`Control` decides on-line when a level may stop issuing requests: at least `min_prompts` requests and
`min_s` modeled seconds and steady requests of half a wave (c / 2), then as soon as the interval's half-width is
<= `precision` of the value, or at the `max_s` cap (then `capped`). With `server_clock` (the stand-in stamps its
clock on every chunk) elapsed time is read from the cycles (the latest time seen - the first start), else from
this host's clock.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from tunectl.stats import Interval, mean_interval

BATCHES = 10
MIN_SAMPLES = 5


@dataclass
class Cycle:
    start: float           # wall perf_counter seconds, or the server's clock x time scale (`server`)
    end: float
    next_start: float
    tokens: int            # tokens the server streamed (0 for a failed request)
    server: bool = False
    slot: int = -1         # the stream it ran on (-1: not known)


@dataclass
class Steady:
    interval: Interval     # modeled tokens/s with its 95% interval; n = batches
    samples: int           # steady requests
    window_s: float        # modeled seconds from the end of warm-up to the last steady request's successor


def steady(cycles: list[Cycle], concurrency: int, time_scale: float = 1.0) -> Steady | None:
    if not cycles:
        return None
    warm_end = min(c.end for c in cycles)
    st = sorted((c for c in cycles if c.start >= warm_end), key=lambda c: c.start)
    if len(st) < MIN_SAMPLES:
        return None
    k = min(BATCHES, len(st))
    if all(c.slot >= 0 and c.server for c in st) and len({c.slot for c in st}) >= k:   # the stand-in's clock
        batches = [[c for c in st if c.slot % k == j] for j in range(k)]
    else:
        batches = [st[i * len(st) // k:(i + 1) * len(st) // k] for i in range(k)]

    def rate(group: list[Cycle]) -> float:
        busy = sum(c.next_start - c.start for c in group)
        return concurrency * sum(c.tokens for c in group) / busy * time_scale if busy > 0 else 0.0

    value = rate(st)
    spread = mean_interval([rate(b) for b in batches])
    half = (spread.high - spread.low) / 2
    window = (max(c.next_start for c in st) - warm_end) / time_scale
    return Steady(Interval(value, value - half, value + half, k), len(st), window)


def steady_window(tokens: list[tuple[float, float]], starts: list[float], concurrency: int,
                  time_scale: float = 1.0, min_span: float = 0.0) -> Steady | None:
    """`tokens`: (time, count) of every streamed chunk; `starts`: request start times; warm-up ends with the first
    completion (the first stream's last chunk is not known here: the first request's start of a second wave).
    A window shorter than `min_span` (one request's latency: the streams have not cycled once) measures nothing."""
    if len(starts) <= concurrency or not tokens:
        return None
    ordered = sorted(starts)
    t_a, t_b = ordered[concurrency], ordered[-1]        # the first replacement request, the last request
    if t_b <= t_a or t_b - t_a < min_span:
        return None
    k = BATCHES
    width = (t_b - t_a) / k
    counts = [0.0] * k
    for t, n in tokens:
        if t_a <= t < t_b:
            counts[min(k - 1, int((t - t_a) / width))] += n
    rates = [x / width * time_scale for x in counts]
    iv = mean_interval(rates)
    value = sum(counts) / (t_b - t_a) * time_scale
    half = (iv.high - iv.low) / 2
    return Steady(Interval(value, value - half, value + half, k), sum(1 for s in starts if t_a <= s < t_b),
                  (t_b - t_a) / time_scale)


@dataclass
class StopRule:
    min_prompts: int                 # prompts_per_level waves (or min_prompts)
    min_s: float = 0.0               # modeled seconds
    precision: float = 0.03          # half-width / value
    max_s: float = 120.0             # modeled seconds: the cap
    max_prompts: int = 1 << 30


def settled(cycles: list[Cycle], rule: StopRule, concurrency: int, time_scale: float = 1.0) -> list[Cycle]:
    """The cycles the rule measures, decided on the server's clock: the Control's checks replayed in the order the
    cycles completed there, cut at the first check where the level had measured enough; the cycles completed by
    then count (what the server did up to that moment does not depend on this host: it waits for the client's
    requests; what it did after does, through the requests a late client still started). On a busy host the client reads the cycles late and starts a few requests more than
    the rule needed; those must not move the reading (the stand-in's noise drifts with the work done). Cycles on
    this host's clock (a real server) are returned as they are."""
    if not cycles or not all(c.server for c in cycles):
        return cycles
    cut = cut_point(cycles, rule, concurrency, time_scale)
    return cycles if cut is None else [c for c in cycles if c.next_start <= cut[0]]


def cut_point(cycles: list[Cycle], rule: StopRule, concurrency: int, time_scale: float = 1.0,
              horizon: float = math.inf, first: int = 0) -> tuple[float, bool] | None:
    """(the server time at which the level had measured enough, capped) from the cycles completed by `horizon`,
    checked every c/8 completions in the server's order (from the `first` completions on: those were checked);
    None: not yet."""
    done = sorted((c for c in cycles if c.next_start <= horizon), key=lambda c: (c.next_start, c.start))
    step = max(1, concurrency // 8)
    for n in range(step * (first // step + 1), len(done) + 1, step):
        seen, now = done[:n], done[n - 1].next_start
        started = sum(c.start <= now for c in cycles)
        elapsed = (now - min(c.start for c in seen)) / time_scale
        s = steady(seen, concurrency, time_scale)
        precise = s is not None and s.samples >= max(MIN_SAMPLES, concurrency // 2) and \
            s.interval.half_rel <= rule.precision
        if started >= rule.max_prompts or elapsed >= rule.max_s:
            return now, not precise
        if started >= rule.min_prompts and elapsed >= rule.min_s and precise:
            return now, False
    return None


@dataclass
class Control:
    rule: StopRule
    concurrency: int
    time_scale: float = 1.0
    t0: float | None = None           # the first request's start (client workers may take a while to start)
    server_clock: bool = False        # the cycles carry the server's clock: elapsed time is read from them
    cycles: list[Cycle] = field(default_factory=list)
    capped: bool = False
    stopped: bool = False
    _seen: int = -1
    _checked: int = 0                 # completions (server order) `cut_point` has checked
    _precise: bool = False
    _first: float = math.inf
    _latest: float = -math.inf

    def add(self, cycle: Cycle) -> None:
        self.cycles.append(cycle)
        if cycle.server:
            self._first = min(self._first, cycle.start)
            self._latest = max(self._latest, cycle.next_start, cycle.end)

    def done(self, started: int, now: float | None = None) -> bool:
        """True once the level has measured enough: no more requests are started."""
        if self.stopped:
            return True
        now = now if now is not None else time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        r = self.rule
        if self.server_clock:
            return self._settled(started)
        else:
            elapsed = (now - self.t0) / self.time_scale
        if started >= r.max_prompts or elapsed >= r.max_s:
            self.stopped, self.capped = True, not self._is_precise(force=True)
        elif started >= r.min_prompts and elapsed >= r.min_s and self._is_precise():
            self.stopped = True
        return self.stopped

    def _settled(self, started: int) -> bool:
        """On the server's clock: stop where `cut_point` says, read from the cycles every share has reported past
        (the same cut `settled` finds afterwards, however late this host delivers them)."""
        if started >= self.rule.max_prompts:
            self.stopped, self.capped = True, not self._is_precise(force=True)
        elif self.cycles and len(self.cycles) - self._seen >= max(1, self.concurrency // 8):
            self._seen = len(self.cycles)
            latest: dict[int, float] = {}
            for c in self.cycles:
                latest[c.slot // 100_000] = max(latest.get(c.slot // 100_000, -math.inf), c.next_start)
            horizon = min(latest.values())
            cut = cut_point(self.cycles, self.rule, self.concurrency, self.time_scale, horizon, self._checked)
            self._checked = sum(c.next_start <= horizon for c in self.cycles)
            if cut is not None:
                self.stopped, self.capped = True, cut[1]
        return self.stopped

    def _is_precise(self, force: bool = False) -> bool:
        n = len(self.cycles)
        if force or n - self._seen >= max(1, self.concurrency // 8):
            self._seen = n
            s = steady(self.cycles, self.concurrency, self.time_scale)
            self._precise = s is not None and s.samples >= max(MIN_SAMPLES, self.concurrency // 2) and \
                s.interval.half_rel <= self.rule.precision and not math.isinf(s.interval.half_rel)
        return self._precise
