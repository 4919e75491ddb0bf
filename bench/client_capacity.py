"""How many streamed tokens/s can the built-in client measure without biasing ITL?

Starts the fake SGLang server of known cadence (tests.helpers.fakeserver: one chunk every --itl-ms per
stream, several processes sharing the port, optionally pinned to their own cores) and runs the built-in client
(`tunectl.runners.clients.builtin.run_level`) at each concurrency x processes point, then prints one table row per
point: streamed tok/s, the server's real send gaps (p50/p99: the cadence including the fake server's own jitter) vs
the ITL the client measured, the client's p99 bias against that truth and against the nominal cadence, the
client's event-loop lag and CPU use, and whether the client flagged itself as client-bound.

    python bench/client_capacity.py                       # defaults: 20 ms cadence, 256 output tokens
    python bench/client_capacity.py --points 512:1,1024:auto --server-workers 8 --server-cpus 8-15 --client-cpus 0-7
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import fakeserver as fake
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.builtin import run_level

HEADER = ("concurrency", "processes", "streamed tok/s", "ITL p50 server/client ms", "ITL p99 server/client ms",
          "p99 bias % (vs server)", "p99 bias % (vs nominal)", "loop lag p99 ms", "client CPU max", "client_bound",
          "failed")


def _cpus(spec: str | None) -> set[int] | None:
    if not spec:
        return None
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _points(spec: str) -> list[tuple[int, int | str]]:
    pts = []
    for item in spec.split(","):
        conc, _, procs = item.partition(":")
        pts.append((int(conc), procs if procs == "auto" or not procs else int(procs)))
    return [(c, p or "auto") for c, p in pts]


def _server_gaps(stats_dir: str) -> list[int]:
    time.sleep(0.7)                         # the workers dump their histograms every 0.5 s
    return fake.read_gaps(stats_dir)


def measure(url: str, conc: int, procs: int | str, args: argparse.Namespace) -> tuple[str, ...]:
    spec = WorkloadSpec(input_len=16, output_len=args.output_len, warmup_requests=1)
    before = _server_gaps(args.stats_dir)
    res = run_level(url, conc, spec, conc * args.rounds, model="fake", request_timeout_s=600, processes=procs)
    hist = [b - a for a, b in zip(before, _server_gaps(args.stats_dir))]
    s50, s99 = fake.gap_percentile(hist, 50) / args.chunk_tokens, fake.gap_percentile(hist, 99) / args.chunk_tokens
    m, nominal = res.metrics, args.itl_ms / args.chunk_tokens
    tok_s = m.get("total_output_tokens", 0) / max(m.get("duration", 1e-9), 1e-9)
    p50, p99 = m.get("median_itl_ms", float("nan")), m.get("p99_itl_ms", float("nan"))
    return (str(conc), str(res.processes), f"{tok_s:,.0f}", f"{s50:.2f} / {p50:.2f}", f"{s99:.2f} / {p99:.2f}",
            f"{(p99 - s99) / s99 * 100:+.1f}", f"{(p99 - nominal) / nominal * 100:+.1f}",
            f"{res.client['loop_lag_p99_ms']:.1f}", f"{res.client['cpu_busy_max']:.0%}", str(res.client_bound),
            str(res.failed))


def print_table(rows: list[tuple[str, ...]]) -> None:
    """Right-aligned columns, the first row as the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    ap = argparse.ArgumentParser(description="built-in client capacity vs a fake server of known cadence")
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--chunk-tokens", type=int, default=1)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream")
    ap.add_argument("--points", default="128:1,256:1,512:1,512:auto,1024:auto,2048:auto",
                    help="concurrency:processes list (processes may be 'auto')")
    ap.add_argument("--server-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--server-cpus", default=None, help="e.g. 8-15: pin the fake server there")
    ap.add_argument("--client-cpus", default=None, help="e.g. 0-7: pin the client (and its workers) there")
    args = ap.parse_args()
    args.stats_dir = tempfile.mkdtemp(prefix="tunectl-capacity-")
    proc, url = fake.start(itl_ms=args.itl_ms, ttft_ms=args.itl_ms, chunk_tokens=args.chunk_tokens,
                           workers=args.server_workers, cpus=_cpus(args.server_cpus), stats_dir=args.stats_dir)
    client = _cpus(args.client_cpus)
    if client:
        os.sched_setaffinity(0, client)
    print(f"fake server: {args.server_workers} processes, one chunk of {args.chunk_tokens} token(s) every "
          f"{args.itl_ms} ms per stream, {args.output_len} tokens per request; host has {os.cpu_count()} CPUs")
    rows = [HEADER]
    try:
        for conc, procs in _points(args.points):
            rows.append(measure(url, conc, procs, args))
    finally:
        fake.stop(proc)
        shutil.rmtree(args.stats_dir, ignore_errors=True)
    print_table(rows)


if __name__ == "__main__":
    main()
