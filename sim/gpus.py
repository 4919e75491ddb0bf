"""The stand-in's GPUs: CUDA_VISIBLE_DEVICES honoured as a real server would meet it.

A server started with CUDA_VISIBLE_DEVICES sees only those GPUs: fewer than its tensor x pipeline parallel size
fail at start (as torch does: invalid device ordinal). With TUNECTL_SIM_GPU_DIR set (the stand-in's "box": one
folder shared by every server on the host), each visible GPU is claimed with an exclusive lock held for the
process's life, so a second server given a GPU already in use fails at start the way a real one runs out of memory
on a GPU another server fills. The lock goes with the process, kill -9 included.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

_HELD: list[int] = []          # the lock file descriptors, open for the process's life


def visible(env: dict[str, str]) -> list[int] | None:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [int(x) for x in raw.split(",") if x.strip().isdigit()]


def claim(env: dict[str, str], needed: int) -> str | None:
    """None when the server may run on its GPUs; else the exception line it dies with."""
    gpus = visible(env)
    if gpus is None:
        return None
    if len(gpus) < needed:
        return (f"RuntimeError: CUDA error: invalid device ordinal (the server needs {needed} GPUs, "
                f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} shows {len(gpus)})")
    box = env.get("TUNECTL_SIM_GPU_DIR")
    if not box:
        return None
    Path(box).mkdir(parents=True, exist_ok=True)
    for g in gpus[:needed]:
        fd = os.open(Path(box) / f"gpu{g}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            return (f"torch.OutOfMemoryError: CUDA out of memory. GPU {g} is in use: process {holder} has "
                    "its memory (another server on the same GPU)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD.append(fd)
    return None
