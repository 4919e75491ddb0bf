"""Open-loop arrivals, SLO attainment and the capacity search: one definition for the live client and the
virtual model.

- `arrival_times(n, rate, burstiness, seed)`: send offsets in seconds, as `sglang.bench_serving --request-rate R`
  sends them (the first request at 0, then a gap after each: exponential with mean 1/R, i.e. Poisson arrivals),
  or gamma gaps with shape `burstiness` and the same mean 1/R when burstiness != 1 (vLLM's `--burstiness`; SGLang
  0.5.9's bench_serving has no such flag): the gaps' coefficient of variation is 1/sqrt(burstiness).
- `meets(ttft_ms, tpot_ms, e2e_ms, itl_ms, slo)`: one request against the objective's `slo` limits. A limit
  named after a percentile or a median (`p99_ttft_ms`, `median_tpot_ms`) is read as the request's own value:
  attainment is the share of requests within every limit (a failed request never is).
- `bracket(probe, start, tolerance, max_probes, integer)`: the highest load at which `probe(load)` passes. From
  `start`, doubles until a probe fails (or halves until one passes), then bisects between the last pass and the
  first fail until hi/lo - 1 <= tolerance; a failing end that is the only failure is probed a second time before
  the bracket closes on it (passing then, the search goes on upwards). Returns the probes in the order tried.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunectl.models import LevelResult

SLO_METRIC = {"ttft": 0, "tpot": 1, "e2e_latency": 2, "itl": 3}


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    if burstiness == 1.0:
        gaps = rng.exponential(1.0 / rate, n - 1)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def slo_metric(key: str) -> str:
    """`p99_ttft_ms` -> `ttft`; `median_tpot_ms` -> `tpot`; `p99_e2e_latency_ms` -> `e2e_latency`."""
    return key.split("_", 1)[1].removesuffix("_ms")


def meets(ttft_ms: float, tpot_ms: float, e2e_ms: float, itl_ms: float, slo: dict[str, float]) -> bool:
    values = (ttft_ms, tpot_ms, e2e_ms, itl_ms)
    return all(values[SLO_METRIC[slo_metric(k)]] <= limit for k, limit in slo.items())


def attainment_metrics(met: int, planned: int, duration_s: float) -> dict[str, float]:
    """`slo_attainment` (share of the planned requests within every limit) and `goodput` (those per second)."""
    return {"slo_attainment": met / planned if planned else 0.0, "goodput": met / max(duration_s, 1e-9)}


@dataclass
class Probe:
    load: float
    passed: bool
    attainment: float
    stop: str = ""                 # the probe decides nothing and ends the search (why: "crash", "client_bound")


@dataclass
class Bracket:
    capacity: float | None                       # the highest load that passed; None: not even the lowest
    probes: list[Probe] = field(default_factory=list)
    low: float | None = None                     # the final bracket: passed at low, failed at high
    high: float | None = None
    stopped: str = ""                            # why it ended before the tolerance ("max_probes", "crash", ...)
    runs: list[list[Any]] = field(default_factory=list)   # every level run: [load, passed, attainment, note]


def _mid(lo: float, hi: float, integer: bool) -> float:
    if integer:
        return float((int(lo) + int(hi)) // 2)
    mid = float(f"{math.sqrt(lo * hi):.3g}")          # 3 digits: readable rates
    return mid if lo < mid < hi else math.sqrt(lo * hi)


def bracket(probe: Callable[[float], Probe], start: float, tolerance: float, max_probes: int,
            integer: bool = False) -> Bracket:
    """A probe with `stop` set ends the search (the server crashed, the client could not send the load): the
    bracket so far is the answer.

    A bracket whose failing end is the only load that failed so far is probed there once more before it closes:
    one stall of the host fails a single probe far below the capacity, and every later probe then passes while
    bisecting under it. If the second run passes, the search goes on upwards. Where two loads failed, the
    answer stands (a second run of a marginal failure would only read the border higher by luck)."""
    out = Bracket(None)
    lo: float | None = None
    hi: float | None = None
    fails: dict[float, int] = {}                 # load -> how often it failed (a refuted failure is dropped)
    load = float(max(1, round(start))) if integer else start
    while len(out.probes) < max_probes:
        p = probe(load)
        if p.stop:
            out.stopped = p.stop
            break
        out.probes.append(p)
        if not p.passed:
            fails[load] = fails.get(load, 0) + 1
        lo, hi = (load, hi) if p.passed else (lo, load)
        if p.passed and hi is not None and load >= hi:
            hi = None                            # the only failure passed when probed again: refuted
            fails.pop(load, None)
        if lo is not None and hi is not None:
            if hi / lo - 1 <= tolerance or (integer and hi - lo <= 1):
                if fails[hi] > 1 or len(fails) > 1:
                    break
                load = hi                        # confirm the failing end before closing on it
                continue
            load = _mid(lo, hi, integer)
        elif lo is not None:
            load = lo * 2
        elif integer and hi is not None and hi <= 1:
            break
        else:
            load = max(1.0, float(int(load) // 2)) if integer else load / 2
    else:
        out.stopped = "max_probes"
    out.capacity, out.low, out.high = lo, lo, hi
    return out


def capacity_words(cap: dict[str, Any]) -> str:
    """A capacity record's answer: "12.3 req/s", "at least 64 req/s" (the search stopped early, or never failed),
    "below 2 req/s" (not even the lowest load passed), "not found"."""
    unit = "req/s" if cap["by"] == "rate" else "concurrent requests"
    if cap["capacity"] is None:
        return f"below {cap['high']:.4g} {unit}" if cap["high"] is not None else "not found"
    return ("at least " if cap["stopped"] or cap["high"] is None else "") + f"{cap['capacity']:.4g} {unit}"


def capacity_record(br: Bracket, by: str, tolerance: float, slo: dict[str, float], share: float) -> dict[str, object]:
    """What a trial keeps of its capacity search (TrialResult.capacity)."""
    return {"by": by, "capacity": br.capacity, "low": br.low, "high": br.high, "tolerance": tolerance,
            "slo": dict(slo), "slo_attainment": share, "stopped": br.stopped,
            "probes": [[p.load, p.passed, round(p.attainment, 4)] for p in br.probes],
            "runs": [list(r) for r in br.runs]}


NOISE_SHARE = 0.25     # a latency within 4x of the client's timing floor is mostly the host's jitter


def jitter_bound(lv: LevelResult) -> bool:
    """An open-loop level whose median TTFT is within 4x of its timing floor (`timing_floor_ms`: the client's
    timing resolution on the server's clock; on the stand-in 5 ms of wall time / its time scale)."""
    floor, ttft = lv.metrics.get("timing_floor_ms"), lv.metrics.get("median_ttft_ms")
    return bool(floor and ttft and floor >= NOISE_SHARE * ttft)


def slo_within_jitter(levels: list[LevelResult], slo: dict[str, float]) -> float | None:
    """The levels' timing floor (modeled ms) when it is a fair share of the SLO's tightest latency limit, so that
    pass or fail reads the host's jitter more than the config; else None."""
    floor = max((lv.metrics.get("timing_floor_ms", 0.0) for lv in levels), default=0.0)
    tightest = min((v for k, v in slo.items() if slo_metric(k) != "tpot"), default=0.0)   # TPOT: averaged
    return floor if floor and tightest and floor >= NOISE_SHARE * tightest else None


def level_requests(rate: float, min_prompts: int, min_level_s: float) -> int:
    """Requests in a rate level: at least `min_prompts`, and `min_level_s` (modeled) seconds of arrivals."""
    return max(min_prompts, math.ceil(rate * min_level_s))


def level_load(lv: LevelResult, by: str) -> float:
    return float(lv.request_rate or 0.0) if by == "rate" else float(lv.concurrency)


def capacity_of(levels: list[LevelResult], share: float, by: str = "rate") -> LevelResult | None:
    """The level with the highest load whose SLO attainment is at least `share` (what a bracket ends on)."""
    ok = [lv for lv in levels if lv.metrics.get("slo_attainment", 0.0) >= share and lv.status == "ok"
          and (by != "rate" or lv.request_rate is not None)]
    return max(ok, key=lambda lv: level_load(lv, by), default=None)
