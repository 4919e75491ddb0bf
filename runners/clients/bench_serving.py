"""Adapter for the real `sglang.bench_serving` client run on the GPU host.

Public API:
- `bench_serving_argv(python, base_url, backend, model, tokenizer, workload, num_prompts, concurrency,
  output_file, seed, *, host=None, port=None, module="sglang.bench_serving") -> list[str]`: an argv list
  (never a shell string). random / long_prompt use `--dataset-name random-ids` (no dataset download, only a
  tokenizer); shared_prefix uses `generated-shared-prefix` with one prompt group; sharegpt `--dataset-name sharegpt
  --dataset-path` with the workload's file, copied into the trial directory on the server's host. `--request-rate inf` +
  `--max-concurrency` is a closed loop of `concurrency` streams, as in a tunectl level.
- `parse_result_jsonl(text) -> dict`: the `--output-file` line (Python's json reads its `Infinity`/`NaN`);
  the last non-empty line wins (the client appends one line per run).
- `parse_stdout(text) -> dict`: the "Serving Benchmark Result" block only, under SGLang's result-file key
  names. `#Input tokens:` / `#Output tokens:` are printed before the run (planned totals of the generated
  dataset), so they are never read.
- `interpret(exit_code, stdout, result_file_text, num_prompts=None) -> BenchServingOutcome`: "ok" with the
  metrics, "server_died" with evidence lines (the client exits 1 and writes no result file when the server
  dies mid-run), or "error".
- `CLIENT`: the adapter as a `Client` (base.py): runs the argv on the server's host through its runner, reads the
  result file there and reports metrics in modeled units like the built-in client.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tunectl import datasets
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.base import Abort, LevelMetrics, OpenLoad, Progress, Target
from tunectl.runners.hosts.base import LOOPBACK

__all__ = ["CLIENT", "BenchServingClient", "BenchServingOutcome", "bench_serving_argv", "interpret",
           "parse_result_jsonl",
           "parse_stdout"]


def _dataset_args(w: WorkloadSpec, num_prompts: int) -> list[str]:
    if w.kind == "sharegpt":           # the same file the built-in client reads (the profile checks it is single-turn)
        return ["--dataset-name", "sharegpt", "--dataset-path", str(w.path)]
    if w.kind == "shared_prefix":
        return ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "1",
                "--gsp-prompts-per-group", str(num_prompts), "--gsp-system-prompt-len", str(w.shared_prefix_len),
                "--gsp-question-len", str(w.input_len), "--gsp-output-len", str(w.output_len)]
    return ["--dataset-name", "random-ids", "--random-input-len", str(w.input_len),
            "--random-output-len", str(w.output_len), "--random-range-ratio", str(w.range_ratio)]


def bench_serving_argv(python: str, base_url: str | None, backend: str, model: str, tokenizer: str,
                       workload: WorkloadSpec, num_prompts: int, concurrency: int, output_file: str, seed: int, *,
                       host: str | None = None, port: int | None = None,
                       module: str = "sglang.bench_serving", request_rate: float | None = None) -> list[str]:
    """`request_rate` None: a closed loop of `concurrency` streams (`--request-rate inf`); else Poisson arrivals
    at that rate (wall req/s), capped at `concurrency` in flight when it is > 0."""
    if base_url:
        target = ["--base-url", base_url]
    elif host and port:
        target = ["--host", host, "--port", str(port)]
    else:
        raise ValueError("bench_serving_argv needs base_url or host and port")
    return [python, "-m", module, "--backend", backend, *target, "--model", model, "--tokenizer", tokenizer,
            *_dataset_args(workload, num_prompts), "--num-prompts", str(num_prompts),
            *(["--max-concurrency", str(concurrency)] if concurrency > 0 else []),
            "--request-rate", "inf" if request_rate is None else repr(float(request_rate)),
            "--warmup-requests", str(workload.warmup_requests), "--output-file", output_file,
            "--seed", str(seed), "--disable-tqdm"]


def parse_result_jsonl(text: str) -> dict[str, Any]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    data = json.loads(lines[-1])     # json accepts Infinity / NaN, as the client writes them
    return data if isinstance(data, dict) else {}


# summary label -> result-file key (sglang.bench_serving prints these in the result block)
_LABELS = {
    "Backend": "backend", "Traffic request rate": "request_rate", "Max request concurrency": "max_concurrency",
    "Successful requests": "completed", "Benchmark duration (s)": "duration",
    "Total input tokens": "total_input_tokens", "Total input text tokens": "total_input_text_tokens",
    "Total input vision tokens": "total_input_vision_tokens", "Total generated tokens": "total_output_tokens",
    "Total generated tokens (retokenized)": "total_output_tokens_retokenized",
    "Request throughput (req/s)": "request_throughput", "Input token throughput (tok/s)": "input_throughput",
    "Output token throughput (tok/s)": "output_throughput",
    "Peak output token throughput (tok/s)": "max_output_tokens_per_s",
    "Peak concurrent requests": "max_concurrent_requests", "Total token throughput (tok/s)": "total_throughput",
    "Concurrency": "concurrency", "Accept length": "accept_length",
}
_LAT = re.compile(r"^(Mean|Median|P\d+|Max) (E2E Latency|TTFT|TPOT|ITL) \(ms\)$")
_LAT_NAMES = {"E2E Latency": "e2e_latency", "TTFT": "ttft", "TPOT": "tpot", "ITL": "itl"}
_BLOCK = re.compile(r"=+ Serving Benchmark Result =+\n(.*?)\n=+\s*$", re.DOTALL | re.MULTILINE)


def _value(raw: str) -> Any:
    raw = raw.strip()
    try:
        num = float(raw)
    except ValueError:
        return raw
    return int(num) if num.is_integer() and "." not in raw and not math.isinf(num) else num


def _key(label: str) -> str | None:
    m = _LAT.match(label)
    if m:
        return f"{m.group(1).lower()}_{_LAT_NAMES[m.group(2)]}_ms"
    return _LABELS.get(label)


def parse_stdout(text: str) -> dict[str, Any]:
    m = _BLOCK.search(text)
    if not m:
        return {}
    out: dict[str, Any] = {}
    for line in m.group(1).splitlines():
        label, sep, raw = line.partition(":")
        key = _key(label.strip()) if sep else None
        if key:
            out[key] = _value(raw)
    return out


@dataclass
class BenchServingOutcome:
    status: str                                   # "ok" | "server_died" | "error"
    metrics: dict[str, Any] = field(default_factory=dict)
    completed: int = 0
    failed: int | None = None                     # known when num_prompts is given
    evidence: list[str] = field(default_factory=list)
    message: str = ""


_DIED = re.compile(r"Connection refused|Connect call failed|ClientConnectorError|ServerDisconnectedError"
                   r"|ClientPayloadError|Response payload is not completed|Server disconnected"
                   r"|ConnectionResetError|RemoteDisconnected")
_EXC = re.compile(r"^[\w.]+(?:Error|Exception|Exit)\b: ")


_NO_SGLANG = re.compile(r"No module named '?sglang\b")
_EMBEDDED_EXC = re.compile(r"\\n([\w.]+(?:Error|Exception)\b: [^\\']{0,200})")


def _evidence(stdout: str) -> list[str]:
    """The exception of the first few failed requests, then the client's own final exception lines."""
    errors = [(_EMBEDDED_EXC.findall(ln) or [ln.strip()[:200]])[-1] for ln in stdout.splitlines()
              if ln.lstrip().startswith("output.error=")]
    excs = [ln.strip()[:240] for ln in stdout.splitlines() if _EXC.match(ln.strip())]
    return errors[:3] + excs[-3:]


def interpret(exit_code: int, stdout: str, result_file_text: str | None,
              num_prompts: int | None = None) -> BenchServingOutcome:
    metrics = parse_result_jsonl(result_file_text) if result_file_text else {}
    if exit_code == 0 and not metrics:
        metrics = parse_stdout(stdout)
    if exit_code != 0 or not metrics:
        if not metrics and _NO_SGLANG.search(stdout):
            return BenchServingOutcome("error", {}, 0, num_prompts, _evidence(stdout),
                                       f"bench_serving exit {exit_code}: the server's Python has no SGLang client "
                                       "(sglang.bench_serving: install SGLang into server.python, or use "
                                       "--client builtin)")
        died = bool(_DIED.search(stdout))
        status = "server_died" if died else "error"
        msg = (f"bench_serving exit {exit_code}: the server went away mid-run" if died
               else f"bench_serving exit {exit_code}" + ("" if metrics else ", no result"))
        return BenchServingOutcome(status, {}, 0, num_prompts, _evidence(stdout), msg)
    completed = int(metrics.get("completed", 0))
    failed = None if num_prompts is None else num_prompts - completed
    if failed:
        return BenchServingOutcome("error", metrics, completed, failed, _evidence(stdout),
                                   f"{failed} of {num_prompts} requests failed")
    return BenchServingOutcome("ok", metrics, completed, failed, [], "ok")


class BenchServingClient:
    """The real `sglang.bench_serving`, run on the server's host against its loopback port, one command a level.
    It reports no progress while it runs (the ladder watches the server's batches) and cannot be aborted."""
    name = "bench_serving"
    streams_progress = False

    def run_level(self, target: Target, workload: WorkloadSpec, concurrency: int, num_prompts: int, *,
                  progress: Progress | None = None, abort: Abort = None, rate: float | None = None) -> LevelMetrics:
        name = f"c{concurrency}" if rate is None else f"r{rate:.4g}"
        out_file = f"{target.out_dir}/bench-{workload.label}-{name}.jsonl"
        wall_rate = None if rate is None else rate / target.time_scale     # its clock is the wall's
        if workload.kind == "sharegpt" and workload.path:
            num_prompts = min(num_prompts, len(datasets.read("sharegpt", workload.path)))   # it never repeats one
            there = f"{target.out_dir}/dataset-{workload.label}.json"
            target.runner.put(workload.path, there)
            workload = workload.model_copy(update={"path": there})
        argv = bench_serving_argv(target.python, target.host_url, target.backend, target.model,
                                  workload.tokenizer or target.tokenizer, workload, num_prompts, concurrency,
                                  out_file, workload.seed, request_rate=wall_rate)
        t0 = time.monotonic()
        env = {"HF_HUB_OFFLINE": "1", "no_proxy": LOOPBACK, "NO_PROXY": LOOPBACK}   # never the hub, never a proxy
        res = target.runner.run(argv, timeout=target.level_timeout_s, env=env)
        result_text = target.runner.read_file(out_file).decode(errors="replace") or None
        got = interpret(res.exit_code, res.stdout + res.stderr, result_text, num_prompts)
        metrics = _modeled({k: float(v) for k, v in got.metrics.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)}, target.time_scale)
        if rate is not None and metrics:
            metrics["request_rate"] = rate
        return LevelMetrics(concurrency, num_prompts, workload.label, metrics=metrics, completed=got.completed,
                            failed=num_prompts - got.completed, errors=_errors(got, res.stdout + res.stderr),
                            wall_s=time.monotonic() - t0, server_gone=got.status == "server_died")

    def run_open(self, target: Target, workload: WorkloadSpec, load: OpenLoad, *,
                 progress: Progress | None = None, abort: Abort = None) -> LevelMetrics:
        """`--request-rate R` (Poisson: 0.5.9 has no --burstiness) and `--max-concurrency` when capped. A trace
        workload or burstiness other than 1 is the built-in client's: a failed level saying so."""
        why = ("replays a trace file only as its own mooncake dataset" if load.rate is None
               else "0.5.9 has no --burstiness (Poisson arrivals only)" if load.burstiness != 1.0 else "")
        if why:
            return LevelMetrics(load.max_concurrency or 0, load.num_prompts, workload.label, failed=load.num_prompts,
                                errors=[f"sglang.bench_serving {why}: use the builtin client for this level"])
        return self.run_level(target, workload, load.max_concurrency or 0, load.num_prompts, progress=progress,
                              abort=abort, rate=load.rate)


def _errors(got: BenchServingOutcome, output: str) -> list[str]:
    """A failed level's text: what went wrong, its evidence, else the client's last output lines."""
    if got.status == "ok":
        return []
    tail = [ln.strip()[:240] for ln in output.splitlines() if ln.strip()][-3:]
    return [got.message, *(got.evidence[:4] or tail)]


def _modeled(metrics: dict[str, float], scale: float) -> dict[str, float]:
    """The real client measures wall time; against the stand-in, report modeled units like the built-in client."""
    if scale == 1.0:
        return metrics
    out = {}
    for k, v in metrics.items():
        if k.endswith("_ms") or k == "duration":
            v = v / scale
        elif "throughput" in k or k.endswith("_per_s"):
            v = v * scale
        out[k] = v
    return out


CLIENT = BenchServingClient()
