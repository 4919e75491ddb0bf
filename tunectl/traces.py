"""Request traces with timestamps, for `kind: trace` workloads (docs/load.md).

Two formats, told apart by the file's extension:
- Mooncake JSONL (`.jsonl`): one request a line, `timestamp` (ms), `input_length`, `output_length`, and
  optional `hash_ids`: the prompt's blocks of `HASH_BLOCK` tokens; requests naming the same hash id share that
  block's tokens (a shared prefix a radix cache can hit).
- Azure LLM inference trace CSV (`.csv`): a header with `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`;
  TIMESTAMP a date-time (`2023-11-16 18:15:46.6805900`) or seconds.

`load_trace(path)` returns the requests sorted by time, offsets in seconds from the first; a bad file raises
ProfileError naming the file, the line and the field (exit 2). Files are read once per path and size.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from tunectl.errors import ProfileError

HASH_BLOCK = 512          # tokens per Mooncake hash id
AZURE_FIELDS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class TraceRequest:
    t_s: float                 # seconds after the trace's first request
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    path: str
    format: str                # "mooncake" | "azure"
    requests: tuple[TraceRequest, ...]

    @property
    def span_s(self) -> float:
        return self.requests[-1].t_s if self.requests else 0.0


def load_trace(path: str) -> Trace:
    p = Path(path)
    if p.suffix not in (".jsonl", ".csv"):
        raise ProfileError(path, "(file)", None, "a trace is a Mooncake .jsonl or an Azure .csv file")
    if not p.is_file():
        raise ProfileError(path, "(file)", None, "trace file not found")
    return _load(str(p), p.stat().st_size, p.stat().st_mtime_ns)


@lru_cache(maxsize=8)
def _load(path: str, _size: int, _mtime: int) -> Trace:
    fmt = "mooncake" if path.endswith(".jsonl") else "azure"
    raw = _mooncake(path) if fmt == "mooncake" else _azure(path)
    if not raw:
        raise ProfileError(path, "(file)", None, "the trace has no requests")
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0]
    return Trace(path, fmt, tuple(TraceRequest(t - t0, i, o, h) for t, i, o, h in raw))


def _count(path: str, line: int, field: str, value: object, zero_ok: bool = False) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= (0 if zero_ok else 1)
    if not ok:
        raise ProfileError(path, field, value, "expected a positive integer", line)
    return int(value)  # type: ignore[arg-type]


def _mooncake(path: str) -> list[tuple[float, int, int, tuple[int, ...]]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ProfileError(path, "(file)", None, f"line {n} is not JSON: {e.msg}", n) from None
            if not isinstance(row, dict):
                raise ProfileError(path, "(file)", None, "each line is a JSON object", n)
            for key in ("timestamp", "input_length", "output_length"):
                if key not in row:
                    raise ProfileError(path, key, None, "missing (Mooncake fields: timestamp in ms, input_length, "
                                       "output_length, optional hash_ids)", n)
            ts = row["timestamp"]
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
                raise ProfileError(path, "timestamp", ts, "expected milliseconds >= 0", n)
            hashes = row.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                       for h in hashes):
                raise ProfileError(path, "hash_ids", hashes, "expected a list of integers", n)
            out.append((ts / 1000.0, _count(path, n, "input_length", row["input_length"]),
                        _count(path, n, "output_length", row["output_length"]), tuple(hashes)))
    return out


def _azure(path: str) -> list[tuple[float, int, int, tuple[int, ...]]]:
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        names = [x.strip() for x in reader.fieldnames or []]
        missing = [k for k in AZURE_FIELDS if k not in names]
        if missing:
            raise ProfileError(path, missing[0], None, f"missing from the header (Azure fields: "
                               f"{', '.join(AZURE_FIELDS)}; found: {', '.join(names) or 'none'})", 1)
        reader.fieldnames = names
        for row in reader:
            n = reader.line_num
            out.append((_when(path, n, (row["TIMESTAMP"] or "").strip()),
                        _count(path, n, "ContextTokens", _int(row["ContextTokens"])),
                        _count(path, n, "GeneratedTokens", _int(row["GeneratedTokens"])), ()))
    return out


def _int(text: str | None) -> object:
    try:
        return int((text or "").strip())
    except ValueError:
        return text


def _when(path: str, line: int, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    head, _, frac = text.partition(".")
    try:
        base = datetime.fromisoformat(head)
        return base.timestamp() + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise ProfileError(path, "TIMESTAMP", text, "expected a date-time (2023-11-16 18:15:46.680) or seconds",
                           line) from None
