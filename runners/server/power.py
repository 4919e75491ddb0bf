"""GPU power sampled on the host while a level runs: per GPU, the board's `power.draw` and utilization.

Two readers, one sample format {gpu index: (watts or None, utilization % or None)}:
- NVML through `nvidia-ml-py` (`import pynvml`), when the server runs on this machine (the local runner), real
  SGLang, and the module imports: no process per sample.
- else `nvidia-smi --query-gpu=index,power.draw,utilization.gpu --format=csv,noheader,nounits [-i 0,1]` run on the
  host through the runner, like the other nvidia-smi readings (runners/checks/hostcheck.py): the first after
  `FIRST_S`, then at doubling intervals up to `INTERVAL_S`.
  The stand-in answers the same query with its own program (`python -m tunectl.sim.smi`, sim/power.py): the
  sampler, the runner call and the parser are the ones a real host gets.

`Sampler.start()` before the level's requests, `.stop()` after them: the mean watts per GPU over the samples of the
level's work (samples with no kernel running on any GPU are left out; then the first and last `TRIM` of them, the
ramp-up and the drain, once there are enough), the GPUs read, the sample count and the reader. A reader that fails
(no driver, `[N/A]`, a host without nvidia-smi) gives no power figure, never an error: energy is a result where the
host offers it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunectl.energy import energy_metrics
from tunectl.engines import engine
from tunectl.models import LevelResult

if TYPE_CHECKING:
    from tunectl.runners.server.lifecycle import Server

INTERVAL_S = 0.5
FIRST_S = 0.05          # the first sample: short levels (the stand-in's scaled clock) get some too
TRIM = 0.1
QUERY = ["--query-gpu=index,power.draw,utilization.gpu", "--format=csv,noheader,nounits"]
Reading = dict[int, tuple[float | None, float | None]]


def _num(text: str) -> float | None:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None                             # "[N/A]", "[Not Supported]", "[Unknown Error]"


def parse_power(text: str) -> Reading:
    """nvidia-smi's `index, power.draw, utilization.gpu` rows (units tolerated: "412.31 W", "87 %")."""
    out: Reading = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        out[int(cells[0])] = (_num(cells[1]), _num(cells[2]))
    return out


def smi_reader(runner: Any, smi: list[str], gpus: list[int] | None) -> Callable[[], Reading]:
    argv = [*smi, *QUERY, *(["-i", ",".join(map(str, gpus))] if gpus else [])]

    def read() -> Reading:
        res = runner.run(argv, timeout=10)
        return parse_power(res.stdout) if res.ok else {}
    return read


def nvml_reader(gpus: list[int] | None) -> Callable[[], Reading] | None:
    """NVML on this machine, or None when `nvidia-ml-py` is not installed or finds no driver."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        ids = gpus if gpus is not None else list(range(pynvml.nvmlDeviceGetCount()))
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in ids}
    except Exception:  # noqa: BLE001 - no module, no driver, no such GPU: the nvidia-smi reader then
        return None

    def read() -> Reading:
        out: Reading = {}
        for i, h in handles.items():
            try:
                util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                out[i] = (pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0, util)     # milliwatts
            except Exception:  # noqa: BLE001 - a GPU that does not report power
                out[i] = (None, None)
        return out
    return read


def _working(s: Reading) -> bool:
    return any(u is not None and u > 0 for _, u in s.values())


def summarize(samples: list[Reading]) -> dict[str, Any]:
    """Mean watts per GPU over the middle of the samples; {} when no GPU reported power. Samples where no GPU ran a
    kernel (utilization 0 on every one: before the first request landed, after the drain) are not the level's
    work and are left out, unless no sample has any."""
    samples = [s for s in samples if _working(s)] or samples
    k = int(len(samples) * TRIM) if len(samples) >= 5 else 0
    mid = samples[k:len(samples) - k] if k else samples
    per_gpu: dict[int, list[float]] = {}
    util: list[float] = []
    for s in mid:
        for i, (w, u) in s.items():
            if w is not None:
                per_gpu.setdefault(i, []).append(w)
            if u is not None:
                util.append(u)
    if not per_gpu:
        return {}
    means = [sum(v) / len(v) for v in per_gpu.values()]
    return {"watts": sum(means) / len(means), "gpus": len(per_gpu), "samples": len(mid),
            "utilization": sum(util) / len(util) if util else None}


@dataclass
class Sampler:
    read: Callable[[], Reading]
    source: str                                  # "nvml" | "nvidia-smi" | "stand-in"
    interval_s: float = INTERVAL_S
    samples: list[Reading] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _th: threading.Thread | None = None

    def start(self) -> Sampler:
        self._th = threading.Thread(target=self._loop, daemon=True, name="power-sampler")
        self._th.start()
        return self

    def _loop(self) -> None:
        t, wait = time.monotonic(), min(FIRST_S, self.interval_s)
        while not self._stop.wait(max(0.0, wait - (time.monotonic() - t))):   # the first once requests flow,
            t, wait = time.monotonic(), min(self.interval_s, wait * 2)         # then backing off to interval_s
            try:
                got = self.read()
            except Exception:  # noqa: BLE001 - a lost link or a dead reader: no sample, the level goes on
                got = {}
            if got:
                self.samples.append(got)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._th is not None:
            self._th.join(timeout=15)
        if not self.samples:                     # a level shorter than one sample: read once now
            try:
                got = self.read()
            except Exception:  # noqa: BLE001
                got = {}
            self.samples += [got] if got else []
        out = summarize(self.samples)
        return {**out, "source": self.source} if out else {}


# ------------------------------------------------------------------------------------ the server's sampler

def power_sampler(server: Server) -> Sampler:
    """NVML when the server is on this machine and `nvidia-ml-py` imports; else the engine's nvidia-smi on the host.
    Never through a Slurm runner (a command there is a job on some node, not a reading of the server's): a Slurm
    trial's ladder runs inside its job with the node as a local host (tunectl/wiring/slurm_agent.py) and samples there."""
    eng, gpus = engine(server.prof), server_gpus(server)
    if server.runner.name.startswith("slurm:"):
        return Sampler(lambda: {}, "none")
    nvml = nvml_reader(gpus) if eng.uses_gpus and server.runner.name == "local" else None
    if nvml is not None:
        return Sampler(nvml, "nvml")
    smi = eng.smi(server.plan.exec_argv[0] if server.plan.exec_argv else "python3",
                  server.plan.url)
    return Sampler(smi_reader(server.runner, smi, gpus), "nvidia-smi" if eng.uses_gpus else "stand-in")


def server_gpus(server: Server) -> list[int] | None:
    """The GPUs the server was given (its CUDA_VISIBLE_DEVICES, else the profile's host.gpus); None: all."""
    raw = server.plan.env.get("CUDA_VISIBLE_DEVICES")
    return [int(x) for x in raw.split(",") if x.strip().isdigit()] if raw else server.prof.host.gpus


def add_energy(server: Server, lv: LevelResult, power: dict[str, Any]) -> None:
    """Per GPU, per joule and per dollar (tunectl/energy.py) for a level that passed."""
    if lv.status != "ok":
        return
    cost, cfg = server.prof.cost, server.plan.config
    parallel = [int(cfg.get(k) or 1) for k in ("tp-size", "pp-size", "dp-size")]   # the server's own GPUs
    gpus = int(power.get("gpus") or len(server_gpus(server) or []) or parallel[0] * parallel[1] * parallel[2])
    lv.metrics.update(energy_metrics(lv.output_throughput, gpus, power.get("watts"),
                                     cost.gpu_hour_usd if cost else None))
    if power:
        lv.witness["power"] = {k: round(v, 2) if isinstance(v, float) else v for k, v in power.items()}
