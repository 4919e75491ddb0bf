"""Kernel compiles during startup, played by the stand-in: a card whose MoE runner JIT-compiles spawns `ninja` and
`nvcc` children (own process group, the server's environment) at the start of graph capture, log silent. The real
readiness loop must wait for them instead of blaming the config, and give up only past `compile_s`."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.runners.test_lifecycle import run_pids, sim_profile, started  # noqa: F401 (fixture)
from tunectl.commands._levels import progress_text
from tunectl.runners.hosts.base import ProcInfo
from tunectl.runners.server import compiling, lifecycle
from tunectl.sim.card import CARDS_DIR

CUTLASS = {"moe-runner-backend": "flashinfer_cutlass"}


def compiling_profile(tmp_path: Path, jit_s: float, scale: float = 0.05, **timeouts: float):
    """The default stand-in whose flashinfer_cutlass runner compiles `jit_s` modeled seconds."""
    card = yaml.safe_load((CARDS_DIR / "glm5-nvfp4-8x-rtx-pro-6000.yaml").read_text())
    card["moe"]["runners"]["flashinfer_cutlass"]["jit_compile_s"] = jit_s
    path = tmp_path / "jit-card.yaml"
    path.write_text(yaml.safe_dump(card))
    return sim_profile(tmp_path, **{"server.sim.card": str(path), "server.sim.time_scale": scale,
                                    **{f"server.timeouts.{k}": v for k, v in timeouts.items()}})


def test_a_compile_past_the_phase_deadline_is_waited_for(tmp_path, started):  # noqa: F811
    # graph capture: ~0.7 s wall; its deadline 30 modeled = 2.5 s wall; the compile before it: 8 s wall
    prof = compiling_profile(tmp_path, jit_s=160.0, cuda_graph_s=30.0)
    srv = started(prof, CUTLASS)
    events: list[tuple[str, dict]] = []
    st = lifecycle.wait_ready(srv, lambda kind, data: events.append((kind, data)))
    assert st.ready, st.crash
    assert 1.0 < st.phases["compiling_s"] < 8.0 + 5.0
    seen = [d for k, d in events if k == "compiling"]
    assert len(seen) == 1 and seen[0]["phase"] == "cuda_graph"
    assert seen[0]["compilers"] == {"ninja": 1, "nvcc": 1}
    assert "compiling kernels (ninja x1, nvcc x1)" in progress_text("compiling", seen[0])


def test_a_compile_past_compile_s_is_the_hosts_timeout(tmp_path, started):  # noqa: F811
    # the compile runs 20 s wall; the graph deadline passes after 2.5 s, then compile_s (20 modeled: 2 s wall)
    prof = compiling_profile(tmp_path, jit_s=400.0, cuda_graph_s=30.0, compile_s=20.0)
    srv = started(prof, CUTLASS)
    st = lifecycle.wait_ready(srv)
    assert not st.ready
    c = st.crash
    assert (c.cls, c.signature, c.phase) == ("infra", "timeout_compile", "startup")
    assert "compile_s=20" in c.message and "nvcc x1" in c.message
    assert st.phases["compiling_s"] > 1.0
    assert "cuda_graph_begin" in st.phases and "cuda_graph_end" not in st.phases
    down = lifecycle.teardown(srv)                       # the compilers live in their own group: found by run id
    assert down["verdict"] == "clean", down
    assert run_pids(srv.plan.run_id) == []


def test_a_stall_without_compilers_still_times_out(tmp_path, started):  # noqa: F811
    # the same card, but a runner that does not compile: weights (3 s wall) outlast their deadline (1.1 s wall)
    prof = compiling_profile(tmp_path, jit_s=160.0, scale=0.1, load_weights_s=1.0)
    srv = started(prof, {"moe-runner-backend": "triton"})
    st = lifecycle.wait_ready(srv)
    assert not st.ready
    assert (st.crash.cls, st.crash.signature) == ("startup_timeout", "timeout_load_weights")
    assert "compiling_s" not in st.phases


def test_compilers_are_named_by_argv0():
    procs = [ProcInfo(1, 1, "ninja -v -C /cache/flashinfer/cached_ops/fused_moe_90"),
             ProcInfo(2, 2, "/bin/sh -c /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile"),
             ProcInfo(3, 2, "/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c moe.cu"),
             ProcInfo(4, 2, "/usr/local/cuda/nvvm/bin/cicc --orig_src_file_name moe.cu"),
             ProcInfo(5, 5, "python3 -m sglang.launch_server --model-path nvcc"),
             ProcInfo(6, 5, "")]
    found = compiling.compilers(procs)
    assert found == {"ninja": 1, "nvcc": 1, "cicc": 1}
    assert compiling.describe(found) == "cicc x1, ninja x1, nvcc x1"
