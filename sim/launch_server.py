"""`python -m tunectl.sim.launch_server <SGLang 0.5.9 flags> [--sim-card ..] [--sim-time-scale ..] [--sim-seed ..]`

Behaves like `python -m sglang.launch_server` where tunectl can see it: argv, log lines, HTTP API, throughput,
crashes (traceback, sigquit line, kill_process_tree, death by SIGKILL = exit 137) and SIGTERM teardown.
Patches in effect come from env TUNECTL_SIM_PATCHES (comma-separated bundled patch ids).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from aiohttp import web
from tunectl.errors import ProfileError
from tunectl.sim import args as sim_args
from tunectl.sim import gpus as sim_gpus
from tunectl.sim.card import load_card
from tunectl.sim.engine import Engine
from tunectl.sim.http import Api
from tunectl.sim.logs import SITE, Log, runtime_crash
from tunectl.sim.phases import run_startup
from tunectl.sim.sched import Req, RuntimeCrash
from tunectl.sim.setup import resolve
from tunectl.sim.spec import refusal_text, spec_accept

CHILD = ("import ctypes, os, signal, sys\n"
         "libc = ctypes.CDLL(None)\n"
         "libc.prctl(1, signal.SIGKILL)\n"          # PR_SET_PDEATHSIG, like SGLang's schedulers
         "libc.prctl(15, b'sglang::schedul', 0, 0, 0)\n"
         "if os.getppid() != int(sys.argv[1]): os._exit(0)\n"
         "signal.pause()\n")


ENTRYPOINT_FILE = "sglang/launch_server.py"
ENTRYPOINT_WARNING = ("'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended "
                      "entrypoint.")


class State:
    def __init__(self, ns: Any, argv: list[str]):
        self.ns, self.argv = ns, argv
        self.log = Log(vars(ns).get("tensor_parallel_size") or vars(ns).get("tp_size") or 1)   # 0.5.17: tp_size
        self.card = load_card(ns.sim_card)
        self.patches = [p for p in os.environ.get("TUNECTL_SIM_PATCHES", "").split(",") if p]
        self.setup = resolve(self.card, sim_args.model_config(ns), dict(os.environ), self.patches,
                             ns.sim_sglang_version)
        if self.setup.spec is not None:           # the draft's acceptance on the workload served (sim/spec.py)
            self.setup.spec.use_workload(ns.sim_workload)
        self.engine: Engine | None = None
        self.ready = self.shutting_down = False
        self.started = time.time()
        self.served_name = ns.served_model_name or ns.model_path or self.card.model
        self.children: list[subprocess.Popen[bytes]] = []
        self._tok = _tokenizer(ns.tokenizer_path or ns.model_path)

    def tokenize(self, text: str) -> list[int]:
        if self._tok is not None:
            return self._tok.encode(text, add_special_tokens=False).ids
        return [hash(w) & 0xFFFF for w in text.split()] or [0]

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.ns.model_path, "tokenizer_path": self.ns.tokenizer_path or self.ns.model_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": self.card.model_type, "architectures": [self.card.architecture]}

    def server_info(self) -> dict[str, Any]:
        info = {k: v for k, v in vars(self.ns).items() if not k.startswith("sim_")}
        eng = self.engine
        info.update({
            "version": self.ns.sim_sglang_version, "launch_command": " ".join(self.argv), "launch_args": self.argv,
            "sim_time_scale": self.ns.sim_time_scale, "sim_card": self.card.name, "sim_gpu": self.card.gpu.name,
            "sim_seed": self.ns.sim_seed,
            "sim_patches": self.patches, "max_total_num_tokens": self.setup.kv_tokens,
            "internal_states": [{"last_gen_throughput": eng.last_gen_throughput if eng else 0.0,
                                 "avg_spec_accept_length": spec_accept(self.setup),
                                 "#running-req": len(eng.sched.running) if eng else 0,
                                 "#queue-req": len(eng.sched.waiting) if eng else 0}]})
        return info

    # ------------------------------------------------------------------------------------ dying
    def die(self, crash_phase: str, exception: str, frames: str | None, extra: str | None = None) -> None:
        if frames is not None:
            self.log.exception(frames, exception, extra)
        if os.environ.get("SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION", "") in ("1", "true", "True"):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        self.log.death(crash_phase, os.getpid())
        self.kill_tree(logged=True)

    def kill_tree(self, logged: bool = False) -> None:
        pid = os.getpid()
        if not logged:
            self.log(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
        for ch in self.children:
            if ch.poll() is None:
                ch.kill()
        sys.stderr.flush()
        os.kill(pid, signal.SIGKILL)

    def check_vocab(self, ids: list[int]) -> None:
        """A token id outside the vocabulary trips the embedding's index assert on the GPU and takes the server
        down (seen on real SGLang 0.5.17: `device-side assert triggered`, exit 137)."""
        vocab = self.card.vocab_size
        if any(not 0 <= int(i) < vocab for i in ids):
            self.log.raw("../aten/src/ATen/native/cuda/Indexing.cu:1369: indexSelectSmallIndex: block: [0,0,0], "
                         "thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.")
            self.die("runtime", DEVICE_ASSERT, "device_side_assert")

    def on_runtime_crash(self, crash: RuntimeCrash) -> None:
        before, frames = runtime_crash(crash.signature, crash.exception)
        for line in before:
            self.log(line, rank=True)
        self.die("runtime", crash.exception, frames)


DEVICE_ASSERT = ("torch.AcceleratorError: CUDA error: device-side assert triggered\n"
                 "Search for `cudaErrorAssert' in "
                 "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
                 " for more information.")


def _tokenizer(path: str | None) -> Any:
    try:
        from tokenizers import Tokenizer
        return Tokenizer.from_file(os.path.join(path or "", "tokenizer.json"))
    except Exception:  # no tokenizer: approximate by whitespace words
        return None


def _spawn_child(st: State) -> None:
    st.children.append(subprocess.Popen([sys.executable, "-c", CHILD, str(os.getpid())]))


async def serve(st: State) -> None:
    ns, scale = st.ns, ns_scale(st.ns)
    _spawn_child(st)
    refused = sim_gpus.claim(dict(os.environ), _gpus_needed(ns))
    if refused is not None:
        st.log("Init torch distributed begin.")
        st.die("startup", refused, "startup")
    await run_startup(st, scale)
    st.engine = Engine(st.setup, scale, ns.sim_seed, st.log, st.on_runtime_crash, ns.sim_noise, launch_key(ns),
                       machine_key(ns))
    loop_task = asyncio.create_task(st.engine.run())
    runner = web.AppRunner(Api(st).app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, ns.host, ns.port, reuse_address=True).start()
    for line in (f"INFO:     Started server process [{os.getpid()}]", "INFO:     Waiting for application startup.",
                 "INFO:     Application startup complete.",
                 f"INFO:     Uvicorn running on http://{ns.host}:{ns.port} (Press CTRL+C to quit)"):
        st.log(line)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(_sigterm(st)))
    if not ns.skip_server_warmup:
        q = st.engine.submit(Req(0, 16, 8))
        while not (await q.get()).finished:
            pass
        st.log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    st.ready = True
    st.log("The server is fired up and ready to roll!")
    await loop_task
    await asyncio.Event().wait()


def _gpus_needed(ns: Any) -> int:
    """GPUs one server spans: tensor x pipeline parallel (data parallel replicas too, without DP attention)."""
    v = vars(ns)
    tp = v.get("tensor_parallel_size") or v.get("tp_size") or 1
    pp = v.get("pipeline_parallel_size") or v.get("pp_size") or 1
    dp = v.get("data_parallel_size") or v.get("dp_size") or 1
    return int(tp) * int(pp) * (1 if v.get("enable_dp_attention") else int(dp))


def launch_key(ns: Any) -> str:
    """What seeds this launch's noise (sim/noise.py): the seed and tunectl's trial (its run id without the random
    tail: a trial's reruns are other trials, so they draw anew; the same study run again draws the same), else the
    seed alone (a server started by hand)."""
    run = os.environ.get("TUNECTL_RUN_ID", "")
    return f"{ns.sim_seed}:{run.rsplit('-', 1)[0]}" if run else str(ns.sim_seed)


def machine_key(ns: Any) -> tuple[int, int]:
    """The machine state this launch runs in (sim/noise.py `machine_state`): the seed, and tunectl's trial number
    (the `-t<n>-` of its run id) as the launch's place in the campaign; 0 for a server started by hand."""
    m = re.search(r"-t(\d+)-[0-9a-f]+$", os.environ.get("TUNECTL_RUN_ID", ""))
    return ns.sim_seed, int(m[1]) if m else 0


def ns_scale(ns: Any) -> float:
    return max(1e-6, float(ns.sim_time_scale))


async def _sigterm(st: State) -> None:
    st.log("SIGTERM received. signum=15 frame=None. Draining requests and shutting down...")
    st.shutting_down = True
    deadline = time.monotonic() + 2.0
    while st.engine is not None and st.engine.inflight() and time.monotonic() < deadline:
        st.log(f"Gracefully exiting... Remaining number of requests {st.engine.inflight()}.")
        await asyncio.sleep(0.5)
    st.kill_tree()


def _set_ulimit(target: int = 65535) -> None:
    """As SGLang's server does at start (srt/utils set_ulimit): the soft limit of open files raised towards 65,535
    within the hard limit, so a level of thousands of streams is not refused at a stock limit of 1,024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _set_ulimit()
    try:
        ns = sim_args.parse(argv)
    except ValueError as e:                      # SGLang raises from its --config merger (exit 1)
        print(f"ValueError: {e}", file=sys.stderr)
        sys.exit(1)
    if ns.sim_sglang_version != "0.5.9":     # real 0.5.17 on stderr before its first log line
        print(f"{ENTRYPOINT_FILE}:56: UserWarning: {ENTRYPOINT_WARNING}\n  Example: sglang serve --model-path "
              "<model> [options]\n  warnings.warn(", file=sys.stderr, flush=True)
    try:
        st = State(ns, argv)
    except ProfileError as e:                  # --sim-card is the stand-in's own flag: one line, as argparse's
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if st.setup.refused is not None:           # SGLang's ServerArgs refuses the speculative flags (sim/spec.py)
        print(refusal_text(st.setup.refused, SITE), file=sys.stderr, flush=True)
        sys.exit(1)
    signal.signal(signal.SIGTERM, lambda *_: (st.log("SIGTERM received. signum=15 frame=None. Draining requests "
                                                     "and shutting down..."), st.kill_tree()))
    asyncio.run(serve(st))


if __name__ == "__main__":
    main()
