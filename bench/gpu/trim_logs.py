"""Keeps a results folder from the GPU machine small enough for the repository: in every server.log under DIR,
drops the HTTP access lines and keeps at most KEEP of the per-batch lines (`Prefill batch` / `Decode batch`,
evenly spaced); every other line (milestones, warnings, tracebacks, the patch's log line) stays. Each dropped
run is replaced by one line saying how many lines of which kind went.

  python3 bench/gpu/trim_logs.py DIR [KEEP]
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ACCESS = re.compile(r'"(?:GET|POST) /[^"]*HTTP/1\.[01]" \d{3}')
BATCH = re.compile(r"\] (?:Prefill|Decode) batch")


def trim(text: str, keep: int) -> str:
    lines = text.splitlines()
    batches = [i for i, ln in enumerate(lines) if BATCH.search(ln)]
    step = max(1, -(-len(batches) // keep)) if batches else 1
    kept_batches = set(batches[::step])
    out: list[str] = []
    dropped = {"HTTP access": 0, "batch": 0}

    def flush() -> None:
        for kind, n in dropped.items():
            if n:
                out.append(f"[... {n} {kind} line(s) trimmed ...]")
                dropped[kind] = 0

    for i, ln in enumerate(lines):
        if ACCESS.search(ln):
            dropped["HTTP access"] += 1
        elif i in batches and i not in kept_batches:
            dropped["batch"] += 1
        else:
            flush()
            out.append(ln)
    flush()
    return "\n".join(out) + "\n"


def main(root: Path, keep: int) -> None:
    for log in sorted(root.rglob("server.log")):
        before = log.stat().st_size
        log.write_text(trim(log.read_text(errors="replace"), keep))
        print(f"{log}: {before:,} -> {log.stat().st_size:,} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 60)
