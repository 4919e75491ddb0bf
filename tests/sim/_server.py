"""Start the stand-in as a real subprocess on a free loopback port (helpers shared by the sim tests)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.ports import free_port
from tunectl.sim import TOKENIZER

BASELINE = ["--model-path", str(TOKENIZER), "--tp-size", "8", "--quantization", "modelopt_fp4",
            "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "nsa", "--nsa-prefill-backend", "tilelang",
            "--nsa-decode-backend", "trtllm", "--moe-runner-backend", "flashinfer_cutlass",
            "--cuda-graph-max-bs", "32", "--max-running-requests", "64", "--mem-fraction-static", "0.88"]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                body = r.read()
                return r.status, json.loads(body) if body.startswith(b"{") else body.decode()
        except urllib.error.HTTPError as e:
            return e.code, None

    def post(self, path: str, body: dict[str, Any]) -> bytes:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def wait_exit(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start(tmp: Path, *args: str, env: dict[str, str] | None = None, scale: float = 0.002,
          wait_ready: bool = True, base: list[str] | None = None) -> Server:
    port = free_port()
    log = tmp / f"server-{port}.log"
    argv = [sys.executable, "-m", "tunectl.sim.launch_server", *(BASELINE if base is None else base), *args,
            "--port", str(port), "--sim-time-scale", str(scale)]
    full_env = {**os.environ, **(env or {})}
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    srv = Server(proc, port, log)
    if wait_ready:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if "fired up and ready" in srv.text():
                break
            time.sleep(0.02)
    return srv
