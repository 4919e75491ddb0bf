"""Server-side witnesses of a level's throughput, to cross-check the client.

Two witnesses, where the server offers them:
- SGLang's Prometheus endpoint (`--enable-metrics`, `GET /metrics`), read before and after the level: the tokens
  the server generated (`sglang:generation_tokens_total`) against those the client counted, and the server's mean
  TTFT (`sglang:time_to_first_token_seconds` sum / count) beside the client's.
- its `Decode batch, #running-req: N, ..., gen throughput (token/s): X` log lines: time-weighted over the level
  (each line covers about the decode log interval x N tokens, N averaged between the line and the one before, so
  its time is tokens / X), the server's view of the rate. Approximate: on a real H200 at 512 streams with bursty
  admission it read 27% below the real client's whole run (47% before the trapezoid) (docs/real-gpu.md); the Prometheus
  counter is exact.

`Witness.start(...)` before the level and `.finish(...)` after it give a dict: `server_generation_tokens`,
`gap_tokens`, `server_mean_ttft_ms`, `log_gen_throughput`, `gap_log` (client / server - 1; `compared` says which
client reading: its steady window, or the whole run for a client that has none, e.g. sglang.bench_serving), and `flag`
when a gap is above `DISAGREE` (5%): "client_bound" when the client also saw itself saturated, else "disagree" (the
network, or a measurement bug). A witness the server does not offer is left out; never an error.
"""
from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass
from typing import Any

DISAGREE = 0.05
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def scrape(base_url: str, timeout_s: float = 2.0) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
            return parse_prometheus(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def log_rate(lines: list[tuple[int, float]]) -> float | None:
    """Time-weighted gen throughput of a level's decode log lines [(running requests, gen throughput)]. A line's
    interval holds about the decode log interval x the mean of the running requests at its start (the line
    before) and at its end tokens (trapezoid: under bursty admission the count at the end alone overstates an
    interval that began nearly empty); its time is that / X. The first line spans the idle time before the level
    and the last one the drain: neither is an interval of the level."""
    spans = [((a + b) / 2, x) for (a, _), (b, x) in zip(lines[:-2], lines[1:-1]) if a + b > 0 and x > 0]
    if not spans:
        return None
    return sum(n for n, _ in spans) / sum(n / x for n, x in spans)


@dataclass
class Witness:
    snap0: dict[str, float] | None = None
    lines0: int = 0

    @classmethod
    def start(cls, base_url: str, decode_lines: int, metrics: bool) -> Witness:
        return cls(scrape(base_url) if metrics else None, decode_lines)

    def finish(self, base_url: str, decode_lines: list[tuple[int, float]], client: dict[str, float],
               client_tokens: int | None, client_bound: bool) -> dict[str, Any]:
        """`client`: the level's metrics (bench_serving names, plus steady_output_throughput); `client_tokens`:
        every token the client counted, warm-up requests included (None: unknown, not compared)."""
        out: dict[str, Any] = {}
        snap1 = scrape(base_url) if self.snap0 is not None else None
        if self.snap0 is not None and snap1:
            d = {k: snap1.get(k, 0.0) - self.snap0.get(k, 0.0) for k in snap1}
            gen = d.get("sglang:generation_tokens_total")
            if gen:
                out["server_generation_tokens"] = int(gen)
                if client_tokens is not None:
                    out["gap_tokens"] = _gap(client_tokens, gen)
            if snap1.get("sglang:spec_accept_length"):         # a gauge: the server's latest reading
                out["server_spec_accept_length"] = snap1["sglang:spec_accept_length"]
            n = d.get("sglang:time_to_first_token_seconds_count")
            if n:
                out["server_mean_ttft_ms"] = d["sglang:time_to_first_token_seconds_sum"] / n * 1000
        rate = log_rate(decode_lines[self.lines0:])
        steady = client.get("steady_output_throughput")
        reading = steady or client.get("output_throughput")     # a client without a steady window: its whole run
        if rate is not None and reading:
            out["log_gen_throughput"] = rate
            out["gap_log"] = _gap(reading, rate)
            out["compared"] = "steady" if steady else "whole_run"
        gaps = [abs(out[k]) for k in ("gap_tokens", "gap_log") if k in out]
        if gaps and max(gaps) > DISAGREE:
            out["flag"] = "client_bound" if client_bound else "disagree"
        return out


def accept_length(values: list[float | None]) -> float | None:
    """A level's speculative acceptance length from its decode lines' `accept len` (each over the rounds since the
    line before): their mean, the first line left out when there are more (it spans the time before the level)."""
    vals = [v for v in values if v is not None]
    vals = vals[1:] if len(vals) > 1 else vals
    return sum(vals) / len(vals) if vals else None


def _gap(client: float, server: float) -> float:
    return (client - server) / server if server > 0 else 0.0


class Pulse:
    """Is the server itself stuck, or only its client? Asked when no token reached the client for a while.

    With a Prometheus endpoint: a hang needs the server to answer and its `sglang:generation_tokens_total` to stand
    still for `hang_s`; a counter that moved means the client (or this host) stalled, and a server that does not
    answer at all (a starved host) is not evidence of a hang either: the process checks catch a dead server.
    Without the endpoint the client's and the log's silence is all there is."""

    def __init__(self, base_url: str, metrics: bool):
        self.url, self.metrics = base_url, metrics
        self.seen: tuple[float, float] | None = None      # (counter, when it last moved)

    def stuck(self, now: float, hang_s: float) -> bool:
        if not self.metrics:
            return True
        snap = scrape(self.url, timeout_s=min(2.0, hang_s))
        if snap is None or "sglang:generation_tokens_total" not in snap:
            return False
        gen = snap["sglang:generation_tokens_total"]
        if self.seen is None or gen != self.seen[0]:
            self.seen = (gen, now)
            return False
        return now - self.seen[1] >= hang_s
