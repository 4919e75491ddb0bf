"""The built-in client and the real `sglang.bench_serving` against a server whose timing is known.

The fake SGLang server (tests.helpers.fakeserver) sends the first token `--ttft-ms` after a request and
then one token every `--itl-ms` per stream, whatever the load, so what each client reports can be compared with
the truth: median TTFT = ttft-ms, median ITL = itl-ms, and an output throughput bounded by the streams' cadence.
Each point runs the built-in client (`tunectl.runners.clients.builtin.run_level`, the same call `tunectl sweep` makes)
and `python -m sglang.bench_serving --backend sglang --dataset-name random-ids` with the same requests count,
lengths and concurrency, and samples the bench_serving process's CPU use (/proc) while it runs. "client CPU" is
CPU seconds / wall seconds of the measurement, for the built-in client its busiest process (`cpu_busy_max`, what
flags it client-bound): a single Python event loop near 100% of one core measures itself, not the server.

    python bench/client_vs_bench_serving.py                        # 16, 64, 256, 512 streams, 20 ms cadence
    python bench/client_vs_bench_serving.py --concurrency 64,512 --itl-ms 10 --server-workers 8

Needs `sglang` 0.5.x's client importable (pip install --no-deps sglang plus pybase64 transformers datasets pillow).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client_capacity import print_table
from tests.helpers import fakeserver as fake
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.builtin import run_level
from tunectl.sim import TOKENIZER

HEADER = ("concurrency", "client", "output tok/s", "median TTFT ms (truth)", "median ITL ms (truth)",
          "client CPU", "wall s")


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])          # utime + stime of the process (all its threads)


class CpuSampler(threading.Thread):
    """Samples a process's CPU seconds until it exits, so the share of one core it used over its last seconds
    (the benchmark itself, after imports and tokenizer loading) can be read as the built-in client reads its own:
    CPU seconds / wall seconds of the measurement."""

    def __init__(self, pid: int, every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.samples = pid, every_s, []

    def run(self) -> None:
        hz = os.sysconf("SC_CLK_TCK")
        while (t := _cpu_ticks(self.pid)) is not None:
            self.samples.append((time.monotonic(), t / hz))
            time.sleep(self.every_s)

    def share_since(self, since: float) -> float:
        pts = [(t, c) for t, c in self.samples if t >= since]
        if len(pts) < 2:
            return 0.0
        (t0, c0), (t1, c1) = pts[0], pts[-1]
        return (c1 - c0) / max(t1 - t0, 1e-9)


def bench_serving(port: int, conc: int, n: int, args: argparse.Namespace, out: Path) -> tuple[dict, float, float]:
    argv = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
            "--port", str(port), "--dataset-name", "random-ids", "--tokenizer", str(TOKENIZER),
            "--model", str(TOKENIZER), "--num-prompts", str(n), "--max-concurrency", str(conc),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1", "--request-rate", "inf", "--output-file", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "no_proxy": "127.0.0.1,localhost"}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    sampler = CpuSampler(proc.pid)
    sampler.start()
    stdout, _ = proc.communicate(timeout=900)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"bench_serving failed (exit {proc.returncode}):\n{stdout[-2000:]}")
    result = json.loads(out.read_text().splitlines()[-1])
    out.unlink()
    sampler.join(1.0)
    # only the benchmark itself: its last `duration` seconds (imports and tokenizer loading come before)
    share = sampler.share_since(time.monotonic() - float(result["duration"]) - 0.3)
    return result, share, time.monotonic() - t0


def row(conc: int, client: str, m: dict, cpu: float, wall: float, args: argparse.Namespace) -> tuple[str, ...]:
    return (str(conc), client, f"{m['output_throughput']:,.0f}",
            f"{m['median_ttft_ms']:.1f} ({args.ttft_ms:g})", f"{m['median_itl_ms']:.1f} ({args.itl_ms:g})",
            f"{cpu:.0%}", f"{wall:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description="built-in client vs sglang.bench_serving against a known cadence")
    ap.add_argument("--concurrency", default="16,64,256,512")
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream (tunectl's prompts_per_level)")
    ap.add_argument("--server-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    args = ap.parse_args()
    proc, url = fake.start(itl_ms=args.itl_ms, ttft_ms=args.ttft_ms, chunk_tokens=1, workers=args.server_workers)
    port = int(url.rsplit(":", 1)[1])
    print(f"fake server: {args.server_workers} process(es), first token after {args.ttft_ms:g} ms, then one token "
          f"every {args.itl_ms:g} ms per stream; {args.input_len} in / {args.output_len} out tokens, "
          f"{args.rounds} requests per stream; host has {os.cpu_count()} CPUs")
    rows = [HEADER]
    spec = WorkloadSpec(input_len=args.input_len, output_len=args.output_len, vocab_size=4096)
    try:
        with tempfile.TemporaryDirectory(prefix="tunectl-clients-") as tmp:
            for conc in [int(c) for c in args.concurrency.split(",")]:
                n = conc * args.rounds
                t0 = time.monotonic()
                res = run_level(url, conc, spec, n, model="fake", request_timeout_s=600)
                rows.append(row(conc, f"built-in ({res.processes} proc)", res.metrics, res.client["cpu_busy_max"],
                                time.monotonic() - t0, args))
                m, cpu, wall = bench_serving(port, conc, n, args, Path(tmp) / "bs.jsonl")
                rows.append(row(conc, "bench_serving", m, cpu, wall, args))
    finally:
        fake.stop(proc)
    print_table(rows)


if __name__ == "__main__":
    main()
