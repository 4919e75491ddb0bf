"""Per-request records -> the metrics of `sglang.bench_serving`, with its key names.

Definitions (SGLang `calculate_metrics`): only successful requests count; TTFT = first chunk with text;
TPOT = (latency - ttft) / (output_len - 1), only for output_len > 1 (excludes the first token); ITL = the gap
between chunks (native `/generate`: the gap spread evenly over the new tokens of the chunk; OpenAI
completions: one value per chunk); E2E latency = last chunk - request start; concurrency = sum(e2e) /
duration; max_output_tokens_per_s / max_concurrent_requests from 1-second buckets. Percentiles are numpy's
(linear). All times here are in modeled seconds (wall / time_scale). Keys not computable without a tokenizer
(`*_retokenized`, `accept_length`) are left out; latency keys are left out when no request succeeded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tunectl.goodput import attainment_metrics, meets

LATENCY_KEYS = ("e2e_latency", "ttft", "tpot", "itl")
STATS = ("mean", "median", "std", "p90", "p95", "p99")
COUNT_KEYS = ("duration", "completed", "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
              "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
              "total_throughput", "concurrency", "max_output_tokens_per_s", "max_concurrent_requests",
              "max_concurrency")
METRIC_KEYS = COUNT_KEYS + tuple(f"{s}_{m}_ms" for m in LATENCY_KEYS for s in STATS)


@dataclass
class ReqRecord:
    """One request as the client saw it; times are wall perf_counter seconds."""

    input_len: int
    start: float = 0.0
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    output_len: int = 0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def _stats(name: str, values: list[float], scale: float) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, dtype=float) * (1000.0 / scale)
    out = {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
           f"std_{name}_ms": float(a.std())}
    out.update({f"p{p}_{name}_ms": float(np.percentile(a, p)) for p in (90, 95, 99)})
    return out


def _peaks(ok: list[ReqRecord], scale: float) -> tuple[float, int]:
    if not ok:
        return 0.0, 0
    t0 = min(r.start for r in ok)
    n = math.ceil((max(r.start + r.latency for r in ok) - t0) / scale) + 1
    tokens, conc = np.zeros(n), np.zeros(n)
    for r in ok:
        times = np.cumsum([r.ttft, *r.itl]) + (r.start - t0)
        idx = (times / scale).astype(int)
        np.add.at(tokens, idx[(idx >= 0) & (idx < n)], 1)
        lo, hi = int((r.start - t0) / scale), int((r.start + r.latency - t0) / scale)
        conc[lo:min(hi + 1, n)] += 1
    return float(tokens.max()), int(conc.max())


def compute_metrics(records: list[ReqRecord], duration_wall: float, time_scale: float,
                    max_concurrency: int) -> dict[str, float]:
    ok = [r for r in records if r.success]
    dur = max(duration_wall / time_scale, 1e-9)
    total_in = sum(r.input_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    peak_tok, peak_conc = _peaks(ok, time_scale)
    m: dict[str, float] = {
        "duration": dur, "completed": len(ok), "total_input_tokens": total_in, "total_input_text_tokens": total_in,
        "total_input_vision_tokens": 0, "total_output_tokens": total_out, "request_throughput": len(ok) / dur,
        "input_throughput": total_in / dur, "output_throughput": total_out / dur,
        "total_throughput": (total_in + total_out) / dur,
        "concurrency": sum(r.latency for r in ok) / time_scale / dur,
        "max_output_tokens_per_s": peak_tok, "max_concurrent_requests": peak_conc,
        "max_concurrency": max_concurrency,
    }
    m.update(_stats("e2e_latency", [r.latency for r in ok], time_scale))
    m.update(_stats("ttft", [r.ttft for r in ok], time_scale))
    m.update(_stats("tpot", [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1],
                    time_scale))
    m.update(_stats("itl", [x for r in ok for x in r.itl], time_scale))
    return m


def slo_metrics(records: list[ReqRecord], slo: dict[str, float], planned: int, duration_wall: float,
                time_scale: float) -> dict[str, float]:
    """`slo_attainment` and `goodput` (tunectl.goodput): each request's own TTFT, TPOT, E2E latency and largest
    inter-token gap against the limits, in modeled ms; failed requests never meet them."""
    ms = 1000.0 / time_scale
    met = sum(meets(r.ttft * ms, (r.latency - r.ttft) / max(1, r.output_len - 1) * ms, r.latency * ms,
                    max(r.itl, default=0.0) * ms, slo) for r in records if r.success)
    return attainment_metrics(met, planned, duration_wall / time_scale)
