"""The stand-in's Prometheus endpoint (`--enable-metrics`), with SGLang's metric names and text format.

`GET /metrics` serves, labelled `model_name`: `sglang:prompt_tokens_total`, `sglang:cached_tokens_total` (radix
cache hits, `cache_source="device"`) and `sglang:generation_tokens_total` (counters), `sglang:cache_hit_rate`,
`sglang:gen_throughput`, `sglang:num_running_reqs`, `sglang:num_queue_reqs` (gauges) and
`sglang:time_to_first_token_seconds` (histogram, SGLang's default buckets). Times are modeled seconds, like every
latency the stand-in reports. Without `--enable-metrics` there is no `/metrics` (404), as on SGLang.
"""
from __future__ import annotations

from dataclasses import dataclass, field

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0,
                20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0, 200.0, 400.0)


@dataclass
class Metrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0                 # prompt tokens found in the radix cache (not prefilled)
    cache_hit_rate: float = 0.0            # the last prefill batch's cached / (cached + new) tokens
    generation_tokens: int = 0
    gen_throughput: float = 0.0
    running: int = 0
    queued: int = 0
    spec_accept_length: float = 0.0        # 0 without speculative decoding, as SGLang's gauge reads then
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_n: int = 0

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_n += 1
        for i, le in enumerate(TTFT_BUCKETS):
            if seconds <= le:
                self.ttft_counts[i] += 1
                break

    def render(self, model: str) -> str:
        lab = f'model_name="{model}"'
        out: list[str] = []

        def one(name: str, kind: str, help_: str, value: float) -> None:
            out.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} {kind}",
                        f"sglang:{name}{{{lab}}} {float(value)}"])

        one("prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens)
        out += ["# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).",
                "# TYPE sglang:cached_tokens_total counter",
                f'sglang:cached_tokens_total{{{lab},cache_source="device"}} {float(self.cached_tokens)}']
        one("cache_hit_rate", "gauge", "The prefix cache hit rate.", self.cache_hit_rate)
        one("generation_tokens_total", "counter", "Number of generation tokens processed.", self.generation_tokens)
        one("gen_throughput", "gauge", "The generation throughput (token/s).", self.gen_throughput)
        one("num_running_reqs", "gauge", "The number of running requests.", self.running)
        one("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", self.queued)
        one("spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
            self.spec_accept_length)
        name = "sglang:time_to_first_token_seconds"
        out += [f"# HELP {name} Histogram of time to first token in seconds.", f"# TYPE {name} histogram",
                f"{name}_sum{{{lab}}} {self.ttft_sum}"]
        seen = 0
        for le, n in zip(TTFT_BUCKETS, self.ttft_counts):
            seen += n
            out.append(f'{name}_bucket{{le="{le}",{lab}}} {float(seen)}')
        out += [f'{name}_bucket{{le="+Inf",{lab}}} {float(self.ttft_n)}', f"{name}_count{{{lab}}} {float(self.ttft_n)}"]
        return "\n".join(out) + "\n"
