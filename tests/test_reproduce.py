"""The winner can be reproduced from what tunectl prints: `tunectl best --format command` of a config that needs a
patch names it; for the stand-in it prints the SGLang command for a GPU host and, as a `#` line, the stand-in's own
command with its environment: pasted into a shell, that one starts the config here."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.test_sweep_cli import env, sweep  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
PATCH = "0001-flashinfer-cutlass-autotune"


def _server_info(port: int, deadline_s: float = 120.0) -> dict:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_best_command_of_a_patched_config_starts_it_with_the_patch(env):  # noqa: F811
    res = sweep(env, "-c", "1", "--study", "patched", "--set", "flashinfer-cutlass-autotune=true")
    assert res.returncode == 0, res.stderr
    best = subprocess.run([sys.executable, "-m", "tunectl", "best", "--study", "patched", "--results",
                           str(env["results"])], capture_output=True, text=True, timeout=60, check=False)
    assert best.returncode == 0, best.stderr
    lines = best.stdout.strip().splitlines()
    assert lines[-1].startswith("python3 -m sglang.launch_server ") and "--sim-" not in lines[-1]  # for a GPU host
    command = next(ln for ln in lines if ln.startswith("# measured on the SGLang stand-in")).split(": ", 1)[1]
    assert f"TUNECTL_SIM_PATCHES={PATCH}" in command and "TUNECTL_RUN_ID" not in command
    proc = subprocess.Popen(["bash", "-c", command], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={k: v for k, v in os.environ.items()
                                                            if k != "TUNECTL_SIM_PATCHES"})
    try:
        info = _server_info(env["port"])
        assert info["sim_patches"] == [PATCH]                 # the pasted command runs the patched config
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_json_and_report_name_the_patch(env):  # noqa: F811
    res = sweep(env, "-c", "1", "--study", "patched", "--set", "flashinfer-cutlass-autotune=true")
    assert res.returncode == 0, res.stderr
    doc = json.loads(subprocess.run([sys.executable, "-m", "tunectl", "best", "-f", "json", "--results",
                                     str(env["results"])], capture_output=True, text=True, check=True).stdout)
    assert doc["patches"] == [PATCH] and doc["env"]["TUNECTL_SIM_PATCHES"] == PATCH
    out = env["results"] / "r.html"
    subprocess.run([sys.executable, "-m", "tunectl", "report", "--out", str(out), "--results",
                    str(env["results"])], capture_output=True, check=True)
    page = out.read_text()
    assert f"patches: {PATCH}" in page and f"TUNECTL_SIM_PATCHES={PATCH}" in page
