"""A fake SGLang streaming server of known cadence, for client tests and `bench/client_capacity.py`.

It answers POST /generate (SGLang native SSE: cumulative `text` + `meta_info.completion_tokens`, then
`data: [DONE]`) and POST /v1/completions (OpenAI SSE chunks, usage in the last chunk), plus GET /health,
/v1/models and /server_info. Every stream sends its first chunk `ttft_ms` after the request and then one chunk
of `chunk_tokens` tokens every `itl_ms`, on an absolute schedule (no drift), so a client's measured TTFT/ITL can
be compared with the truth. `--itl-jitter J` draws each request's gap uniformly from itl x [1-J, 1+J] (seeded by
`--seed` and the request's number): a server of known mean timing whose throughput varies like a real one's.
`--die-after N` makes the whole process exit (code 137, like SGLang's
kill_process_tree) once N requests have started: in-flight streams are cut and later connections refused.
Several `--workers` processes share the port (SO_REUSEPORT) so the server is not the bottleneck. With
`--stats-dir D` each worker keeps a histogram of the gaps it actually left between chunks (its own jitter
included) and writes it to D every 0.5 s: the truth a client's ITL is compared with (`read_gaps`).

Run (from the checkout): python -m tests.helpers.fakeserver --port P [--itl-ms 20] [--workers 4] ...
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

from aiohttp import web

from tests.helpers.ports import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout: -m finds tests/


def _chunk_native(n: int, prompt_len: int, rid: str) -> bytes:
    body = {"text": " tok" * n, "meta_info": {"id": rid, "prompt_tokens": prompt_len, "completion_tokens": n,
                                               "finish_reason": None}, "index": 0}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _chunk_oai(n_new: int, usage: dict[str, int] | None, rid: str) -> bytes:
    choices = [{"index": 0, "text": " tok" * n_new, "logprobs": None, "finish_reason": None}] if n_new else []
    body = {"id": rid, "object": "text_completion", "choices": choices, "usage": usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _write_json(path: str, data: object) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


BIN_S, BINS = 0.00005, 8000        # send-gap histogram: 0.05 ms bins up to 400 ms


class FakeServer:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.started = 0
        self.gaps = [0] * BINS

    async def dump_stats(self, app: web.Application) -> None:
        path = os.path.join(self.a.stats_dir, f"gaps-{os.getpid()}.json")
        while True:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(_write_json, path, list(self.gaps))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        oai = request.path.endswith("completions")
        out_len = int(body["max_tokens"] if oai else body["sampling_params"]["max_new_tokens"])
        prompt_len = len(body.get("prompt" if oai else "input_ids") or [])
        self.started += 1
        if self.a.die_after and self.started > self.a.die_after:
            os._exit(137)
        t0 = time.perf_counter()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rid, sent, k, last = f"r{self.started}", 0, 0, 0.0
        itl_ms = self.a.itl_ms
        if self.a.itl_jitter:
            j = self.a.itl_jitter
            itl_ms *= random.Random(f"{self.a.seed}:{os.getpid()}:{self.started}").uniform(1 - j, 1 + j)
        while sent < out_len:
            due = t0 + (self.a.ttft_ms + k * itl_ms) / 1000
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.perf_counter()
            if k:
                self.gaps[min(int((now - last) / BIN_S), BINS - 1)] += 1
            last = now
            new = min(self.a.chunk_tokens, out_len - sent)
            sent += new
            k += 1
            await resp.write(_chunk_oai(new, None, rid) if oai else _chunk_native(sent, prompt_len, rid))
        if oai:
            usage = {"prompt_tokens": prompt_len, "completion_tokens": sent, "total_tokens": prompt_len + sent}
            await resp.write(_chunk_oai(0, usage, rid))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake"}], "version": "fake", "max_total_num_tokens": 1 << 20})


def _serve(args: argparse.Namespace) -> None:
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    srv = FakeServer(args)
    app = web.Application()
    app.router.add_post("/generate", srv.stream)
    app.router.add_post("/v1/completions", srv.stream)
    for path in ("/health", "/health_generate", "/v1/models", "/server_info", "/model_info"):
        app.router.add_get(path, srv.info)
    if args.stats_dir:
        async def _start(app: web.Application) -> None:
            app["stats"] = asyncio.create_task(srv.dump_stats(app))
        app.on_startup.append(_start)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", args.port))
    web.run_app(app, sock=sock, print=None, access_log=None, backlog=4096)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--chunk-tokens", type=int, default=1)
    ap.add_argument("--itl-jitter", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--die-after", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cpus", default="", help="comma-separated CPU ids to pin every worker to")
    ap.add_argument("--stats-dir", default="", help="write each worker's send-gap histogram here")
    args = ap.parse_args(argv)
    procs = [mp.get_context("spawn").Process(target=_serve, args=(args,)) for _ in range(args.workers - 1)]
    for p in procs:
        p.start()
    _serve(args)


def start(itl_ms: float = 20.0, ttft_ms: float = 20.0, chunk_tokens: int = 1, die_after: int = 0,
          workers: int = 1, cpus: set[int] | None = None, stats_dir: str = "",
          timeout_s: float = 20.0, itl_jitter: float = 0.0, seed: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server in its own process group; returns (process, base_url). Stop with `stop(proc)`."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.helpers.fakeserver", "--port", str(port), "--itl-ms",
           str(itl_ms), "--ttft-ms", str(ttft_ms), "--chunk-tokens", str(chunk_tokens), "--die-after",
           str(die_after), "--workers", str(workers), "--cpus", ",".join(map(str, sorted(cpus or ()))),
           "--stats-dir", stats_dir, "--itl-jitter", str(itl_jitter), "--seed", str(seed)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"fake server on port {port} did not come up in {timeout_s} s")


def read_gaps(stats_dir: str) -> list[int]:
    """The summed send-gap histogram of all workers (BIN_S bins)."""
    total = [0] * BINS
    for name in os.listdir(stats_dir):
        if name.startswith("gaps-") and name.endswith(".json"):
            with open(os.path.join(stats_dir, name)) as f:
                total = [a + b for a, b in zip(total, json.load(f))]
    return total


def gap_percentile(hist: list[int], p: float) -> float:
    """Percentile (ms) of a send-gap histogram, at bin centres."""
    need, seen = sum(hist) * p / 100, 0
    for i, n in enumerate(hist):
        seen += n
        if n and seen >= need:
            return (i + 0.5) * BIN_S * 1000
    return float("nan")


def stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


if __name__ == "__main__":
    main()
