"""Startup phases of the stand-in: SGLang's milestone log lines in order, scaled sleeps, startup crashes."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
from typing import Any

from tunectl.sim.setup import Setup

_DTYPE = {"fp8": "torch.float8_e4m3fn", "bf16": "torch.bfloat16"}


def _server_args(ns: Any) -> str:
    keys = [k for k in vars(ns) if not k.startswith("sim_") and k != "config"]
    return "ServerArgs(" + ", ".join(f"{k}={getattr(ns, k)!r}" for k in keys) + ")"


def _milestones(s: Setup, phase: str) -> tuple[list[str], list[str]]:
    """(lines logged when the phase begins, lines logged when it ends)."""
    m = s.card.memory
    gpu, weights = s.card.gpu.memory_gb - 1.5, m.weights_gb
    after_static = gpu - s.mfs * s.card.gpu.memory_gb + 1.5
    kv_gb = s.kv_tokens * m.kv_bytes_per_token[s.kv_dtype] / 1e9
    graph_gb = m.graph_fixed_gb + m.graph_per_bs_gb * s.graph_max_bs
    sec = dict(s.phases)
    return {
        "init": (["Init torch distributed begin."], ["Init torch distributed ends. elapsed=3.91 s, mem usage=0.52 GB"]),
        "load_weights": ([f"Load weight begin. avail mem={gpu:.2f} GB"],
                         [f"Load weight end. elapsed={sec.get('load_weights', 0):.2f} s, "
                          f"type={s.card.architecture}, avail mem={gpu - weights:.2f} GB, "
                          f"mem usage={weights:.2f} GB."]),
        "kv_alloc": ([], [f"KV Cache is allocated. dtype: {_DTYPE[s.kv_dtype]}, #tokens: {s.kv_tokens}, "
                          f"KV size: {kv_gb:.2f} GB", f"Memory pool end. avail mem={after_static:.2f} GB"]),
        "autotune": (["Running FlashInfer autotune..."], ["FlashInfer autotune completed."]),
        "cuda_graph": ([f"Capture cuda graph bs {s.graph_bs}",
                        f"Capture cuda graph begin. This can take up to several minutes. "
                        f"avail mem={after_static:.2f} GB"],
                       [f"Capture cuda graph end. Time elapsed: {sec.get('cuda_graph', 0):.2f} s. mem usage="
                        f"{graph_gb:.2f} GB. avail mem={after_static - graph_gb:.2f} GB."]),
        "warmup": ([], []),
    }.get(phase, ([], []))


def ready_line(s: Setup) -> str:
    """The scheduler's line with the pool and limits (the real one is logged after graph capture)."""
    m = s.card.memory
    graph_gb = m.graph_fixed_gb + m.graph_per_bs_gb * s.graph_max_bs if s.graphs else 0.0
    return (f"max_total_num_tokens={s.kv_tokens}, chunked_prefill_size={min(s.chunk, 1 << 20)}, "
            f"max_prefill_tokens=16384, max_running_requests={s.max_running}, context_len={s.card.context_len}, "
            f"available_gpu_mem={(1 - s.mfs) * s.card.gpu.memory_gb - graph_gb:.2f} GB")


def startup_script(s: Setup) -> list[tuple[str, list[str], float, list[str]]]:
    """(phase, lines at the start, modeled seconds, lines at the end) per phase; a startup crash ends with the
    failing phase's opening lines (its traceback follows)."""
    script = []
    for phase, seconds in s.phases:
        begin, end = _milestones(s, phase)
        script.append((phase, begin, seconds, [] if phase == "warmup" else end))
    if s.crash is not None:
        script.append(("crash", _milestones(s, s.crash.phase)[0], 0.0, []))
    return script


async def compile_kernels(wall_s: float) -> None:
    """FlashInfer's JIT on a fresh host: a `ninja` job in its own process group with an `nvcc` under it, both with
    the server's environment (so its run id), running `wall_s` while the log stays silent."""
    sleep, arg = shutil.which("sleep") or "/bin/sleep", f"{max(wall_s, 0.0):.3f}"
    ninja = subprocess.Popen(["ninja", arg], executable=sleep, process_group=0)
    nvcc = subprocess.Popen(["nvcc", arg], executable=sleep, process_group=ninja.pid)
    while ninja.poll() is None or nvcc.poll() is None:
        await asyncio.sleep(0.05)


async def run_startup(st: Any, scale: float) -> None:
    s: Setup = st.setup
    log = st.log
    log(f"server_args={_server_args(st.ns)}")
    if "0003-log-moe-runner" in st.patches:        # bundled patch 0003's line (real 0.5.17, before init)
        opt = vars(st.ns)
        log(f"tunectl patch 0003: moe_runner_backend={opt.get('moe_runner_backend') or 'auto'}, "
            f"moe_a2a_backend={opt.get('moe_a2a_backend') or 'none'}, "
            f"flashinfer_autotune={'off' if opt.get('disable_flashinfer_autotune') else 'on'}")
    for phase, begin, seconds, end in startup_script(s):
        for line in begin:
            log(line, rank=True)
        if s.jit_s and phase == s.jit_phase:
            await compile_kernels(s.jit_s * scale)
        await asyncio.sleep(seconds * scale if seconds else 0.01 if s.crash else 0)
        for line in end:
            log(line, rank=True)
    if s.crash is not None:
        st.die("startup", s.crash.exception, "startup", s.crash.phase)
        return
    log(ready_line(s), rank=True)
