"""What the SSH port forward costs the built-in client: the same fake server of known timing (first token after
20 ms, then one token every 20 ms per stream, 128 tokens a request) read directly and through SSHRunner's forward
to a real OpenSSH sshd on loopback, at several stream counts, in one run (a ratio, so a shared machine's load
cancels out). On a real GPU host the built-in client read 29-42% below sglang.bench_serving at 128 streams through
the forward (docs/real-gpu.md); this shows where that comes from.

  python bench/ssh_forward.py [--streams 64,128,256] [--waves 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import fakeserver as fake
from tests.runners.sshd import ALIAS, make_home, start_sshd
from tunectl.profile import HostSpec, WorkloadSpec
from tunectl.runners.clients.builtin import run_level
from tunectl.runners.hosts.ssh import SSHRunner

ITL_MS, OUT = 20.0, 128


def measure(url: str, streams: int, waves: int, procs: int | str, isolate: bool = False) -> tuple[float, bool, float]:
    spec = WorkloadSpec(input_len=16, output_len=OUT, range_ratio=1.0, warmup_requests=1, seed=1)
    m = run_level(url, streams, spec, waves * streams, model="fake", processes=procs, isolate=isolate)
    return m.metrics.get("output_throughput", 0.0), m.client_bound, m.client.get("loop_lag_p99_ms", 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="64,128,256")
    ap.add_argument("--waves", type=int, default=4)
    ap.add_argument("--processes", default="auto", help="client processes: auto, or a number")
    args = ap.parse_args()
    proc, url = fake.start(itl_ms=ITL_MS, ttft_ms=ITL_MS)
    tmp = Path(tempfile.mkdtemp(prefix="fwd-bench-"))
    (tmp / "sshd").mkdir()
    sshd = start_sshd(tmp / "sshd")
    os.environ["HOME"] = str(make_home(tmp / "home", sshd))
    os.environ.pop("SSH_AUTH_SOCK", None)
    runner = SSHRunner(HostSpec(kind="ssh", address=ALIAS, workdir=str(tmp / "work"), connect_timeout_s=5))
    port = int(url.rsplit(":", 1)[1])
    host, local = runner.endpoint("127.0.0.1", port)
    via = f"http://{host}:{local}"
    print("| streams | truth tok/s | direct | forward, client in-process | / direct | forward, client in its own "
          "process | / direct | client-bound (direct / in / own) | loop lag p99 ms (direct / in / own) |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for n in (int(x) for x in args.streams.split(",")):
            truth = n * OUT / ((ITL_MS + (OUT - 1) * ITL_MS) / 1000)
            procs = args.processes if args.processes == "auto" else int(args.processes)
            d, db, dl = measure(url, n, args.waves, procs)
            f, fb, fl = measure(via, n, args.waves, procs)
            i, ib, il = measure(via, n, args.waves, procs, isolate=True)
            print(f"| {n} | {truth:,.0f} | {d:,.0f} | {f:,.0f} | {f / d:.2f} | {i:,.0f} | {i / d:.2f} | "
                  f"{db} / {fb} / {ib} | {dl:.0f} / {fl:.0f} / {il:.0f} |", flush=True)
    finally:
        runner.close()
        sshd.stop()
        fake.stop(proc)


if __name__ == "__main__":
    main()
