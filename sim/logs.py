"""SGLang's log format and the stand-in's crash texts (traceback frames follow SGLang 0.5.9's call paths)."""
from __future__ import annotations

import sys
import time

SITE = "/usr/local/lib/python3.12/dist-packages/sglang"

_SCHED = [("srt/managers/scheduler.py", 2953, "run_scheduler_process", "scheduler.event_loop_overlap()"),
          ("srt/managers/scheduler.py", 1104, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
          ("srt/managers/scheduler.py", 2182, "run_batch",
           "batch_result = self.model_worker.forward_batch_generation(model_worker_batch)"),
          ("srt/managers/tp_worker.py", 409, "forward_batch_generation",
           "logits_output, can_run_cuda_graph = self.model_runner.forward("),
          ("srt/model_executor/model_runner.py", 2287, "forward", "output = self._forward_raw("),
          ("srt/model_executor/model_runner.py", 2352, "_forward_raw", "ret = self.forward_extend(")]
FRAMES: dict[str, list[tuple[str, int, str, str]]] = {
    "page_table_1_flattened": _SCHED + [
        ("srt/models/deepseek_v2.py", 3391, "forward",
         "hidden_states = self.model(input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)"),
        ("srt/models/deepseek_v2.py", 2660, "forward", "hidden_states, residual = layer("),
        ("srt/models/deepseek_common/attention_forward_methods/forward_mha.py", 260, "forward_normal_chunked_kv_core",
         "kv_a_normed, k_pe = self._get_mla_kv_buffer_from_fp8_for_nsa(forward_batch)"),
        ("srt/models/deepseek_common/attention_forward_methods/forward_mha.py", 655,
         "_get_mla_kv_buffer_from_fp8_for_nsa",
         "page_table_1_flattened = backend.forward_metadata.page_table_1_flattened")],
    "device_side_assert": _SCHED,
    "decode_oom": _SCHED[:3] + [
        ("srt/managers/scheduler.py", 1851, "get_next_batch_to_run", "self.running_batch = self.update_running_batch("),
        ("srt/managers/schedule_batch.py", 1630, "prepare_for_decode",
         "self.out_cache_loc = alloc_for_decode(self, 1)"),
        ("srt/mem_cache/common.py", 396, "alloc_for_decode", "out_cache_loc = alloc_token_slots(batch.tree_cache, bs)"),
        ("srt/mem_cache/common.py", 238, "alloc_token_slots", "raise RuntimeError(error_msg)")],
    "startup": [("srt/managers/scheduler.py", 2937, "run_scheduler_process", "scheduler = Scheduler("),
                ("srt/managers/scheduler.py", 318, "__init__", "self.init_model_worker()"),
                ("srt/managers/tp_worker.py", 247, "__init__", "self._model_runner = ModelRunner(")],
    "load_weights": [("srt/model_executor/model_runner.py", 402, "__init__", "self.initialize(min_per_gpu_memory)"),
                     ("srt/model_executor/model_runner.py", 498, "initialize", "self.load_model()")],
    "memory_pool": [("srt/model_executor/model_runner.py", 560, "initialize", "self.init_memory_pool("),
                    ("srt/model_executor/model_runner.py", 1830, "init_memory_pool",
                     "raise RuntimeError(")],
    "kv_alloc": [("srt/model_executor/model_runner.py", 560, "initialize", "self.init_memory_pool("),
                 ("srt/mem_cache/allocator.py", 135, "clear", "self.free_pages = torch.arange(")],
    "autotune": [("srt/model_executor/model_runner.py", 611, "initialize", "self.kernel_warmup()"),
                 ("srt/model_executor/model_runner.py", 1702, "kernel_warmup", "self._flashinfer_autotune()"),
                 ("srt/model_executor/model_runner.py", 1735, "_flashinfer_autotune", "self._dummy_run(")],
    "cuda_graph": [("srt/model_executor/model_runner.py", 615, "initialize", "self.init_device_graphs()"),
                   ("srt/model_executor/model_runner.py", 2021, "init_device_graphs",
                    "self.graph_runner = graph_runners[self.device](self)"),
                   ("srt/model_executor/cuda_graph_runner.py", 404, "__init__",
                    "raise Exception(")],
}


SIGQUIT_STARTUP = "Received sigquit from a child process. It usually means the child failed."
SIGQUIT_SERVING = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
RETRACT = "KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_token_ratio: {a:.4f} -> {b:.4f}"


def runtime_crash(signature: str, exception: str) -> tuple[list[str], str | None]:
    """What the scheduler logs before a runtime crash's traceback, and its traceback's frames (None: no
    traceback, the watchdog kills the server itself)."""
    if signature == "watchdog_timeout":
        return [exception, "Pyspy failed (py-spy is not installed)."], None
    if signature == "decode_oom":
        return [RETRACT.format(n=1, a=0.3, b=1.0)], "decode_oom"
    return [], signature if signature in FRAMES else "device_side_assert"


def ts() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class Log:
    """Writes `[YYYY-mm-dd HH:MM:SS{ TP0}] message` lines to stderr, flushed per line."""

    def __init__(self, tp_size: int = 1, stream=None):
        self.tag = " TP0" if tp_size > 1 else ""
        self.out = stream or sys.stderr

    def __call__(self, msg: str, rank: bool = False) -> None:
        self.out.write(f"[{ts()}{self.tag if rank else ''}] {msg}\n")
        self.out.flush()

    def death(self, crash_phase: str, pid: int) -> None:
        """The lines after a crash's traceback: the parent's sigquit line and the process-tree kill."""
        self(SIGQUIT_STARTUP if crash_phase == "startup" else SIGQUIT_SERVING)
        self(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")

    def raw(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def exception(self, frames_key: str, exception: str, extra: str | None = None) -> None:
        lines = ["Scheduler hit an exception: Traceback (most recent call last):"]
        keys = ["startup", extra] if frames_key == "startup" else [frames_key]
        for key in keys:
            for path, line, fn, code in FRAMES.get(key or "", []):
                lines += [f'  File "{SITE}/{path}", line {line}, in {fn}', f"    {code}"]
        self(lines[0], rank=True)
        self.raw("\n".join(lines[1:] + [exception, ""]))
