"""Crash detection latency on the SGLang stand-in: first traceback byte written to server.log -> tunectl knows.

For each run a spy thread polls the log file every millisecond and notes when "Traceback" first appears (the
write time, to ~1 ms); the lifecycle notes when its crash watch (log polled every lifecycle.POLL_S) first saw the
crash. Two crash kinds: a startup crash (deterministic) and the seeds' load crash (page_table_1_flattened under
concurrency 512). Usage: python bench/crash_detection.py [--runs N]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time

from tunectl.profile import default_profile_path, load_profile
from tunectl.runners.hosts.local import LocalRunner
from tunectl.runners.server import lifecycle
from tunectl.runners.server import plan as server
from tunectl.runners.server.ladder import run_ladder

KINDS = {
    "startup crash (flashinfer_trtllm on SM120)": ({"moe-runner-backend": "flashinfer_trtllm"}, None),
    "load crash (page_table_1_flattened @512)": ({"disable-cuda-graph": True, "max-running-requests": 2048,
                                                  "disable-radix-cache": True, "flashinfer-cutlass-autotune": True},
                                                 [512]),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spy(path: str, stop: threading.Event, out: dict[str, float]) -> None:
    seen = b""
    while not stop.is_set():
        try:
            with open(path, "rb") as f:
                f.seek(len(seen))
                seen += f.read()
        except FileNotFoundError:
            pass
        if b"Traceback" in seen:
            out["written"] = time.monotonic()
            return
        time.sleep(0.001)


def one_run(workdir: str, params: dict, levels: list[int] | None) -> dict[str, float] | None:
    prof = load_profile(default_profile_path(), {"server.port": free_port(), "host.workdir": workdir})
    run_id = server.make_run_id("bench", 0)
    plan = server.build_plan(prof, params, run_id, f"{workdir}/{run_id}")
    t0 = time.monotonic()
    srv = lifecycle.launch(LocalRunner(), prof, plan, server.config_yaml(plan))
    stop, seen = threading.Event(), {}
    th = threading.Thread(target=spy, args=(srv.handle.log_path, stop, seen), daemon=True)
    th.start()
    try:
        st = lifecycle.wait_ready(srv)
        crash = st.crash if levels is None or not st.ready else run_ladder(srv, levels, prof.bench.workloads).crash
    finally:
        td = lifecycle.teardown(srv)
        stop.set()
    if crash is None or "written" not in seen or srv.detected_at is None:
        return None
    return {"latency": srv.detected_at - seen["written"], "trial": time.monotonic() - t0,
            "teardown": td["seconds"], "clean": td["verdict"] == "clean"}


def row(name: str, runs: list[dict[str, float]], asked: int) -> str:
    lat = sorted(r["latency"] * 1000 for r in runs)
    if not lat:
        return f"{name:<46} {0:>3}/{asked:<3} (no crash detected)"
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    clean = sum(r["clean"] for r in runs)
    return (f"{name:<46} {len(lat):>3}/{asked:<3} {statistics.median(lat):>8.0f} {p95:>8.0f} {max(lat):>8.0f} "
            f"{statistics.mean(r['trial'] for r in runs):>8.2f} {clean:>3}/{len(runs)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    print(f"poll interval {lifecycle.POLL_S * 1000:.0f} ms, target: detected <= 2000 ms after the traceback; "
          f"{os.cpu_count()} CPUs")
    print(f"{'crash':<46} {'runs':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'trial s':>8} {'clean':>5}")
    with tempfile.TemporaryDirectory(prefix="tunectl-crash-bench-") as work:
        for name, (params, levels) in KINDS.items():
            runs = [r for r in (one_run(work, params, levels) for _ in range(args.runs)) if r]
            print(row(name, runs, args.runs), flush=True)


if __name__ == "__main__":
    main()
