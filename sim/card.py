"""Sim cards and the resolved server setup: which flags, patches and env give which costs and crashes.

Pure: no I/O beyond reading the card file. The live stand-in and the virtual model both use this.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CARDS_DIR = Path(__file__).parent / "cards"
PATCH_AUTOTUNE = "0001-flashinfer-cutlass-autotune"
PATCH_PT1 = "0002-page-table-1-flattened"
DEFAULTS: dict[str, Any] = {  # SGLang 0.5.9 defaults for the flags the model reads
    "disable_cuda_graph": False, "cuda_graph_max_bs": 256, "max_running_requests": 2048,
    "chunked_prefill_size": 8192, "mem_fraction_static": 0.88, "kv_cache_dtype": "auto",
    "moe_runner_backend": "auto", "disable_flashinfer_autotune": False, "disable_radix_cache": False,
    "disable_chunked_prefix_cache": False, "attention_backend": None, "prefill_attention_backend": None,
    "decode_attention_backend": None, "nsa_prefill_backend": None, "nsa_decode_backend": None,
    "enable_two_batch_overlap": False, "stream_interval": 1, "watchdog_timeout": 300.0,
}


def load_card(name_or_path: str | Path) -> dict[str, Any]:
    """A card by name (sim/cards/<name>.yaml) or by path."""
    p = Path(name_or_path)
    if not p.suffix:
        p = CARDS_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        known = sorted(c.stem for c in CARDS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"sim card {str(name_or_path)!r} not found; known cards: {known}")
    card = yaml.safe_load(p.read_text())
    card.setdefault("name", p.stem)
    return card


def normalize(config: dict[str, Any]) -> dict[str, Any]:
    out = dict(DEFAULTS)
    out.update({k.lstrip("-").replace("-", "_"): v for k, v in config.items() if v is not None})
    return out


@dataclass
class StartupCrash:
    phase: str            # "load_weights" | "memory_pool" | "kv_alloc" | "autotune" | "cuda_graph"
    signature: str        # catalog id
    exception: str        # last traceback line, the real exception text
    oom_mib: float = 0.0


@dataclass
class Setup:
    card: dict[str, Any]
    graphs: bool
    graph_max_bs: int
    graph_bs: list[int]
    max_running: int
    chunk: int
    mfs: float
    kv_dtype: str
    kv_tokens: int
    moe: str
    moe_mult: float
    autotune: bool
    radix: bool
    chunked_prefix_cache: bool
    pt1_prone: bool
    pt1_threshold: int
    nsa_prefill_trtllm: bool
    hang: bool
    stream_interval: int
    watchdog_s: float
    crash: StartupCrash | None = None
    phases: list[tuple[str, float]] = field(default_factory=list)   # (phase, modeled seconds)

    def decode_ms(self, bs: int) -> float:
        d = self.card["decode"]
        experts = d["expert_ms"] * (1.0 - math.exp(-bs / d["expert_bs"]))   # saturates once every expert is hit
        t = d["base_ms"] + experts + d["per_req_ms"] * d["kv_mult"][self.kv_dtype] * bs
        t += 0.0 if self.graph_used(bs) else d["launch_ms"]                  # graphs remove the launch overhead
        return t * self.moe_mult * (d["radix_mult"] if self.radix else 1.0)

    def prefill_ms(self, tokens: int) -> float:
        p = self.card["prefill"]
        t = (p["base_ms"] + p["per_token_ms"] * tokens) * self.moe_mult
        t *= self.card["decode"]["radix_mult"] if self.radix else 1.0
        t *= p["trtllm_nsa_prefill_mult"] if self.nsa_prefill_trtllm else 1.0
        return t * (1.0 if self.chunked_prefix_cache else p["no_chunked_prefix_cache_mult"])

    def graph_used(self, bs: int) -> bool:
        return self.graphs and bs <= self.graph_max_bs

    def startup_s(self) -> float:
        return sum(s for _, s in self.phases)


def capture_list(max_bs: int) -> list[int]:
    cand = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 4097, 16))
    out = [b for b in cand if b <= max_bs]
    return out + ([max_bs] if max_bs not in out else [])


def resolve(card: dict[str, Any], config: dict[str, Any], env: dict[str, str] | None = None,
            patches: list[str] | tuple[str, ...] = ()) -> Setup:
    c, env = normalize(config), env or {}
    patches = {p for pid in patches for p in (pid, re.sub(r"^\d{4}-", "", pid))}
    patches |= {f"{n}-{p}" for n, p in (("0001", "flashinfer-cutlass-autotune"), ("0002", "page-table-1-flattened"))
                if p in patches}
    moe = c["moe_runner_backend"]
    moe = card["moe"]["auto"] if moe == "auto" else moe
    runner = card["moe"]["runners"].get(moe, {})
    autotune_list = {"flashinfer_trtllm", "flashinfer_mxfp4"} | (
        {"flashinfer_cutlass"} if PATCH_AUTOTUNE in patches else set())
    autotune = not c["disable_flashinfer_autotune"] and moe in autotune_list and "tuned" in runner
    kv = c["kv_cache_dtype"]
    kv_dtype = card["memory"]["kv_auto_dtype"] if kv == "auto" else ("bf16" if kv in ("bf16", "bfloat16") else "fp8")
    graphs = not c["disable_cuda_graph"]
    s = Setup(
        card=card, graphs=graphs, graph_max_bs=int(c["cuda_graph_max_bs"]),
        graph_bs=capture_list(int(c["cuda_graph_max_bs"])) if graphs else [],
        max_running=int(c["max_running_requests"]), chunk=_chunk(c), mfs=float(c["mem_fraction_static"]),
        kv_dtype=kv_dtype, kv_tokens=0, moe=moe,
        moe_mult=float(runner.get("tuned" if autotune else "untuned", 1.0)), autotune=autotune,
        radix=not c["disable_radix_cache"], chunked_prefix_cache=not c["disable_chunked_prefix_cache"],
        pt1_prone=False, pt1_threshold=int(env.get("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD",
                                                   card["page_table_1_flattened"]["default_threshold"])),
        nsa_prefill_trtllm=c["nsa_prefill_backend"] == "trtllm",
        hang=bool(c.get(card["hang"]["flag"])), stream_interval=max(1, int(c["stream_interval"])),
        watchdog_s=float(c["watchdog_timeout"]))
    s.pt1_prone = (kv_dtype == "fp8" and s.chunked_prefix_cache and PATCH_PT1 not in patches
                   and _metadata_lacks_field(c))
    _plan_startup(s, card)
    return s


def _chunk(c: dict[str, Any]) -> int:
    v = int(c["chunked_prefill_size"])
    return 1 << 30 if v <= 0 else v


def _metadata_lacks_field(c: dict[str, Any]) -> bool:
    """True when the MHA prefill path finds metadata without page_table_1_flattened (reference §2 row 7)."""
    attn = c["attention_backend"]
    pre, dec = c["prefill_attention_backend"], c["decode_attention_backend"]
    if pre is not None and dec is not None and pre != dec:
        return True                                   # split prefill/decode backends: HybridAttnBackend
    if "flashinfer" in (attn, pre):
        return True
    if attn == "nsa":
        return not (c["nsa_prefill_backend"] == "trtllm" and c["nsa_decode_backend"] == "trtllm")
    return False


def _plan_startup(s: Setup, card: dict[str, Any]) -> None:
    m, t = card["memory"], card["startup_s"]
    free = (1.0 - s.mfs) * m["gpu_gb"]
    s.phases = [("init", t["init"])]
    if s.moe in card["moe"].get("unsupported", {}):
        s.crash = StartupCrash("load_weights", "unsupported_backend", card["moe"]["unsupported"][s.moe])
        return
    s.phases.append(("load_weights", t["load_weights"]))
    kv_gb = s.mfs * m["gpu_gb"] - m["weights_gb"]
    if kv_gb <= 0:
        s.crash = StartupCrash("memory_pool", "not_enough_memory", "RuntimeError: Not enough memory. "
                               "Please try to increase --mem-fraction-static.")
        return
    s.kv_tokens = int(kv_gb * 1e9 / m["kv_bytes_per_token"][s.kv_dtype])
    if free < m["activation_gb"]:
        s.crash = _oom("kv_alloc", "cuda_oom_startup", m["activation_gb"] - free, free)
        return
    s.phases.append(("kv_alloc", t["kv_alloc"]))
    if s.autotune:
        if free < m["activation_gb"] + m["autotune_workspace_gb"]:
            s.crash = _oom("autotune", "autotune_oom", m["autotune_workspace_gb"], free - m["activation_gb"])
            return
        s.phases.append(("autotune", t["autotune"]))
    if s.graphs:
        need = m["activation_gb"] + m["graph_fixed_gb"] + m["graph_per_bs_gb"] * s.graph_max_bs
        if free < need:
            s.crash = _oom("cuda_graph", "cuda_graph_capture_failed", need - free, free - m["activation_gb"])
            s.crash.exception = "Exception: Capture cuda graph failed: " + s.crash.exception.split(": ", 1)[1]
            return
        s.phases.append(("cuda_graph", t["graph_per_bs"] * len(s.graph_bs)))
    s.phases.append(("warmup", t["warmup"]))


def _oom(phase: str, sig: str, short_gb: float, free_gb: float) -> StartupCrash:
    mib = max(2.0, math.ceil(short_gb * 1024 / 2) * 2)
    text = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {mib:.2f} MiB. GPU 0 has a total "
            f"capacity of 94.97 GiB of which {max(free_gb, 0.0) * 1024:.2f} MiB is free.")
    return StartupCrash(phase, sig, text, mib)
