"""Crash reading: classify SGLang server log text, and watch a log as it grows.

Public API (the lifecycle codes against these names):

- `SIGNATURES` / `DEATH_MARKERS` (catalog in `catalog.py`), `Signature`.
- `classify(text, phase, level, exit_code) -> CrashInfo | None`: finds the first traceback or death marker,
  takes the exception line (last `SomethingError: ...` line of that traceback), matches the most specific
  signature (exception line first, then the traceback frames, then the earliest fatal text around the death)
  and derives the class from signature + phase. A crash with death markers but no known signature is
  `signature="unknown"`, classed by phase. Returns None when the text shows no crash (and exit code is not
  a crash code).
- `repairs_for(signature, text="") -> tuple[Repair, ...]`: the catalog's machine-readable repairs for a signature
  id (or, for an id the catalog does not know, for the signature the text, e.g. an exception line, matches).
- `LogWatcher`: fed raw byte chunks (`feed(data, now)`) as the log is tailed from an offset. Tracks startup
  milestones with the time seen (`milestones`, `last_milestone`), facts (`facts`: max_total_num_tokens,
  chunked_prefill_size, max_running_requests, available_gpu_mem_gb, ... and retracted_reqs, the requests the
  scheduler sent back to the queue because the KV pool was full; from the decode lines the largest batch, the
  largest one run without a CUDA graph and the queue while the batch stood at max_running_requests; from startup
  the largest decode batch captured in a graph, the memory those graphs took and the GPU's memory), token progress
  (`prefill_batches`, `decode_batches`, `last_progress_at`), and death (`crashed`, `first_traceback_at`,
  `first_traceback_offset`, `crash_info(phase, level, exit_code, detected_at=None)`). Detection happens inside `feed`,
  on the line that shows it. After a `SIGTERM received` line (or `mark_stopping()`) death markers are a normal stop.

Phases: "startup" (before the ready line), "load" (after it), "teardown".
"""
from __future__ import annotations

import re
from collections import deque

from tunectl.sglang.crashes.catalog import (
    BY_ID,
    DEATH_MARKERS,
    LOWER,
    OOM_TEXT,
    RAISE,
    SHUTDOWN_MARKER,
    SIGNATURES,
    TIMEOUT_REPAIRS,
    Repair,
    Signature,
)
from tunectl.models import CrashInfo

__all__ = ["DEATH_MARKERS", "LOWER", "MILESTONES", "RAISE", "SIGNATURES", "TIMEOUT_REPAIRS", "LogWatcher", "Repair",
           "Signature", "classify", "repairs_for"]

_TRACEBACK = "Traceback (most recent call last)"
_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
_LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_RECORD_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\]\s*")
_EXCERPT_LINES = 12

# milestone name -> substring/regex seen in the log (SGLang 0.5.x), in startup order
MILESTONES: dict[str, re.Pattern[str]] = {name: re.compile(rx) for name, rx in (
    ("server_args", r"server_args="),
    ("load_weight_begin", r"Load weight begin\."),
    ("load_weight_end", r"Load weight end\."),
    ("kv_cache_allocated", r"KV Cache is allocated\."),
    ("memory_pool_end", r"Memory pool end\."),
    ("autotune_begin", r"Running FlashInfer autotune"),
    ("autotune_end", r"FlashInfer autotune completed"),
    ("cuda_graph_begin", r"Capture (?:\w+ \w+ )?[Cc][Uu][Dd][Aa] graph begin"),
    ("cuda_graph_end", r"Capture (?:\w+ \w+ )?[Cc][Uu][Dd][Aa] graph end"),
    ("max_total_num_tokens", r"max_total_num_tokens="),
    ("uvicorn_running", r"Uvicorn running on"),
    ("ready", r"The server is fired up and ready to roll!"),
)}
_FACTS = re.compile(r"\b(max_total_num_tokens|chunked_prefill_size|max_prefill_tokens|max_running_requests"
                    r"|context_len)=(\d+)")
_PROGRESS = re.compile(r"\b(Prefill|Decode) batch[,.]")
_FREE_GB = re.compile(r"available_gpu_mem=([\d.]+) GB")
# The decode graphs' batch sizes and memory: 0.5.9 logs "Capture cuda graph bs [1, 2, ...]" and "Capture cuda graph
# end. ... mem usage=X GB", 0.5.17 "Capture target decode CUDA graph begin. ... bs=[1, 2, ...]" and "... end. ...,
# mem usage=X GB"; the GPU's memory before the weights: "Load weight begin. avail mem=X GB".
_GRAPH_BS = re.compile(r"Capture (?:cuda graph bs |target decode CUDA graph begin\..*\bbs=)\[([\d, ]+)\]")
_GRAPH_GB = re.compile(r"Capture (?:cuda graph|target decode CUDA graph) end\..*mem usage=([\d.]+) GB")
_GPU_GB = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
_RETRACTED = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")
_KV_DTYPE = re.compile(r"KV Cache is allocated\. dtype: torch\.(\w+)")
_GEN_RATE = re.compile(r"#running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+)")
_DECODE_STATE = re.compile(r"#running-req: (\d+),.*cuda graph: (True|False)\b.*#queue-req: (\d+)")
_TOKEN_USAGE = re.compile(r"token usage: ([\d.]+)")
# speculative decoding: SGLang 0.5.9 scheduler_metrics_mixin.py:390 `accept len: {:.2f}, accept rate: {:.2f}, `
_ACCEPT_LEN = re.compile(r"accept len: ([\d.]+)")
# A decode batch with requests queued and the KV pool at least this full: the pool held them back (during a level's
# ramp the queue waits for prefill with the pool nearly empty).
POOL_FULL = 0.85
_EXIT_CRASH = {137, -9, 134, -6, 139, -11, 1}


def _kv_bits(line: str) -> int | None:
    """Bits per element of the KV pool, from `KV Cache is allocated. dtype: torch.float8_e4m3fn, ...`."""
    m = _KV_DTYPE.search(line)
    if not m:
        return None
    dtype = m.group(1)
    return 8 if dtype.startswith("float8") else 16 if dtype in ("bfloat16", "float16") else None


def _exception_line(block: list[str]) -> str:
    for line in reversed(block):
        s = line.strip()
        if _EXC_LINE.match(s):
            return s
    return ""


_FATAL = re.compile("|".join(f"(?:{s.regex.pattern})" for s in SIGNATURES if s.fatal))


def _is_death(line: str) -> bool:
    return bool(DEATH_MARKERS.search(line) or _FATAL.search(line))


def _first_death(lines: list[str]) -> tuple[int | None, bool]:
    """Index of the first traceback/death line, and whether a requested stop (SIGTERM) came first."""
    for i, line in enumerate(lines):
        if SHUTDOWN_MARKER.search(line):
            return None, True
        if _TRACEBACK in line or _is_death(line):
            return i, False
    return None, False


def _traceback_block(lines: list[str], start: int) -> list[str]:
    """Lines of the first traceback at/after `start`, up to the next log record."""
    i = next((k for k in range(start, len(lines)) if _TRACEBACK in lines[k]), None)
    if i is None:
        return []
    end = next((k for k in range(i + 1, len(lines)) if _LOG_RECORD.match(lines[k])), len(lines))
    return lines[i:end]


def _match(sigs: list[Signature], text: str) -> Signature | None:
    return next((s for s in sigs if s.regex.search(text)), None)


def _earliest(sigs: list[Signature], lines: list[str]) -> Signature | None:
    for line in lines:
        if "server_args=ServerArgs(" in line:      # every option's name and value: no evidence of anything
            continue
        hit = _match(sigs, line)
        if hit:
            return hit
    return None


def _pick(lines: list[str], start: int, block: list[str], exc: str, phase: str) -> Signature | None:
    """Exception line first (unless it is only a generic OOM and the frames say more), then the frames,
    then the earliest catalog text around the death."""
    sigs = [s for s in SIGNATURES if s.applies(phase)]
    frames = _match(sigs, "\n".join(ln for ln in block if ln.strip() != exc))
    by_exc = _match(sigs, exc) if exc else None
    if by_exc and not (by_exc.generic and frames):
        return by_exc
    return frames or by_exc or _earliest(sigs, lines[max(0, start - 200):])


_OOM = re.compile(OOM_TEXT)


def repairs_for(signature: str, text: str = "") -> tuple[Repair, ...]:
    """The catalog's repairs for a signature, in its order; where the exception line is a CUDA out-of-memory
    error, lowering the static memory fraction comes first (the search sizes it from the log's "Tried to
    allocate"): the feature that needed the memory (e.g. FlashInfer autotune's tuned kernels) is kept, not
    switched off; other failures keep the catalog's order (a kernel error in autotune: autotune off first)."""
    if signature in TIMEOUT_REPAIRS:                  # a startup phase past its deadline: no log text to match
        return TIMEOUT_REPAIRS[signature]
    sig = BY_ID.get(signature) or (_match(list(SIGNATURES), text) if text else None)
    if sig is None:
        return ()
    memory = ("mem-fraction-static", LOWER)
    if text and memory in sig.repairs and _OOM.search(text):
        return (memory, *(r for r in sig.repairs if r != memory))
    return sig.repairs


def _unknown_class(phase: str) -> str:
    return {"startup": "config_error", "load": "load_crash"}.get(phase, "flaky")


def classify(text: str, phase: str, level: int | None = None, exit_code: int | None = None) -> CrashInfo | None:
    lines = text.splitlines()
    start, stopped = _first_death(lines)
    if start is None and (stopped or (exit_code != 2 and exit_code not in _EXIT_CRASH)):
        return None
    start = 0 if start is None else start
    block = _traceback_block(lines, start)
    exc = _exception_line(block)
    sig = _pick(lines, start, block, exc, phase)
    if sig is None and exit_code == 2:
        sig = BY_ID["argparse_error"]
    if sig is None and not exc and not DEATH_MARKERS.search("\n".join(lines[start:])) \
            and exit_code not in _EXIT_CRASH:
        return None
    evidence = [ln for ln in (block or lines[start:]) if ln.strip(" ^~\t")]
    if not exc:
        exc = next((ln.strip() for ln in lines[max(0, start - 200):] if sig and sig.regex.search(ln)),
                   evidence[0].strip() if evidence else "")
        exc = _RECORD_PREFIX.sub("", exc)           # the message, not the log record's time stamp
    cls = sig.class_for(phase) if sig else _unknown_class(phase)
    desc = f"{sig.description}; try: {sig.hint}" if sig else f"server died ({phase}) with no known signature"
    return CrashInfo(cls=cls, signature=sig.id if sig else "unknown", phase=phase,
                     level=level if phase == "load" else None, exception_line=exc[:500],
                     traceback_excerpt="\n".join(evidence[-_EXCERPT_LINES:]), exit_code=exit_code,
                     message=desc)


# Every fact LogWatcher.facts can hold: the one list, written here and read by the search (search/feedback.py keeps
# these in a trial's record). The KV pool (`kv_tokens`, `kv_cache_bits`), the limits the server ran with, the memory
# left after the static pool and graphs, requests retracted because the pool was full, the decode batches, the CUDA
# graphs captured (largest batch, memory) and the GPU's memory.
LOG_FACTS = ("max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
             "context_len", "available_gpu_mem_gb", "retracted_reqs", "kv_tokens", "kv_cache_bits",
             "graph_bs_max", "graph_mem_gb", "gpu_mem_gb", "decode_bs_max", "decode_bs_nograph_max",
             "decode_queue_at_cap", "decode_queue_pool_full")


class LogWatcher:
    """Incremental reader of a server log; see the module docstring for the attributes."""

    def __init__(self, start_offset: int = 0, context_lines: int = 200, region_lines: int = 4000):
        self.offset = start_offset              # byte offset of the next unread byte
        self._buf = b""
        self._pre: deque[str] = deque(maxlen=context_lines)
        self._head: list[str] = []              # the first lines from the death line on...
        self._tail: deque[str] = deque(maxlen=region_lines)   # ...and the latest ones (assert spam can be long)
        self._head_max = context_lines
        self._context = context_lines
        self._tb_start: tuple[float, int, int] | None = None   # (time, offset, line number)
        self.milestones: dict[str, float] = {}
        self.last_milestone: tuple[str, float] | None = None
        self.facts: dict[str, float] = {}
        self.prefill_batches = 0
        self.decode_batches = 0
        self.decode_rates: list[tuple[int, float]] = []   # (running requests, gen throughput) per decode line
        self.decode_accept: list[float | None] = []         # its speculative accept len (None: not speculative)
        self.last_progress_at: float | None = None
        self.unhealthy_at: float | None = None
        self.stopping = False
        self.crashed = False
        self.first_traceback_at: float | None = None
        self.first_traceback_offset: int | None = None
        self.lines_seen = 0

    @classmethod
    def read(cls, data: bytes | str) -> LogWatcher:
        """A whole log read at once (a finished trial's server.log, a fixture, the stand-in's transcript)."""
        w = cls()
        w.feed(data.encode() if isinstance(data, str) else data, 0.0)
        w.flush(0.0)
        return w

    @property
    def ready(self) -> bool:
        return "ready" in self.milestones

    def mark_stopping(self) -> None:
        """Call before sending TERM: later death markers are the requested stop, not a crash."""
        self.stopping = True

    def feed(self, data: bytes, now: float) -> None:
        self._buf += data
        *complete, self._buf = self._buf.split(b"\n")
        for raw in complete:
            self._line(raw.decode("utf-8", "replace").rstrip("\r"), now, len(raw) + 1)
        if len(self._buf) > 1 << 20:              # a runaway partial line (progress bars): drop it
            self.offset += len(self._buf)
            self._buf = b""

    def flush(self, now: float) -> None:
        """End of log: treat a trailing partial line as complete."""
        if self._buf:
            raw, self._buf = self._buf, b""
            self._line(raw.decode("utf-8", "replace"), now, len(raw))

    def _line(self, line: str, now: float, nbytes: int) -> None:
        offset, self.offset = self.offset, self.offset + nbytes
        self.lines_seen += 1
        if self.crashed:
            (self._head if len(self._head) < self._head_max else self._tail).append(line)
            return
        self._track(line, now)
        if _TRACEBACK in line and (self._tb_start is None
                                   or self.lines_seen - self._tb_start[2] >= self._context):
            self._tb_start = (now, offset, self.lines_seen)
        if not self.stopping and _is_death(line):
            self._on_death(line, now, offset)
        else:
            self._pre.append(line)

    def _on_death(self, line: str, now: float, offset: int) -> None:
        self.crashed = True
        tb = self._tb_start
        recent = tb is not None and self.lines_seen - tb[2] < self._context
        self.first_traceback_at, self.first_traceback_offset = (tb[0], tb[1]) if recent else (now, offset)
        self._head.append(line)

    def _track(self, line: str, now: float) -> None:
        m = _PROGRESS.search(line)
        if m:
            if m.group(1) == "Prefill":
                self.prefill_batches += 1
            else:
                self.decode_batches += 1
                rate = _GEN_RATE.search(line)
                if rate:
                    self.decode_rates.append((int(rate.group(1)), float(rate.group(2))))
                    acc = _ACCEPT_LEN.search(line)
                    self.decode_accept.append(float(acc.group(1)) if acc else None)
                self._decode_state(line)
            self.last_progress_at = now
            return
        if SHUTDOWN_MARKER.search(line):
            self.stopping = True
        if "Health check failed" in line and self.unhealthy_at is None:
            self.unhealthy_at = now
        for name, rx in MILESTONES.items():
            if rx.search(line):
                self.milestones.setdefault(name, now)
                self.last_milestone = (name, now)
        if "max_total_num_tokens=" in line and "server_args=" not in line:
            self.facts.update((k, int(v)) for k, v in _FACTS.findall(line))
            free = _FREE_GB.search(line)
            if free:
                self.facts["available_gpu_mem_gb"] = float(free.group(1))
        if "Capture" in line or "Load weight begin" in line:
            self._memory(line)
        retracted = _RETRACTED.search(line)
        if retracted:
            self.facts["retracted_reqs"] = self.facts.get("retracted_reqs", 0) + int(retracted.group(1))
        if "KV Cache is allocated" in line:
            m = re.search(r"#tokens: (\d+)", line)
            if m:
                self.facts.setdefault("kv_tokens", int(m.group(1)))
            bits = _kv_bits(line)             # SGLang 0.5.17+ names the pool's dtype; 0.5.9 does not
            if bits:
                self.facts.setdefault("kv_cache_bits", bits)

    def _memory(self, line: str) -> None:
        """What startup says about memory: the largest decode batch captured in a CUDA graph (`graph_bs_max`),
        what the decode graphs took (`graph_mem_gb`), the GPU's memory before the weights (`gpu_mem_gb`)."""
        bs, graph, gpu = _GRAPH_BS.search(line), _GRAPH_GB.search(line), _GPU_GB.search(line)
        if bs:
            self.facts["graph_bs_max"] = max(int(b) for b in bs.group(1).split(",") if b.strip())
        if graph:
            self.facts["graph_mem_gb"] = float(graph.group(1))
        if gpu:
            self.facts.setdefault("gpu_mem_gb", float(gpu.group(1)))

    def _decode_state(self, line: str) -> None:
        """What the decode lines say about the batch: the largest one (`decode_bs_max`), the largest that ran
        without a CUDA graph (`decode_bs_nograph_max`: with graphs on, a batch above the captured sizes), and the
        longest queue while the running batch stood at the server's `max_running_requests` (`decode_queue_at_cap`:
        admission, not the KV pool, held requests back), and the longest while the KV pool was full
        (`decode_queue_pool_full`: token usage >= POOL_FULL; the pool held them back, whatever the cap)."""
        m = _DECODE_STATE.search(line)
        if not m:
            return
        bs, graph, queue = int(m.group(1)), m.group(2) == "True", int(m.group(3))
        f = self.facts
        f["decode_bs_max"] = max(f.get("decode_bs_max", 0), bs)
        if not graph:
            f["decode_bs_nograph_max"] = max(f.get("decode_bs_nograph_max", 0), bs)
        cap = f.get("max_running_requests")
        if cap and bs >= cap and queue:
            f["decode_queue_at_cap"] = max(f.get("decode_queue_at_cap", 0), queue)
        usage = _TOKEN_USAGE.search(line)
        if queue and usage and float(usage.group(1)) >= POOL_FULL:
            f["decode_queue_pool_full"] = max(f.get("decode_queue_pool_full", 0), queue)

    def text(self) -> str:
        """The crash evidence kept so far: context before the first death line, and everything after."""
        return "\n".join([*self._pre, *self._head, *self._tail])

    def crash_info(self, phase: str, level: int | None = None, exit_code: int | None = None,
                   detected_at: float | None = None) -> CrashInfo | None:
        info = classify(self.text(), phase, level, exit_code)
        if info is None:
            return None
        info.log_offset = self.first_traceback_offset
        if detected_at is not None and self.first_traceback_at is not None:
            info.detect_latency_s = max(0.0, detected_at - self.first_traceback_at)
        return info
