"""The sim card: every number the stand-in uses for one model on one GPU box, as a validated schema.

A card is `sim/cards/<name>.yaml` (by name) or any YAML file (by path). Unknown or missing keys fail with one line
naming file:line, the key and what is expected, like profiles. Dense models leave out `moe`; models without the
page_table_1_flattened bug leave out that section; boxes without the two-batch-overlap deadlock leave out `hang`.
Sizes are per GPU, in decimal GB; times are modeled (real-hardware) milliseconds or seconds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tunectl.errors import ProfileError
from tunectl.yamlmodel import Strict, load_model

CARDS_DIR = Path(__file__).parent / "cards"
KvDtype = Literal["fp8", "bf16"]


class Gpu(Strict):
    name: str = Field(description="the GPU's name, e.g. 'NVIDIA H200'")
    sm: int = Field(description="compute capability x10, e.g. 90 for Hopper")
    memory_gb: float = Field(gt=0, description="memory per GPU in GB (the pool and free memory are shares of it)")
    total_gib: float = Field(gt=0, description="total capacity torch reports in GiB (OOM messages)")
    count: int = Field(1, ge=1, description="GPUs the server spans (tensor parallel size)")


class Memory(Strict):
    weights_gb: float = Field(ge=0, description="weights per GPU in GB")
    activation_gb: float = Field(ge=0, description="free memory the forward pass needs outside the static pool")
    activation_gb_per_1k_chunk: float = Field(0.0, ge=0, description="plus this per 1,024 chunked-prefill tokens")
    graph_fixed_gb: float = Field(ge=0, description="CUDA graph capture: fixed memory")
    graph_per_bs_gb: float = Field(ge=0, description="CUDA graph capture: memory per unit of max batch size")
    kv_bytes_per_token: dict[KvDtype, int] = Field(description="KV cache bytes per token per GPU, fp8 and bf16")
    kv_auto_dtype: KvDtype = Field(description="what --kv-cache-dtype auto resolves to")


class Decode(Strict):
    base_ms: float = Field(ge=0, description="fixed per decode step")
    per_req_ms: float = Field(ge=0, description="per running request")
    per_kv_ktoken_ms: float = Field(0.0, ge=0, description="per 1,000 tokens of KV the running batch attends to")
    launch_ms: float = Field(ge=0, description="eager kernel-launch overhead that CUDA graphs remove")
    launch_overlap_p: float = Field(
        0.0, ge=0, description="eager steps: the CPU's launches run ahead of the GPU's work, so a step takes the "
        "p-norm (t^p + launch^p)^(1/p) of the GPU time t and launch_ms, the slower of the two softened where they "
        "meet; 0: their sum (no overlap)")
    expert_ms: float = Field(0.0, ge=0, description="MoE expert weight reads at saturation (0: dense)")
    expert_bs: float = Field(1.0, gt=0, description="batch size scale of the expert-read saturation")
    kv_mult: dict[KvDtype, float] = Field(default_factory=lambda: {"fp8": 1.0, "bf16": 1.0})
    radix_mult: float = Field(1.0, gt=0, description="radix cache bookkeeping per step")


class Prefill(Strict):
    base_ms: float = Field(ge=0)
    per_token_ms: float = Field(ge=0)
    trtllm_nsa_prefill_mult: float = 1.0
    no_chunked_prefix_cache_mult: float = 1.0


class Runner(Strict):
    untuned: float = Field(gt=0, description="step-time multiplier without FlashInfer autotune")
    tuned: float | None = Field(None, gt=0, description="with autotune (None: autotune does nothing for it)")
    autotune: Literal["always", "with_patch", "never"] = Field(
        "never", description="when SGLang autotunes it: always, only with patch 0001, never")
    jit_compile_s: float = Field(0.0, ge=0, description="modeled seconds its kernels JIT-compile at the start of "
                                 "graph capture (ninja + nvcc children, log silent); the stand-in has no kernel "
                                 "cache: every start compiles, as the first start on a fresh host does")


class Moe(Strict):
    auto: str = Field(description="the runner --moe-runner-backend auto picks")
    runners: dict[str, Runner]
    unsupported: dict[str, str] = Field(default_factory=dict, description="runner -> startup exception line")
    autotune_workspace_gb: float = Field(0.0, ge=0, description="free memory the autotune dummy run needs")
    autotune_workspace_gb_per_1k_chunk: float = Field(0.0, ge=0)


class Backend(Strict):
    decode_mult: float = 1.0
    prefill_mult: float = 1.0


class Attention(Strict):
    auto: str = Field(description="the backend --attention-backend unset picks")
    backends: dict[str, Backend]
    unsupported: dict[str, str] = Field(default_factory=dict, description="backend -> startup exception line")


class StartupSeconds(Strict):
    init: float
    load_weights: float
    kv_alloc: float
    graph_per_bs: float
    autotune: float = 0.0
    warmup: float


class PageTable1Flattened(Strict):
    """FP8 KV on a DSA model + chunked prefix cache + an attention path whose metadata lacks the field."""

    kv_dtype: KvDtype = "fp8"
    fixed_by_patch: str = "0002-page-table-1-flattened"
    default_threshold: int = Field(description="SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD default")
    tokens_per_running: float = Field(gt=0)
    ref_batch_reqs: float = Field(gt=0)


class Hang(Strict):
    flag: str = Field(description="the flag (underscored) that deadlocks the first decode batch")
    min_bs: int = 2


class Admission(Strict):
    new_token_ratio: float = Field(0.3, gt=0, le=1, description="share of max_new_tokens reserved at admission")
    retract_decay_steps: int = Field(600, ge=1, description="decode steps for the ratio to fall back after a "
                                                            "retraction raised it to 1")


class Noise(Strict):
    """Variation a real server shows (sim/noise.py); calibrated from the real-GPU measurements (docs/real-gpu.md:
    ~9-10% spread between three fresh launches at 8 x c requests per level)."""

    launch: float = Field(0.05, ge=0, description="log-normal sd of a launch's speed (fresh launches differ)")
    launch_eager: float | None = Field(
        None, ge=0, description="log-normal sd of a launch's speed on eager decode steps (graphs off, or a batch above "
        "their max bs), drawn with the same sign as `launch`: eager decoding is bound by the CPU's kernel launches, "
        "which move between launches more than graphed steps do (a real H100: docs/landscapes.md); none: `launch`")
    level: float = Field(0.03, ge=0, description="log-normal sd of the speed's drift within a launch")
    period_s: float = Field(10.0, gt=0, description="modeled seconds of work between drift draws")
    machine: float = Field(
        0.0, ge=0, description="log-normal sd of the machine's state: a speed every launch on the machine reads alike "
        "while it lasts (clocks under the power cap, the host's own drift), then another is drawn; fresh launches "
        "run next to each other share it, launches far apart in the campaign do not. A real H200 read 12% more at "
        "its busiest level from one launch to the next, for the rest of ten (docs/real-gpu.md, 'The third lease'). "
        "0: off")
    machine_launches: float = Field(
        10.0, ge=1, description="launches a machine state lasts on average (a new one is drawn before a launch with "
        "probability 1 / this)")
    machine_eager: float | None = Field(
        None, ge=0, description="log-normal sd of the machine's state on eager decode steps, drawn with the same sign "
        "as `machine`: another machine's host launches kernels at its own speed, so its state moves eager steps more "
        "than graphed ones (a fourth H100 read graphed twins 5-8% and eager ones 14-44% below the first: "
        "docs/real-gpu.md, 'What lease 6 measured'); none: `machine`")


class BestStable(Strict):
    output_throughput: float
    concurrency: int
    flags: dict[str, object] = Field(default_factory=dict)
    patches: list[str] = Field(default_factory=list)
    profile: str | None = Field(None, description="the profile whose space was scanned")


class Landscape(Strict):
    best_stable: BestStable
    seeds_best: dict[str, float] | None = None


class Power(Strict):
    """Board power per GPU (sim/power.py). A step draws idle + (max - idle) x its load: a decode step's load grows
    with its batch (memory-bound small batches leave the tensor cores waiting: bs / (bs + decode_half_bs)), a
    prefill step's is `prefill_load`; an idle GPU draws `idle_w`."""

    idle_w: float = Field(gt=0, description="watts per GPU with nothing running (weights and KV pool resident)")
    max_w: float = Field(gt=0, description="watts per GPU at full load (the board's power limit, TDP)")
    decode_half_bs: float = Field(32.0, gt=0, description="decode batch at which a step draws half the dynamic power")
    prefill_load: float = Field(0.9, gt=0, le=1, description="share of the dynamic power a prefill step draws")
    kernel_mult: dict[str, float] = Field(default_factory=dict, description="dynamic power of an attention backend's "
                                          "or MoE runner's kernels relative to the card's default (1.0)")
    source: str = Field("", description="where the numbers come from")

    @model_validator(mode="after")
    def _check(self) -> Power:
        if self.max_w <= self.idle_w:
            raise ValueError(f"max_w ({self.max_w:g}) must be above idle_w ({self.idle_w:g})")
        return self


class SpecDraft(Strict):
    """One draft (a draft model, the target itself, or NGRAM's lookup): what a draft step costs, how often the
    target accepts its tokens (per workload kind; `default` for the others)."""

    step_ms: float = Field(ge=0, description="one draft forward (or NGRAM lookup), fixed part")
    per_req_ms: float = Field(0.0, ge=0, description="plus this per running request x topk branch")
    launch_ms: float = Field(0.0, ge=0, description="eager launch overhead per draft step that CUDA graphs remove")
    accept: dict[str, float] = Field(description="workload kind -> chance the target accepts a drafted token; "
                                     "`default` for kinds not named")
    weights_gb: float = Field(0.0, ge=0, description="draft weights per GPU in GB")
    algorithms: list[str] = Field(default_factory=list, description="the algorithms the draft was trained for "
                                  "(empty: any); under another its tokens are rejected (acceptance 0)")
    max_bfs_breadth: int = Field(1, ge=1, description="NGRAM: --speculative-ngram-max-bfs-breadth default (topk)")
    max_match_window_size: int = Field(12, ge=1, description="NGRAM: draft tokens when not given")

    def accept_on(self, workload: str | None, algorithm: str | None = None) -> float:
        if self.algorithms and algorithm is not None and algorithm not in self.algorithms:
            return 0.0
        return self.accept.get(workload or "default", self.accept.get("default", 0.0))


class Speculative(Strict):
    """Speculative decoding (sim/spec.py): the drafts the card knows, by --speculative-draft-model-path."""

    drafts: dict[str, SpecDraft] = Field(default_factory=dict, description="draft model path -> its draft")
    self_draft: SpecDraft = Field(description="EAGLE without a draft path: 0.5.9 drafts with the target's weights")
    ngram: SpecDraft = Field(description="NGRAM's lookup (no draft model)")
    auto_params: tuple[int, int, int] = Field((3, 1, 4), description="(steps, topk, draft tokens) 0.5.9 picks "
                                              "for this architecture when none is given")
    verify_per_token_mult: float = Field(1.0, gt=0, description="a verified token's compute against a decoded one")
    round_ms_per_token: float = Field(0.0, ge=0, description="per request x draft token and round: the tree mask, "
                                      "the acceptance sampling and the KV slots of the drafted tokens")
    graph_mem_per_draft_token: float = Field(1.0, ge=0, description="CUDA graph capture memory grows by this x "
                                             "(draft tokens - 1) x the plain capture's per-bs memory")


class Card(Strict):
    name: str = ""
    model: str = Field(description="the model path /model_info reports")
    architecture: str
    model_type: str = Field(description="HF config model_type, e.g. llama, qwen3_moe")
    context_len: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    gpu: Gpu
    memory: Memory
    decode: Decode
    prefill: Prefill
    moe: Moe | None = None
    attention: Attention | None = None
    startup_s: StartupSeconds
    page_table_1_flattened: PageTable1Flattened | None = None
    hang: Hang | None = None
    admission: Admission = Field(default_factory=Admission)
    noise: Noise = Field(default_factory=Noise)
    landscape: Landscape | None = None
    speculative: Speculative | None = None
    power: Power | None = None


def known_cards() -> list[str]:
    return sorted(c.stem for c in CARDS_DIR.glob("*.yaml"))


def load_card(name_or_path: str | Path) -> Card:
    """A card by name (sim/cards/<name>.yaml) or by path; ProfileError names file:line and key when invalid."""
    p = Path(name_or_path)
    if not p.suffix:
        p = CARDS_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        raise ProfileError(str(p), "(file)", str(name_or_path), f"sim card not found; known cards: {known_cards()}")
    card = load_model(p, Card, "sim card")
    card.name = card.name or p.stem
    return card
