"""The crash-signature catalog: real SGLang failure texts, their default class and a workaround hint.

Sources: SGLang 0.5.x log/exception strings and the public issue reports they were seen in. Order is
priority: when several signatures match the same text, the first one in `SIGNATURES` wins (so
"Capture cuda graph failed: CUDA out of memory" is a capture failure, not a plain OOM).

Fields of a `Signature`:
- `cls`: default class (one of tunectl.models.CRASH_CLASSES); `by_phase` overrides it per phase
  ("startup" = before the ready line, "load" = after it).
- `phases`: the phases the signature applies to (empty = all); lets one text map to two ids, e.g.
  CUDA OOM before ready (`cuda_oom_startup`, config_error) vs under load (`cuda_oom_runtime`, load_crash).
- `fatal`: seeing the text is itself proof that the server is dying, even without a traceback.
- `generic`: a broad exception (CUDA OOM) that yields to a signature matching the traceback's frames, e.g. an
  OOM raised inside FlashInfer autotune is `flashinfer_autotune_failed`.
- `repairs`: the hint in machine-readable form, most promising first: `(target, change)` where target is an
  SGLang flag without dashes, an environment variable (upper case) or `patch:<id>` (a bundled patch), and
  change is a value to set or a direction (`LOWER`, `RAISE`: the next value of the knob's range that way).
  The search tries the repairs its space can express next to a config that crashed with the signature.
  Flags are spelled as SGLang `CATALOG_VERSION` spells them; a study on another version gets them under that
  version's names (tunectl.sglang.versions.resolve_repairs: `cuda-graph-max-bs` is `cuda-graph-max-bs-decode` on 0.5.23).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from tunectl.models import LOWER, RAISE, Repair


@dataclass(frozen=True)
class Signature:
    id: str
    regex: re.Pattern[str]
    cls: str
    description: str
    hint: str
    by_phase: dict[str, str] = field(default_factory=dict)
    phases: tuple[str, ...] = ()
    fatal: bool = False
    generic: bool = False
    repairs: tuple[Repair, ...] = ()

    def class_for(self, phase: str) -> str:
        return self.by_phase.get(phase, self.cls)

    def applies(self, phase: str) -> bool:
        return not self.phases or phase in self.phases


def _sig(id_: str, pattern: str, cls: str, description: str, hint: str, **kw: object) -> Signature:
    return Signature(id_, re.compile(pattern), cls, description, hint, **kw)  # type: ignore[arg-type]


CATALOG_VERSION = "0.5.9"
_LOAD = {"load": "load_crash", "startup": "config_error"}
OOM_TEXT = (r"(?:OutOfMemoryError: )?CUDA out of memory\.?(?: Tried to allocate [\d.]+ [GMK]iB)?"
        r"|CUBLAS_STATUS_ALLOC_FAILED")   # cuBLAS could not get its workspace: the same OOM (real 0.5.17, mfs 0.999)

SIGNATURES: tuple[Signature, ...] = (
    _sig("page_table_1_flattened",
         r"object has no attribute 'page_table_1_flattened'", "load_crash",
         "FP8-KV MHA prefill read page_table_1_flattened from non-DSA attention metadata",
         "--kv-cache-dtype bf16, --disable-chunked-prefix-cache, or let SGLang pick the NSA/DSA backend",
         by_phase=_LOAD,
         repairs=(("disable-chunked-prefix-cache", True), ("patch:0002-page-table-1-flattened", True),
                  ("kv-cache-dtype", "bf16"), ("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD", RAISE))),
    _sig("page_table_1_flattened_assert",
         r"page_table_1_flattened should have been generated for FP8 MHA path", "load_crash",
         "FP8 MHA prefix dequant path without page_table_1_flattened (sibling of page_table_1_flattened)",
         "--kv-cache-dtype bf16 or a DSA/NSA attention backend", by_phase=_LOAD,
         repairs=(("kv-cache-dtype", "bf16"), ("patch:0002-page-table-1-flattened", True))),
    _sig("not_enough_memory",
         r"Not enough memory\. Please try to increase --mem-fraction-static", "config_error",
         "KV cache pool got no memory after weights and graph reserve",
         "raise --mem-fraction-static or the TP size",
         repairs=(("mem-fraction-static", RAISE), ("tp-size", RAISE))),
    _sig("capture_cuda_graph_failed", r"Capture cuda graph failed", "config_error",
         "CUDA graph capture failed (usually OOM at a large capture batch size)",
         "lower --mem-fraction-static or --cuda-graph-max-bs, or disable decode CUDA graphs",
         repairs=(("mem-fraction-static", LOWER), ("cuda-graph-max-bs", LOWER),
                  ("disable-cuda-graph", True), ("chunked-prefill-size", LOWER))),
    _sig("custom_all_reduce",
         r"custom_all_reduce(?:_v2)?(?:\.cuh|\.py).*invalid argument|register_graph_buffers", "config_error",
         "custom all-reduce IPC registration failed during graph capture",
         "--disable-custom-all-reduce or disable CUDA graphs",
         repairs=(("disable-custom-all-reduce", True), ("disable-cuda-graph", True))),
    _sig("deepep_dispatch",
         r"x\.size\(0\) <= num_max_dispatch_tokens_per_rank|nvshmem_qp_depth"
         r"|q\.shape\[0\]\(\d+\) does not match qo_indptr\[-1\]\(\d+\)", "config_error",
         "DeepEP dispatch buffer smaller than graph batch x draft tokens",
         "raise SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK or lower --cuda-graph-max-bs",
         repairs=(("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", RAISE), ("cuda-graph-max-bs", LOWER))),
    _sig("flashinfer_autotune_race",
         r"FileExistsError: \[Errno 17\] File exists: .*(?:flashinfer|cubin)"
         r"|flashinfer\.jit: Failed to acquire lock", "flaky",
         "FlashInfer cold-cache race between ranks creating the same cubin/autotune file",
         "retry once; pre-warm the FlashInfer cache or --disable-flashinfer-autotune",
         repairs=(("disable-flashinfer-autotune", True),)),
    _sig("kv_pool_oom", r"(?:Decode|Prefill) out of memory\. Try to lower your batch size", "load_crash",
         "KV cache allocator could not serve the running batch",
         "lower --max-running-requests or concurrency, or give the KV cache more memory",
         repairs=(("max-running-requests", LOWER), ("mem-fraction-static", RAISE))),
    _sig("cuda_oom_startup", OOM_TEXT, "config_error",
         "CUDA out of memory before the server was ready",
         "lower --mem-fraction-static (startup OOM: the static pool leaves no room) or --chunked-prefill-size "
         "(prefill activations grow with it)", phases=("startup",),
         generic=True, repairs=(("mem-fraction-static", LOWER), ("chunked-prefill-size", LOWER))),
    _sig("cuda_oom_runtime", OOM_TEXT, "load_crash",
         "CUDA out of memory under load",
         "lower --chunked-prefill-size / --max-running-requests or --mem-fraction-static",
         phases=("load", "teardown"), generic=True,
         repairs=(("chunked-prefill-size", LOWER), ("max-running-requests", LOWER),
                  ("mem-fraction-static", LOWER))),
    _sig("illegal_memory_access", r"an illegal memory access was encountered|cudaErrorIllegalAddress", "flaky",
         "CUDA illegal memory access (kernel bug for a feature combination)",
         "retry once on a clean GPU; disable CUDA graphs / speculative decoding to isolate",
         repairs=(("disable-cuda-graph", True),)),
    _sig("device_side_assert",
         r"device-side assert triggered|\.cu:\d+: \w+: block: \[[\d,]+\], thread: \[[\d,]+\] Assertion",
         "load_crash", "CUDA device-side assert in a kernel (bad index / shape)",
         "a kernel bug for these flags and this traffic: change the backend flags", by_phase=_LOAD, fatal=True),
    _sig("nccl_watchdog_timeout",
         r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck"
         r"|failure detected by watchdog at work sequence id"
         r"|To avoid data inconsistency, we are taking the entire process down", "flaky",
         "an NCCL collective timed out (rank stalled, died or desynced)",
         "retry on a clean host; check NCCL_SOCKET_IFNAME; keep --watchdog-timeout below NCCL's timeout",
         fatal=True),
    _sig("nccl_shm",
         r"Error while creating shared memory segment /dev/shm/nccl-|ncclSystemError|unhandled system error",
         "infra", "NCCL could not create its /dev/shm segment (container /dev/shm too small)",
         "run with --shm-size or --ipc=host"),
    _sig("scheduler_watchdog_timeout", r"[Ww]atchdog timeout \(self\.watchdog_timeout=\d+", "hang",
         "no forward progress for --watchdog-timeout seconds", "restart; lower --watchdog-timeout to fail faster",
         by_phase={"startup": "startup_timeout"}, fatal=True),
    _sig("engine_missing", r"Error while finding module specification for '[\w.]+'", "infra",
         "the server's interpreter does not have the engine's module (`python -m` found nothing to run)",
         "install SGLang (or tunectl, for the stand-in) for server.python; `tunectl check` names the interpreter",
         fatal=True),
    _sig("scheduler_died_init", r"Rank \d+ scheduler died during initialization \(exit code: -?\d+\)", "infra",
         "a scheduler process died without a traceback while initializing (-9: host OOM killer)",
         "check `dmesg -T | grep -i oom`; more host RAM or fewer concurrent loads", fatal=True),
    _sig("warmup_error", r"Initialization failed\. warmup error", "config_error",
         "the warm-up request failed", "export no_proxy=127.0.0.1,localhost; check the traceback", fatal=True),
    _sig("argparse_error",
         r"error: (?:unrecognized arguments|ambiguous option|argument --[\w-]+|"
         r"the following arguments are required)", "config_error",
         "the server rejected its command line (exit 2)", "use the exact flag names of this SGLang version",
         fatal=True),
    _sig("moe_runner_unsupported", r"MOE (?:currently )?supports only: ", "config_error",
         "the MoE runner backend does not support this model's quantization (SGLang's own argument check)",
         "use --moe-runner-backend auto, or a backend the message lists for this quantization",
         repairs=(("moe-runner-backend", "auto"),)),
    _sig("backend_needs_other_gpu",
         r"requires SM ?(?:>= ?)?\d+|not supported on sm_?\d+|this GPU is sm_?\d+", "config_error",
         "a kernel backend the config picks does not run on this GPU's architecture (SM version)",
         "pick a backend this GPU supports, or auto; the search does not propose it again"),
    _sig("backend_unsupported_quant", r"does not support quantization '[\w-]+'", "config_error",
         "the MoE runner backend does not run this model's quantization",
         "pick another MoE runner, or auto; the search does not propose it again"),
    _sig("model_config_missing_field", r"AttributeError: '\w+Config' object has no attribute '\w+'",
         "config_error", "SGLang's model code reads a field that the model's config.json lacks",
         "add the field to config.json (the released model's config has it), or use the SGLang version the "
         "model was released for"),
    # real 0.5.17 log: the DSA backend's MHA prefill calls FA3, which an sgl_kernel build may leave out
    _sig("kernel_not_installed",
         r"ImportError: Can not import \w+ in sgl_kernel|cannot import name '\w+' from 'sgl_kernel'",
         "config_error", "the config uses a kernel the host's sgl_kernel build does not have (e.g. FA3)",
         "install the full sgl-kernel, or use a path without it: --attention-backend triton; for a DSA model's "
         "MHA prefill, SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0 (MLA prefill)",
         repairs=(("attention-backend", "triton"), ("SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD", 0))),
    # real 0.5.17 log (H100, EAGLE with a dummy draft): capturing the draft's CUDA graphs imports the DSA backend
    # (speculative/eagle_worker_v2.py:417 on CUDA), whose module imports deep_gemm, which the host's install lacks
    _sig("python_module_missing", r"ModuleNotFoundError: No module named '(?!sglang')[\w.]+'", "config_error",
         "the config reaches SGLang code that imports a Python package the host's install lacks "
         "(EAGLE's draft CUDA graphs import deep_gemm on 0.5.17)",
         "install the package on the host (SGLang's full install has it), or leave out what needs it; the search "
         "does not propose the config again"),
    # Speculative decoding refused by SGLang 0.5.9's ServerArgs._handle_speculative_decoding (server_args.py; exit
    # 1 before any log line). Frames: a bare `assert` (2423: --speculative-eagle-topk or -num-draft-tokens without
    # -num-steps) and a TypeError (2453: -num-steps alone leaves topk None, then `topk > 1`) carry no message.
    _sig("spec_params_partial",
         r"in _handle_speculative_decoding\n\s+(?:assert\b|self\.speculative_eagle_topk is None)", "config_error",
         "--speculative-eagle-topk / --speculative-num-draft-tokens given without --speculative-num-steps",
         "give --speculative-num-steps too (or none of the three: SGLang picks all three)",
         repairs=(("speculative-num-steps", 3),)),
    _sig("spec_topk_missing", r"in _handle_speculative_decoding\n\s+self\.speculative_eagle_topk > 1",
         "config_error", "--speculative-num-steps given without --speculative-eagle-topk (topk stays None)",
         "give --speculative-eagle-topk (1 for a chain) with --speculative-num-steps",
         repairs=(("speculative-eagle-topk", 1),)),
    _sig("spec_topk_trtllm", r"trtllm_mha backend only supports topk = 1 for speculative decoding",
         "config_error", "speculative topk > 1 with the trtllm_mha attention backend (server_args.py:2439)",
         "--speculative-eagle-topk 1, or another attention backend",
         repairs=(("speculative-eagle-topk", 1), ("attention-backend", "fa3"))),
    _sig("spec_topk_paged",
         r"speculative_eagle_topk(?:\(\d+\))? > 1 with page_size(?:\(\d+\))? > 1 is unstable", "config_error",
         "speculative topk > 1 with --page-size > 1 on a paged attention backend other than flashinfer/fa3 "
         "(server_args.py:2457; NGRAM's text: 2490)",
         "--speculative-eagle-topk 1, --page-size 1, or --attention-backend flashinfer",
         repairs=(("speculative-eagle-topk", 1), ("page-size", 1), ("attention-backend", "flashinfer"))),
    _sig("config_option_unsupported", r"Unsupported config option '\w+' with action", "config_error",
         "SGLang's --config parser rejects this option (a deprecated alias shares its destination)",
         "list the flag in server.argv_flags: it then goes on the command line", fatal=True),
    _sig("port_in_use",
         r"\w+_port at \d+ is not available in \d+ seconds|is used by a process already"
         r"|[Aa]ddress already in use", "infra",
         "a port the server needs is held by another process", "kill the leftover process group; wait for ports",
         fatal=True),
    # Frames only: `disable_flashinfer_autotune=False` in the server_args line is no evidence (real 0.5.17 log).
    _sig("flashinfer_autotune_failed",
         r"in _flashinfer_autotune\b|flashinfer_autotune\.py\"|in kernel_warmup|in run_flashinfer_autotune_forward",
         "config_error", "FlashInfer autotune dummy run failed", "--disable-flashinfer-autotune",
         repairs=(("disable-flashinfer-autotune", True), ("mem-fraction-static", LOWER))),
    _sig("health_check_failed",
         r"Health check failed\. Server couldn't get a response from detokenizer", "hang",
         "the detokenizer produced nothing for the health-check window", "treat as a hang: tear down"),
)

# Any of these = the server is dying; classified by the nearest specific signature, else "unknown".
DEATH_MARKERS = re.compile(
    r"hit an exception:|Received sigquit from a child proces|SIGQUIT received"
    r"|Subprocess \S+ \(pid=\d+\) crashed with exit code|kill_process_tree called|Fatal Python error"
    r"|Segmentation fault|\d+ Killed\s|Killed$|Initialization failed\."
)
SHUTDOWN_MARKER = re.compile(r"SIGTERM received|Gracefully exiting")
BY_ID = {s.id: s for s in SIGNATURES}

# tunectl's own startup deadlines (`timeout_<phase>`, runners/server/lifecycle.py) are no log text: what to change
# so that the phase ends in time. Real 0.5.17 on an H200: flashinfer_trtllm (and flashinfer_cutlass on an earlier
# lease) stood in `Running FlashInfer autotune` past the deadline (docs/real-gpu.md).
TIMEOUT_REPAIRS: dict[str, tuple[Repair, ...]] = {
    "timeout_autotune": (("disable-flashinfer-autotune", True),),
    "timeout_cuda_graph": (("cuda-graph-max-bs", LOWER), ("disable-cuda-graph", True)),
}
