"""The resolved server setup: which flags, patches and env give which step costs, KV pool and startup crashes.

Pure: the card (sim/card.py) holds the numbers, this module holds SGLang's rules. The live stand-in and the
virtual model both use it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from tunectl.sim.card import Card
from tunectl.sim.spec import Spec, max_running, resolve_spec

PATCH_AUTOTUNE = "0001-flashinfer-cutlass-autotune"
DEFAULTS: dict[str, Any] = {  # SGLang 0.5.9 defaults for the flags the model reads
    "disable_cuda_graph": False, "cuda_graph_max_bs": 256, "max_running_requests": 2048,
    "chunked_prefill_size": 8192, "mem_fraction_static": 0.88, "kv_cache_dtype": "auto",
    "moe_runner_backend": "auto", "disable_flashinfer_autotune": False, "disable_radix_cache": False,
    "disable_chunked_prefix_cache": False, "attention_backend": None, "prefill_attention_backend": None,
    "decode_attention_backend": None, "nsa_prefill_backend": None, "nsa_decode_backend": None,
    "enable_two_batch_overlap": False, "stream_interval": 1, "watchdog_timeout": 300.0,
}


# 0.5.17's (and 0.5.23's) names of the knobs the model reads under their 0.5.9 names.
RENAMED_0517 = {"cuda_graph_max_bs_decode": "cuda_graph_max_bs", "dsa_prefill_backend": "nsa_prefill_backend",
                "dsa_decode_backend": "nsa_decode_backend"}


def normalize(config: dict[str, Any]) -> dict[str, Any]:
    """A config as the model reads it, live (the parsed namespace) or virtual (a profile's flags): underscored
    names, SGLang's defaults for what it leaves unset, later versions' names as 0.5.9's (a 0.5.9 parser refuses
    them, so a 0.5.9 config never has them)."""
    given = {k.lstrip("-").replace("-", "_"): v for k, v in config.items() if v is not None}
    for new, old in RENAMED_0517.items():
        if new in given:
            given[old] = given.pop(new)
    if given.get("cuda_graph_backend_decode") == "disabled":
        given["disable_cuda_graph"] = True
    return {**DEFAULTS, **given}


@dataclass
class StartupCrash:
    phase: str            # "load_weights" | "memory_pool" | "kv_alloc" | "autotune" | "cuda_graph"
    signature: str        # the stand-in's own name for it (the crash catalog classifies the log text)
    exception: str        # last traceback line, the real exception text
    oom_mib: float = 0.0


@dataclass
class Setup:
    card: Card
    graphs: bool
    graph_max_bs: int
    graph_bs: list[int]
    max_running: int
    chunk: int
    mfs: float
    kv_dtype: str
    kv_tokens: int
    moe: str | None
    step_mult: float               # MoE runner x attention backend (decode)
    prefill_mult: float
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
    jit_s: float = 0.0             # modeled seconds of kernel compiles at the start of graph capture (or warmup)
    attention: str | None = None   # the attention backend in effect (sim/power.py: its kernels' power)
    spec: Spec | None = None       # speculative decoding in effect (sim/spec.py)
    refused: tuple[int, str, str] | None = None   # SGLang refused the speculative flags (sim/spec.py)

    @property
    def jit_phase(self) -> str:
        return "cuda_graph" if self.graphs else "warmup"

    def decode_ms(self, bs: int, kv_tokens: int = 0) -> float:
        d = self.card.decode
        if self.spec is not None:
            return self.spec_ms(bs, kv_tokens)
        experts = d.expert_ms * (1.0 - math.exp(-bs / d.expert_bs))        # saturates once every expert is hit
        t = d.base_ms + experts + d.per_req_ms * d.kv_mult.get(self.kv_dtype, 1.0) * bs
        t += d.per_kv_ktoken_ms * kv_tokens / 1000.0                         # attention over the running KV
        t = t if self.graph_used(bs) else eager_ms(t, d.launch_ms, d.launch_overlap_p)   # graphs remove launches
        return t * self.step_mult * (d.radix_mult if self.radix else 1.0)

    def spec_ms(self, bs: int, kv_tokens: int) -> float:
        """One token's share of a speculative round: (draft + verify of bs x draft tokens) / accept length."""
        d, sp = self.card.decode, self.spec
        assert sp is not None and self.card.speculative is not None
        experts = d.expert_ms * (1.0 - math.exp(-bs / d.expert_bs))
        tokens = bs * sp.draft_tokens * self.card.speculative.verify_per_token_mult
        t = d.base_ms + experts + d.per_req_ms * d.kv_mult.get(self.kv_dtype, 1.0) * tokens
        t += d.per_kv_ktoken_ms * kv_tokens / 1000.0
        t = t if self.graph_used(bs) else eager_ms(t, d.launch_ms, d.launch_overlap_p)
        t *= self.step_mult * (d.radix_mult if self.radix else 1.0)
        rounds = self.card.speculative.round_ms_per_token * bs * sp.draft_tokens
        return (t + sp.draft_ms(bs, self.graph_used(bs)) + rounds) / sp.accept_len()

    def prefill_ms(self, tokens: int) -> float:
        p = self.card.prefill
        t = (p.base_ms + p.per_token_ms * tokens) * self.prefill_mult
        t *= self.card.decode.radix_mult if self.radix else 1.0
        t *= p.trtllm_nsa_prefill_mult if self.nsa_prefill_trtllm else 1.0
        return t * (1.0 if self.chunked_prefix_cache else p.no_chunked_prefix_cache_mult)

    def graph_used(self, bs: int) -> bool:
        return self.graphs and bs <= self.graph_max_bs

    def startup_s(self) -> float:
        jit = self.jit_s if any(p == self.jit_phase for p, _ in self.phases) else 0.0
        return sum(s for _, s in self.phases) + jit

    def activation_gb(self) -> float:
        m = self.card.memory
        return m.activation_gb + m.activation_gb_per_1k_chunk * min(self.chunk, 1 << 17) / 1024

    def autotune_gb(self) -> float:
        moe = self.card.moe
        return 0.0 if moe is None else (
            moe.autotune_workspace_gb + moe.autotune_workspace_gb_per_1k_chunk * min(self.chunk, 1 << 17) / 1024)


def eager_ms(gpu_ms: float, launch_ms: float, overlap_p: float) -> float:
    """A step without CUDA graphs: the GPU's work and the CPU's kernel launches. Launches are asynchronous, so the
    CPU runs ahead while the GPU works: the step is bound by the slower of the two, softened where they meet (the
    p-norm; measured on a real H100, docs/real-gpu.md: eager steps of ~19 ms at any batch up to 64 where graphs
    take 6-9 ms, and within 10% of graphs at 256). overlap_p 0: the two add up (cards fitted before it)."""
    if overlap_p <= 0:
        return gpu_ms + launch_ms
    return (gpu_ms ** overlap_p + launch_ms ** overlap_p) ** (1.0 / overlap_p)


def capture_list(max_bs: int) -> list[int]:
    cand = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 4097, 16))
    out = [b for b in cand if b <= max_bs]
    return out + ([max_bs] if max_bs not in out else [])


def _patch_ids(patches: list[str] | tuple[str, ...]) -> set[str]:
    """Patch ids with and without their number prefix (`0001-x` and `x`)."""
    out = {p for pid in patches for p in (pid, re.sub(r"^\d{4}-", "", pid))}
    return out


def _runner(card: Card, c: dict[str, Any], patches: set[str]) -> tuple[str | None, float, bool]:
    """(MoE runner, its step multiplier, autotune on)."""
    if card.moe is None:
        return None, 1.0, False
    moe = card.moe.auto if c["moe_runner_backend"] == "auto" else c["moe_runner_backend"]
    runner = card.moe.runners.get(moe)
    if runner is None:
        return moe, 1.0, False
    wanted = runner.autotune == "always" or runner.autotune == "with_patch" and (
        PATCH_AUTOTUNE in patches or PATCH_AUTOTUNE.split("-", 1)[1] in patches)
    autotune = wanted and not c["disable_flashinfer_autotune"] and runner.tuned is not None
    return moe, (runner.tuned if autotune and runner.tuned else runner.untuned), autotune


def _attention(card: Card, c: dict[str, Any]) -> tuple[str | None, float, float]:
    if card.attention is None:
        return c["attention_backend"], 1.0, 1.0
    name = c["attention_backend"] or card.attention.auto
    b = card.attention.backends.get(name)
    return name, (b.decode_mult if b else 1.0), (b.prefill_mult if b else 1.0)


def resolve(card: Card, config: dict[str, Any], env: dict[str, str] | None = None,
            patches: list[str] | tuple[str, ...] = (), version: str = "0.5.9") -> Setup:
    c, env = normalize(config), env or {}
    pids = _patch_ids(patches)
    moe, moe_mult, autotune = _runner(card, c, pids)
    attn, attn_decode, attn_prefill = _attention(card, c)
    kv = c["kv_cache_dtype"]
    kv_dtype = card.memory.kv_auto_dtype if kv == "auto" else ("bf16" if kv in ("bf16", "bfloat16") else "fp8")
    graphs = not c["disable_cuda_graph"]
    pt1 = card.page_table_1_flattened
    s = Setup(
        card=card, graphs=graphs, graph_max_bs=int(c["cuda_graph_max_bs"]),
        graph_bs=capture_list(int(c["cuda_graph_max_bs"])) if graphs else [],
        max_running=int(c["max_running_requests"]), chunk=_chunk(c), mfs=float(c["mem_fraction_static"]),
        kv_dtype=kv_dtype, kv_tokens=0, moe=moe, step_mult=moe_mult * attn_decode,
        prefill_mult=moe_mult * attn_prefill, autotune=autotune,
        radix=not c["disable_radix_cache"], chunked_prefix_cache=not c["disable_chunked_prefix_cache"],
        pt1_prone=False, pt1_threshold=int(env.get("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD",
                                                   pt1.default_threshold if pt1 else 8192)),
        nsa_prefill_trtllm=c["nsa_prefill_backend"] == "trtllm",
        hang=card.hang is not None and bool(c.get(card.hang.flag)), stream_interval=max(1, int(c["stream_interval"])),
        watchdog_s=float(c["watchdog_timeout"]))
    s.pt1_prone = (pt1 is not None and kv_dtype == pt1.kv_dtype and s.chunked_prefix_cache
                   and not _patch_ids([pt1.fixed_by_patch]) & pids and _metadata_lacks_field(c))
    s.jit_s, s.attention = _jit_s(card, moe), attn
    s.spec, s.refused = resolve_spec(card, c, env, version)
    s.max_running = max_running(_given(config), s.spec, s.max_running)
    if s.refused is not None:              # ServerArgs refuses it before anything starts (sim/spec.py)
        s.crash = StartupCrash("server_args", "speculative_refused", s.refused[2])
        return s
    _plan_startup(s, card, attn)
    return s


def _given(config: dict[str, Any]) -> dict[str, Any]:
    return {k.lstrip("-").replace("-", "_"): v for k, v in config.items() if v is not None}


def _jit_s(card: Card, moe: str | None) -> float:
    runner = card.moe.runners.get(moe) if card.moe is not None and moe is not None else None
    return runner.jit_compile_s if runner is not None else 0.0


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


def _unsupported(s: Setup, card: Card, attn: str | None) -> str | None:
    if card.moe is not None and s.moe in card.moe.unsupported:
        return card.moe.unsupported[s.moe]
    if card.attention is not None and attn in card.attention.unsupported:
        return card.attention.unsupported[attn]
    return None


def _plan_startup(s: Setup, card: Card, attn: str | None) -> None:
    m, t, gpu_gb = card.memory, card.startup_s, card.gpu.memory_gb
    free = (1.0 - s.mfs) * gpu_gb
    s.phases = [("init", t.init)]
    unsupported = _unsupported(s, card, attn)
    if unsupported is not None:
        s.crash = StartupCrash("load_weights", "unsupported_backend", unsupported)
        return
    s.phases.append(("load_weights", t.load_weights))
    kv_gb = s.mfs * gpu_gb - m.weights_gb - (s.spec.draft.weights_gb if s.spec is not None else 0.0)
    if kv_gb <= 0:
        s.crash = StartupCrash("memory_pool", "not_enough_memory", "RuntimeError: Not enough memory. "
                               "Please try to increase --mem-fraction-static.")
        return
    s.kv_tokens = int(kv_gb * 1e9 / m.kv_bytes_per_token[s.kv_dtype])
    act = s.activation_gb()
    if free < act:
        s.crash = _oom(card, "kv_alloc", "cuda_oom_startup", act - free, free)
        return
    s.phases.append(("kv_alloc", t.kv_alloc))
    if s.autotune:
        if free < act + s.autotune_gb():
            s.crash = _oom(card, "autotune", "autotune_oom", act + s.autotune_gb() - free, free - act)
            return
        s.phases.append(("autotune", t.autotune))
    if s.graphs:
        need = act + m.graph_fixed_gb + m.graph_per_bs_gb * s.graph_max_bs * _graph_share(s)
        if free < need:
            s.crash = _oom(card, "cuda_graph", "cuda_graph_capture_failed", need - free, free - act)
            s.crash.exception = "Exception: Capture cuda graph failed: " + s.crash.exception.split(": ", 1)[1]
            return
        s.phases.append(("cuda_graph", t.graph_per_bs * len(s.graph_bs)))
    s.phases.append(("warmup", t.warmup))


def _graph_share(s: Setup) -> float:
    """Capture memory against a plain decode graph's: speculative graphs hold bs x draft tokens."""
    sc = s.card.speculative
    return 1.0 if s.spec is None or sc is None else 1.0 + sc.graph_mem_per_draft_token * (s.spec.draft_tokens - 1)


def _oom(card: Card, phase: str, sig: str, short_gb: float, free_gb: float) -> StartupCrash:
    mib = max(2.0, math.ceil(short_gb * 1e9 / 2**20 / 2) * 2)
    text = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {mib:.2f} MiB. GPU 0 has a total "
            f"capacity of {card.gpu.total_gib:.2f} GiB of which {max(free_gb, 0.0) * 1e9 / 2**20:.2f} MiB is free.")
    return StartupCrash(phase, sig, text, mib)
