"""One crash classification for the live and the virtual path: for every crash the stand-in can produce under the
virtual client, the live stand-in's log and the virtual run's transcript classify to the same signature, class,
exception line and catalog repairs (tunectl.sglang.crashes.classifier.classify on both)."""
from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import pytest
from tunectl.sglang.crashes.classifier import classify, repairs_for
from tunectl.sim.model import virtual_ladder

from tests.sim._server import BASELINE, Server
from tunectl.wiring.virtual import KILLED, read_log

AUTOTUNE = "0001-flashinfer-cutlass-autotune"


def _argv_config(argv: list[str]) -> dict[str, Any]:
    """The stand-in's baseline command line as the virtual model's config (flag -> value)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        key = argv[i].lstrip("-")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[key], i = argv[i + 1], i + 2
        else:
            out[key], i = True, i + 1
    out.pop("model-path", None)
    return out


def _post(srv: Server, ids: list[int], new: int) -> subprocess.Popen[bytes]:
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": new}})
    return subprocess.Popen(["curl", "-s", "-m", "20", "-d", body, srv.url + "/generate"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _ids(n: int, seed: int = 0) -> list[int]:
    return [1000 + (seed * 7919 + i * 104729) % 29000 for i in range(n)]


# name: (extra argv, patches, load: (requests, prompt tokens, new tokens) or None for a startup crash)
CASES: dict[str, tuple[list[str], list[str], tuple[int, int, int] | None]] = {
    "cuda_oom_startup": (["--mem-fraction-static", "0.97"], [], None),
    "not_enough_memory": (["--mem-fraction-static", "0.5"], [], None),
    "autotune_oom": (["--mem-fraction-static", "0.95", "--disable-cuda-graph"], [AUTOTUNE], None),
    "cuda_graph_capture_failed": (["--cuda-graph-max-bs", "512"], [AUTOTUNE], None),
    "unsupported_backend": (["--moe-runner-backend", "flashinfer_trtllm"], [], None),
    "page_table_1_flattened": ([], [], (1, 8192 + 64, 4)),
    "decode_oom": (["--mem-fraction-static", "0.5417", "--kv-cache-dtype", "bf16"], [], (1, 256, 64)),
    "watchdog_timeout": (["--enable-two-batch-overlap", "--watchdog-timeout", "100"], [], (2, 32, 4000)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_live_and_virtual_crashes_classify_alike(name: str, launch) -> None:
    extra, patches, load = CASES[name]
    env = {"TUNECTL_SIM_PATCHES": ",".join(patches)} if patches else None
    srv: Server = launch(*extra, "--skip-server-warmup", env=env, wait_ready=load is not None)
    procs = [_post(srv, _ids(load[1], i), load[2]) for i in range(load[0])] if load else []
    assert srv.wait_exit(30) == -signal.SIGKILL
    for p in procs:
        p.wait(30)
    phase = "startup" if load is None else "load"
    live = classify(srv.text(), phase, 1 if load else None, KILLED)

    config = {**_argv_config(BASELINE), **_argv_config(extra)}
    lad = virtual_ladder("glm5-nvfp4-8x-rtx-pro-6000", config, patches=patches, levels=[load[0] if load else 1],
                         input_len=load[1] if load else 256, output_len=load[2] if load else 128, min_prompts=1)
    assert lad.crashed, name
    virtual = read_log(lad).crash_info(phase, 1 if load else None, KILLED)
    assert live is not None and virtual is not None
    assert (virtual.signature, virtual.cls, virtual.exception_line) == (live.signature, live.cls, live.exception_line)
    assert repairs_for(virtual.signature, virtual.exception_line) == repairs_for(live.signature, live.exception_line)


def test_repairs_reach_the_virtual_path() -> None:
    """The crashes the catalog can repair arrive with their catalog id (not the stand-in's own name)."""
    config = {**_argv_config(BASELINE), "cuda-graph-max-bs": 512}
    lad = virtual_ladder("glm5-nvfp4-8x-rtx-pro-6000", config, patches=[AUTOTUNE], levels=[1])
    info = read_log(lad).crash_info("startup", None, KILLED)
    assert info.signature == "capture_cuda_graph_failed" and ("mem-fraction-static", "<lower>") in repairs_for(
        info.signature)
