"""Crash catalog and LogWatcher against real SGLang log text.

Real logs (tests/fixtures/logs, SGLang 0.5.17 on an H200) cover the startup OOM, the runtime crash and the
ready milestones. The other signatures are exercised with the exact strings of the reference crash catalog
placed inside a real scheduler traceback frame taken from those logs.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.helpers.spec_text import refusal

from tunectl.sglang.crashes.classifier import SIGNATURES, LogWatcher, classify
from tunectl.models import CRASH_CLASSES

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def _log(name: str) -> str:
    return (LOGS / name).read_text()


def _real_frames() -> list[str]:
    """The first frames of the real runtime-crash scheduler traceback (up to `run_batch`)."""
    lines = _log("server-runtime-crash.log").splitlines()
    i = next(k for k, ln in enumerate(lines) if "Scheduler hit an exception" in ln)
    return lines[i + 1:i + 11]


def in_traceback(*exception_lines: str, frames: tuple[str, ...] = (), when: str = "16:14:48") -> str:
    head = f"[2026-12-02 {when}] Scheduler hit an exception: Traceback (most recent call last):"
    tail = [f"[2026-12-02 {when}] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
            f"[2026-12-02 {when}] kill_process_tree called: parent_pid=4159, include_parent=True, pid=4159"]
    return "\n".join([head, *_real_frames(), *frames, *exception_lines, "", *tail]) + "\n"


TS = "[2026-02-12 11:38:29]"
CASES = [  # (signature, text, phase, expected class)
    ("page_table_1_flattened",
     in_traceback("AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"),
     "load", "load_crash"),
    ("page_table_1_flattened",
     in_traceback("AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"),
     "startup", "config_error"),
    ("page_table_1_flattened_assert",
     in_traceback("AssertionError: page_table_1_flattened should have been generated for FP8 MHA path"),
     "load", "load_crash"),
    ("not_enough_memory", in_traceback("RuntimeError: Not enough memory. Please try to increase "
                                       "--mem-fraction-static. Current value: mem_fraction_static=0.6"),
     "startup", "config_error"),
    ("capture_cuda_graph_failed",
     in_traceback("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB.", "",
                  "During handling of the above exception, another exception occurred:", "",
                  "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.",
                  "Possible solutions:", "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)"),
     "startup", "config_error"),
    ("cuda_oom_runtime", in_traceback("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                                      "GPU 0 has a total capacity of 139.80 GiB of which 1.31 GiB is free."),
     "load", "load_crash"),
    ("kv_pool_oom", in_traceback("RuntimeError: Decode out of memory. Try to lower your batch size.",
                                 "Try to allocate 148 tokens. Available tokens: 2048"), "load", "load_crash"),
    ("kv_pool_oom", in_traceback("RuntimeError: Prefill out of memory. Try to lower your batch size."),
     "load", "load_crash"),
    ("nccl_watchdog_timeout",
     ("[rank3]:[E416 13:29:57.332110411 ProcessGroupNCCL.cpp:2057] [PG ID 2 PG GUID 3 Rank 3] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=12345, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=600000) ran for 600021 milliseconds before timing out.\n"
     f"{TS} Subprocess scheduler_3 (pid=2440) crashed with exit code -6. Triggering SIGQUIT for cleanup...\n"),
     "load", "flaky"),
    ("illegal_memory_access",
     in_traceback("RuntimeError: CUDA error: an illegal memory access was encountered",
                  "CUDA kernel errors might be asynchronously reported at some other API call.",
                  "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."), "load", "flaky"),
    ("scheduler_watchdog_timeout",
     (f"{TS} Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)\n"
     f"{TS} Pyspy failed (py-spy not installed)\n"), "load", "hang"),
    ("scheduler_watchdog_timeout",
     f"{TS} Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)\n", "startup",
     "startup_timeout"),
    ("flashinfer_autotune_race",
     in_traceback("FileExistsError: [Errno 17] File exists: '/root/.cache/flashinfer/cubins/fmha/sm100.so'"),
     "startup", "flaky"),
    ("flashinfer_autotune_failed",
     in_traceback("RuntimeError: trtllm_fp4_block_scale_moe failed with error code 700",
                  frames=(('  File "/sgl/sglang/srt/model_executor/runner/flashinfer_autotune.py", line 310, '
                          'in _flashinfer_autotune'),)), "startup", "config_error"),
    ("flashinfer_autotune_failed",
     in_traceback("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB.",
                  frames=(('  File "/sgl/sglang/srt/model_executor/model_runner.py", line 1735, in '
                          '_flashinfer_autotune'),)), "startup", "config_error"),
    ("scheduler_died_init",
     (f"{TS} Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common "
     "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.\n"), "startup", "infra"),
    ("nccl_shm",
     in_traceback("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2006, unhandled "
                  "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
                  "ncclSystemError: System call (e.g. socket, malloc) or external library call failed.",
                  "Last error:", "Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size 9637888)"),
     "startup", "infra"),
    ("warmup_error",
     (f"{TS} Initialization failed. warmup error: Traceback (most recent call last):\n"
     "  File \"/sgl/sglang/srt/entrypoints/http_server.py\", line 2520, in _execute_server_warmup\n"
     "    res.raise_for_status()\n"
     "requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: http://127.0.0.1:30000/generate\n"),
     "startup", "config_error"),
    ("argparse_error",
     ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill\n"), "startup", "config_error"),
    ("port_in_use",
     (f"{TS} ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
     "address already in use\n"), "startup", "infra"),
    ("port_in_use", f"{TS} nccl_port at 30001 is not available in 30 seconds\n", "startup", "infra"),
    ("engine_missing", "/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' "
     "(ModuleNotFoundError: No module named 'sglang')\n", "startup", "infra"),
    ("device_side_assert", _log("server-runtime-crash.log"), "load", "load_crash"),
    ("config_option_unsupported", _log("h200-tunectl/config-option-unsupported.log"), "startup", "config_error"),
    ("moe_runner_unsupported", _log("h200-ssh/moe-runner-cutedsl-bf16.log"), "startup", "config_error"),
    ("model_config_missing_field", _log("h200-ssh/glm5-shaped-missing-moe-layer-freq.log"), "startup",
     "config_error"),
    ("kernel_not_installed", _log("h200-dsa/glm5-shaped-fa3-not-installed.log"), "startup", "config_error"),
    ("python_module_missing", _log("llama8b-h100/eagle-deep-gemm-missing.log"), "startup", "config_error"),
    ("backend_needs_other_gpu",
     in_traceback("AssertionError: FlashAttention v3 Backend requires SM>=90. Please use `--attention-backend "
                  "flashinfer`."), "startup", "config_error"),
    ("backend_needs_other_gpu", in_traceback("RuntimeError: DeepGEMM is not supported on sm_120"), "startup",
     "config_error"),
    ("backend_needs_other_gpu",
     in_traceback("RuntimeError: flashinfer_trtllm MoE runner requires SM100 (sm_100a); this GPU is sm_89"),
     "startup", "config_error"),
    ("backend_unsupported_quant",
     in_traceback("ValueError: flashinfer_mxfp4 MoE runner does not support quantization 'modelopt_fp4'"),
     "startup", "config_error"),
    ("cuda_oom_startup", _log("h200-tunectl/startup-oom-cublas.log"), "startup", "config_error"),
    ("cuda_oom_startup", _log("server-startup-oom.log"), "startup", "config_error"),
    ("custom_all_reduce",
     in_traceback("RuntimeError: CUDA error: invalid argument",
                  frames=(('  File "/sgl/sglang/srt/distributed/device_communicators/custom_all_reduce.py", '
                          'line 301, in register_graph_buffers'),)), "startup", "config_error"),
    ("deepep_dispatch",
     in_traceback("RuntimeError: Failed: Assertion error /sgl-workspace/DeepEP/csrc/deep_ep.cpp:1105 "
                  "'x.size(0) <= num_max_dispatch_tokens_per_rank'"), "startup", "config_error"),
    # SGLang 0.5.9 refusing a speculative config (tests/helpers/spec_text.py: the wheel's frames and texts)
    *((sig, refusal(sig), "startup", "config_error")
      for sig in ("spec_params_partial", "spec_topk_missing", "spec_topk_trtllm", "spec_topk_paged")),
]


@pytest.mark.parametrize("sig,text,phase,cls", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_signature_classified(sig: str, text: str, phase: str, cls: str) -> None:
    info = classify(text, phase, level=512, exit_code=137)
    assert info is not None
    assert (info.signature, info.cls) == (sig, cls)
    assert info.exit_code == 137 and info.exception_line and info.traceback_excerpt
    assert info.level == (512 if phase == "load" else None)


def test_catalog_is_complete_and_every_signature_is_exercised() -> None:
    ids = {s.id for s in SIGNATURES}
    assert len(ids) == len(SIGNATURES) >= 15
    assert all(s.cls in CRASH_CLASSES and all(c in CRASH_CLASSES for c in s.by_phase.values())
               for s in SIGNATURES)
    tested = {c[0] for c in CASES} | {"health_check_failed"}
    assert ids - tested == set()


def test_exception_line_is_the_last_of_a_chained_traceback() -> None:
    info = classify(CASES[4][1], "startup", None, 137)
    assert info.exception_line.startswith("Exception: Capture cuda graph failed")


def test_health_check_failure_then_kill_is_a_hang() -> None:
    text = (f"{TS} Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. "
            "tic start time: 11:38:09. last_heartbeat time: 11:37:40\n")
    assert classify(text, "load", 256, None) is None            # unhealthy, not dead (yet)
    info = classify(text + f"{TS} kill_process_tree called: parent_pid=1, include_parent=True, pid=1\n",
                    "load", 256, 137)
    assert (info.signature, info.cls) == ("health_check_failed", "hang")


def test_unknown_crash_is_classed_by_phase() -> None:
    text = in_traceback("RuntimeError: something nobody has seen before")
    assert (classify(text, "load", 64, 137).signature, classify(text, "load", 64, 137).cls) == ("unknown",
                                                                                                "load_crash")
    assert classify(text, "startup", None, 137).cls == "config_error"


def test_exit_code_2_without_text_is_an_argparse_error() -> None:
    assert classify("", "startup", None, 2).signature == "argparse_error"


@pytest.mark.parametrize("name", ["server-graphs-on.log", "server-graphs-off.log", "server-during-bench_serving.log"])
def test_normal_runs_and_stops_are_not_crashes(name: str) -> None:
    assert classify(_log(name), "load", 256, 137) is None    # SIGTERM stop also ends with 137
    w = LogWatcher()
    w.feed((LOGS / name).read_bytes(), 1.0)
    assert not w.crashed and w.ready and w.stopping


def _feed_chunked(data: bytes, seed: int, max_chunk: int) -> LogWatcher:
    w, pos, rnd = LogWatcher(), 0, random.Random(seed)
    while pos < len(data):
        n = rnd.randint(1, max_chunk)
        w.feed(data[pos:pos + n], now=float(pos + n))   # "time" = bytes fed so far
        pos += n
    return w


@pytest.mark.parametrize("seed,max_chunk", [(1, 7), (2, 4096), (3, 65536)])
def test_watcher_reads_the_real_startup_oom_at_any_chunking(seed: int, max_chunk: int) -> None:
    data = (LOGS / "server-startup-oom.log").read_bytes()
    w = _feed_chunked(data, seed, max_chunk)
    first = data.index(b"[2026-12-02 16:11:28] Scheduler hit an exception")
    assert w.crashed and w.first_traceback_offset == first
    line_end = data.index(b"\n", first) + 1
    assert line_end <= w.first_traceback_at < line_end + max_chunk      # seen on the feed that completed it
    assert list(w.milestones) == ["server_args", "load_weight_begin", "load_weight_end", "kv_cache_allocated"]
    info = w.crash_info("startup", None, 137, detected_at=w.first_traceback_at + 0.5)
    assert (info.signature, info.cls, info.log_offset) == ("cuda_oom_startup", "config_error", first)
    assert info.detect_latency_s == pytest.approx(0.5)


@pytest.mark.parametrize("seed,max_chunk", [(4, 13), (5, 8192)])
def test_watcher_reads_the_real_runtime_crash_at_any_chunking(seed: int, max_chunk: int) -> None:
    data = (LOGS / "server-runtime-crash.log").read_bytes()
    w = _feed_chunked(data, seed, max_chunk)
    first = data.index(b"/pytorch/aten/src/ATen/native/cuda/Indexing.cu")   # the first device-side assert
    assert w.crashed and w.first_traceback_offset == first and w.ready
    assert w.facts["max_total_num_tokens"] == 8282894 and w.facts["chunked_prefill_size"] == 8192
    info = w.crash_info("load", 64, 137)
    assert (info.signature, info.cls, info.level) == ("device_side_assert", "load_crash", 64)
    assert "device-side assert triggered" in info.exception_line


def test_detection_happens_on_the_feed_that_carries_the_line() -> None:
    data = (LOGS / "server-startup-oom.log").read_bytes()
    cut = data.index(b"Scheduler hit an exception")
    end = data.index(b"\n", cut) + 1
    w = LogWatcher()
    w.feed(data[:cut + 10], now=1.0)
    assert not w.crashed                                  # the line is not complete yet
    w.feed(data[cut + 10:end], now=2.0)
    assert w.crashed and w.first_traceback_at == 2.0


def test_watcher_tracks_milestones_and_token_progress() -> None:
    data = (LOGS / "server-graphs-on.log").read_bytes()
    w = LogWatcher(start_offset=0)
    lines = data.splitlines(True)
    for i, line in enumerate(lines):
        w.feed(line, now=float(i))
    order = sorted(w.milestones, key=w.milestones.get)
    assert order[:6] == ["server_args", "load_weight_begin", "load_weight_end", "kv_cache_allocated",
                         "memory_pool_end", "cuda_graph_begin"]
    assert w.milestones["cuda_graph_end"] > w.milestones["cuda_graph_begin"]
    assert w.milestones["ready"] >= w.milestones["uvicorn_running"]
    text = data.decode()
    assert w.decode_batches == text.count("Decode batch,") and w.prefill_batches == text.count("Prefill batch,")
    assert w.offset == len(data)


def test_a_requested_stop_is_not_a_crash_and_unhealthy_is_tracked() -> None:
    w = LogWatcher()
    w.feed(f"{TS} Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.\n"
           .encode(), now=3.0)
    assert w.unhealthy_at == 3.0 and not w.crashed
    w.mark_stopping()
    w.feed(f"{TS} kill_process_tree called: parent_pid=1, include_parent=True, pid=1\n".encode(), now=4.0)
    assert not w.crashed


def test_the_exception_survives_a_flood_of_device_asserts() -> None:
    lines = (LOGS / "server-runtime-crash.log").read_bytes().splitlines(True)
    spam = next(ln for ln in lines if b"Indexing.cu" in ln)
    at = lines.index(spam)
    w = LogWatcher()
    w.feed(b"".join(lines[:at] + [spam] * 20000 + lines[at:]), now=1.0)
    info = w.crash_info("load", 128, 137)
    assert "device-side assert triggered" in info.exception_line and info.signature == "device_side_assert"
