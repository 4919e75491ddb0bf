"""The async core of the built-in client: one event loop driving a share of a level's streams.

Request bodies and stream parsing follow `sglang.bench_serving` (`--backend sglang`: POST /generate with
`input_ids`, SSE lines whose `meta_info.completion_tokens` is cumulative; `--backend sglang-oai`: POST
/v1/completions with the ids as `prompt`, one ITL value per chunk). Differences, on purpose: one pooled
ClientSession per loop (not one per request), a request counts as successful only when the stream ended with
`data: [DONE]` and carried at least one token, and output lengths come only from what the server reported
(never from the planned lengths).

The clock: against the stand-in every chunk carries the server's modeled clock (`sim_clock_ts`: the request's
arrival and the chunk's step, modeled seconds); times are then taken from it (times the time scale, so they read
like wall seconds of the scaled clock) and the level's figures do not depend on this host's load. Against real
SGLang (no such field) times are this process's `perf_counter`.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tunectl.runners.clients.metrics import ReqRecord
from tunectl.runners.clients.prompts import Prompt
from tunectl.runners.clients.steady import Cycle

_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_CLOCK = re.compile(rb'"sim_clock_ts"\s*:\s*\[\s*([-0-9.eE+]+)\s*,\s*([-0-9.eE+]+)\s*\]')
MAX_ERRORS = 5
CLOCK_HEADER = "X-Sim-Clock"    # to the stand-in: "streams=N; level=ID" (N = 0: this level sends no more)
# A connection that failed on the client's side: the client host ran out of something, the server was never asked
CLIENT_LIMITS = {errno.EADDRNOTAVAIL: "no free local port (each stream holds one; see net.ipv4.ip_local_port_range)",
                 errno.EMFILE: "too many open files (the process's limit, ulimit -n)",
                 errno.ENFILE: "too many open files (the host's limit, fs.file-max)",
                 errno.ENOBUFS: "no socket buffer space"}


def connect_failure(e: aiohttp.ClientConnectorError) -> str:
    """A request's error when its connection failed: a refused connection (the server is gone), or a limit of the
    client's own host (too many streams for one client host), said as such: the server was never reached."""
    what = CLIENT_LIMITS.get(getattr(getattr(e, "os_error", None), "errno", None))
    if what is None:
        return f"connection refused: {e}"
    return f"client host limit: {what}: {e}; the server was not reached: fewer streams per client host"


@dataclass
class ShareResult:
    records: list[ReqRecord]
    t0: float
    t_end: float
    lag_ms: list[float] = field(default_factory=list)   # event-loop oversleep samples
    cycles: list[Cycle] = field(default_factory=list)   # request start -> its stream's next start (steady window)
    cpu_s: float = 0.0
    aborted: bool = False
    server_gone: bool = False
    errors: list[str] = field(default_factory=list)
    server_clock: bool = False       # records and cycles are in the server's clock (the stand-in's stamps)


def _payload(backend: str, model: str, p: Prompt) -> tuple[str, dict[str, Any]]:
    if backend == "sglang-oai":
        return "/v1/completions", {"model": model, "prompt": p.ids, "max_tokens": p.output_len,
                                   "temperature": 0.0, "ignore_eos": True, "stream": True,
                                   "stream_options": {"include_usage": True}}
    return "/generate", {"input_ids": p.ids, "stream": True,
                         "sampling_params": {"temperature": 0.0, "max_new_tokens": p.output_len,
                                             "ignore_eos": True}}


class _Stream:
    """Turns SSE `data:` bodies into TTFT / ITL / output length for one request."""

    def __init__(self, rec: ReqRecord, backend: str, scale: float = 1.0,
                 on_start: Callable[[ReqRecord], None] | None = None, read_clock: bool = True):
        self.rec, self.oai, self.scale, self.on_start = rec, backend == "sglang-oai", scale, on_start
        self.read_clock = read_clock
        self.last = rec.start
        self.tokens = 0          # tokens reported so far (native: cumulative count; oai: chunks with text)
        self.usage: int | None = None
        self.done = False
        self.server_clock = False

    def started(self) -> None:
        """The request's start is final (the server's stamp, or the send time): its slot's last cycle closes."""
        if self.on_start is not None:
            self.on_start(self.rec)
            self.on_start = None

    def _clock(self, body: bytes, now: float) -> float:
        m = _CLOCK.search(body) if self.read_clock else None
        if m is None:
            return now
        if not self.server_clock:
            self.server_clock = True
            self.rec.start = self.last = float(m.group(1)) * self.scale
        return float(m.group(2)) * self.scale

    def on_body(self, body: bytes, now: float) -> int:
        if body == b"[DONE]":
            self.done = True
            if not self.server_clock:
                self.rec.latency = now - self.rec.start
            return 0
        now = self._clock(body, now)
        self.started()
        new = self._oai(body) if self.oai else self._native(body)
        if new <= 0:
            return 0
        if self.rec.ttft == 0.0:
            self.rec.ttft = now - self.rec.start
        elif self.oai:
            self.rec.itl.append(now - self.last)
        else:
            self.rec.itl.extend([(now - self.last) / new] * new)
        self.last = now
        self.rec.latency = now - self.rec.start
        return new

    def _native(self, body: bytes) -> int:
        m = _COMPLETION.findall(body)
        if not m:
            return 0
        n = int(m[-1])
        new, self.tokens = n - self.tokens, max(self.tokens, n)
        return new

    def _oai(self, body: bytes) -> int:
        data = json.loads(body)
        usage = data.get("usage") or {}
        if "completion_tokens" in usage:
            self.usage = int(usage["completion_tokens"])
        choices = data.get("choices") or []
        if choices and choices[0].get("text"):
            self.tokens += 1
            return 1
        return 0

    def output_len(self) -> int:
        return self.usage if self.usage is not None else self.tokens


async def _one(session: aiohttp.ClientSession, base: str, backend: str, model: str, p: Prompt,
               rec: ReqRecord, counters: Any, stream: _Stream | None = None,
               headers: dict[str, str] | None = None) -> None:
    """One request; without `stream` it is measured on this process's clock (an open-loop client's)."""
    path, payload = _payload(backend, model, p)
    stream = stream if stream is not None else _Stream(rec, backend, read_clock=False)
    rec.start = stream.last = time.perf_counter()
    async with session.post(base + path, json=payload, headers=headers) as resp:
        if resp.status != 200:
            rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return
        async for line in resp.content:
            if line.startswith(b"data:"):
                counters[2] += stream.on_body(line[5:].strip(), time.perf_counter())
    rec.output_len = stream.output_len()
    rec.success = stream.done and rec.output_len > 0
    if not rec.success:
        rec.error = "stream ended without [DONE]" if not stream.done else "no tokens in stream"


class _Share:
    def __init__(self, base: str, backend: str, model: str, prompts: Sequence[Prompt] | Callable[[], Prompt | None],
                 concurrency: int, should_abort: Callable[[], bool], counters: Any,
                 more: Callable[[int], bool] | None = None, on_cycle: Callable[[Cycle], None] | None = None,
                 scale: float = 1.0, streams: int = 0, level: str = "", total: int = 0):
        self.base, self.backend, self.model, self.scale = base.rstrip("/"), backend, model, scale
        # the stand-in: this client reads its clock; the level keeps `streams` requests in flight, wait for them
        self.level = level or uuid.uuid4().hex[:12]
        # `total`: a share of a level split over processes (`level` = <level>.<share>): the level's streams in all
        self.headers = {CLOCK_HEADER: f"streams={streams or concurrency}; level={self.level}"
                        + (f"; total={total}" if total else "")}
        self.done_sending = False
        self.source = prompts if callable(prompts) else iter(prompts).__next__
        self.concurrency = concurrency
        self.should_abort = should_abort
        self.counters = counters if counters is not None else [0, 0, 0, 0]
        self.more = more or (lambda started: True)
        self.on_cycle = on_cycle
        self.started = 0
        self.res = ShareResult(records=[], t0=0.0, t_end=0.0)

    def _next(self, follow: Prompt | None = None) -> Prompt | None:
        """`follow`: the next turn of the stream's conversation, sent before a new conversation is taken."""
        p = None
        if not self.res.server_gone and self.more(self.started):
            try:
                p = follow if follow is not None else self.source()
            except StopIteration:
                p = None
        if p is None:
            self.done_sending = True
        else:
            self.started += 1
            self.counters[3] += 1
        return p

    async def release(self, session: aiohttp.ClientSession) -> None:
        """Tell the stand-in this share sends no more requests: its clock need not wait for them (a no-op GET on
        any other server)."""
        while not self.done_sending:
            await asyncio.sleep(0.002)
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(self.base + "/health", headers={CLOCK_HEADER: f"streams=0; level={self.level}"},
                                   timeout=aiohttp.ClientTimeout(total=2.0)):
                pass

    def _cycle(self, prev: ReqRecord | None, next_start: float, slot: int = -1) -> None:
        if prev is None:
            return
        c = Cycle(prev.start, prev.start + prev.latency, next_start, prev.output_len if prev.success else 0,
                  self.res.server_clock, slot)
        self.res.cycles.append(c)
        if self.on_cycle:
            self.on_cycle(c)

    async def worker(self, session: aiohttp.ClientSession, slot: int = -1) -> None:
        prev: ReqRecord | None = None
        follow: Prompt | None = None
        while (p := self._next(follow)) is not None:
            rec = ReqRecord(input_len=p.input_len)
            self.res.records.append(rec)
            stream = _Stream(rec, self.backend, self.scale, lambda r, q=prev: self._cycle(q, r.start, slot))
            try:
                await _one(session, self.base, self.backend, self.model, p, rec, self.counters, stream,
                           self.headers)
            except aiohttp.ClientConnectorError as e:
                rec.error = connect_failure(e)
                self.res.server_gone = True
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                rec.error = f"{type(e).__name__}: {e}"[:300]
            self.res.server_clock = self.res.server_clock or stream.server_clock
            if stream.on_start is not None:   # no chunk came: in the server's clock the slot's time runs on
                self._cycle(prev, prev.start + prev.latency if prev and self.res.server_clock else rec.start, slot)
                stream.on_start = None
            self._count(rec)
            prev, follow = rec, p.then if rec.success else None
        if prev is not None:                # the stream's last request: its own time, not the drain's idle tail
            self._cycle(prev, prev.start + prev.latency, slot)

    def _count(self, rec: ReqRecord) -> None:
        if rec.error and len(self.res.errors) < MAX_ERRORS:
            self.res.errors.append(rec.error)
        self.counters[0 if rec.success else 1] += 1

    async def watch(self, tasks: list[asyncio.Task[None]]) -> None:
        last = time.perf_counter()
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.res.lag_ms.append(max(0.0, (now - last - 0.01) * 1000))
            last = now
            if self.should_abort() or self.res.server_gone:
                self.res.aborted = self.res.aborted or self.should_abort()
                for t in tasks:
                    t.cancel()
                return


def more_open_files(target: int = 65535) -> None:
    """Each stream holds a socket: a stock soft limit of 1,024 open files fails a level of 1,024 streams with "Too
    many open files" on the client's side. Raised towards `target` within the hard limit, as sglang.bench_serving
    does (its set_ulimit) before it sends."""
    try:
        import resource
    except ImportError:                      # not a POSIX host: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):        # a container that refuses it: the level says what failed
            pass


async def run_share(base_url: str, backend: str, model: str,
                    prompts: Sequence[Prompt] | Callable[[], Prompt | None], concurrency: int,
                    timeout_s: float, should_abort: Callable[[], bool] = lambda: False,
                    counters: Any = None, more: Callable[[int], bool] | None = None,
                    on_cycle: Callable[[Cycle], None] | None = None, time_scale: float = 1.0,
                    streams: int = 0, level: str = "", total: int = 0) -> ShareResult:
    """`prompts`: a list, or a callable giving the next prompt (None: no more); `more(started)` is asked before
    each request (False: stop starting requests, let the ones in flight finish); `on_cycle` gets each Cycle;
    `time_scale`: the stand-in's, to read its clock stamps in the scaled clock's seconds; `streams`: the level's
    concurrency and `level` its id when this share is one of several processes."""
    more_open_files()
    share = _Share(base_url, backend, model, prompts, concurrency, should_abort, counters, more, on_cycle,
                   time_scale, streams, level, total)
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    cpu0 = time.process_time()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, read_bufsize=1 << 20) as session:
        share.res.t0 = time.perf_counter()
        n = concurrency if callable(prompts) else min(concurrency, len(prompts))
        tasks = [asyncio.create_task(share.worker(session, slot)) for slot in range(n)]
        watcher = asyncio.create_task(share.watch(tasks))
        released = asyncio.create_task(share.release(session))
        await asyncio.gather(*tasks, return_exceptions=True)
        share.done_sending = True
        await asyncio.gather(released, return_exceptions=True)
        share.res.t_end = time.perf_counter()
        watcher.cancel()
    for rec in share.res.records:
        if not rec.success and not rec.error:
            rec.error = "aborted"
    share.res.cpu_s = time.process_time() - cpu0
    return share.res
