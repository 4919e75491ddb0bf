"""What differs between the engines a profile can name (`server.engine`): real SGLang and the shipped stand-in.

`engine(prof)` gives the profile's `Engine`; code asks it questions instead of comparing the engine's name:
which module to launch, whether GPUs matter, whether patches are applied to the host's SGLang source or travel as
an environment variable, the clock (the stand-in runs modeled time scaled down), how long a health probe may take.
"""
from __future__ import annotations

from typing import ClassVar

from tunectl.profile import Profile


class Engine:
    """Real SGLang on a GPU host."""
    name: ClassVar[str] = "sglang"
    module: ClassVar[str] = "sglang.launch_server"
    package: ClassVar[str] = "SGLang"          # what the server's Python must have installed
    uses_gpus: ClassVar[bool] = True           # GPU memory and GPU holders decide whether a host is clean
    patches_on_host: ClassVar[bool] = True     # the patches are applied to the host's SGLang source
    has_model: ClassVar[bool] = False          # a virtual-clock model exists (a search can run without processes)
    probe_timeout_s: ClassVar[float] = 25.0    # one health probe (a real server can be slow to answer under load)

    def time_scale(self, prof: Profile) -> float:
        """Wall seconds per modeled second."""
        return 1.0

    def slack_s(self, slack_s: float) -> float:
        """Extra wall seconds on a deadline (a scaled clock leaves no room for process start-up otherwise)."""
        return 0.0

    def launch_args(self, prof: Profile) -> list[str]:
        """Arguments after SGLang's own, for the launch command line."""
        return []

    def version_args(self, prof: Profile) -> list[str]:
        """Arguments that make the engine play the profile's SGLang version (its flags, its --help)."""
        return []

    def patch_env(self, patches: list[str]) -> dict[str, str]:
        """Environment that carries the patches to the server (none: they are applied on the host)."""
        return {}

    def gpu_env(self, prof: Profile) -> dict[str, str]:
        """Environment beside CUDA_VISIBLE_DEVICES (the stand-in: where its box's GPU claims live)."""
        return {}

    def smi(self, python: str, host_url: str) -> list[str]:
        """The program that answers nvidia-smi's GPU queries on the host (the power sampler's)."""
        return ["nvidia-smi"]

    def tokenizer(self, prof: Profile) -> str:
        """The tokenizer a client that needs one (sglang.bench_serving) loads: the profile's, else the model's."""
        return prof.model.tokenizer or prof.model.path


class Sim(Engine):
    """The shipped stand-in (tunectl.sim): no GPU, patches by environment, modeled time scaled down."""
    name = "sim"
    module = "tunectl.sim.launch_server"
    package = "tunectl"
    uses_gpus = False
    patches_on_host = False
    has_model = True
    probe_timeout_s = 5.0

    def time_scale(self, prof: Profile) -> float:
        return prof.server.sim.time_scale

    def slack_s(self, slack_s: float) -> float:
        return slack_s

    def launch_args(self, prof: Profile) -> list[str]:
        sim = prof.server.sim
        noise = [] if sim.noise == 1.0 else ["--sim-noise", f"{sim.noise:g}"]
        kind = prof.bench.workloads[0].kind if prof.bench.workloads else "random"
        workload = [] if kind == "random" else ["--sim-workload", kind]     # a speculative draft's acceptance
        return ["--sim-card", sim.card, "--sim-time-scale", str(sim.time_scale), "--sim-seed", str(sim.seed),
                *noise, *workload, *self.version_args(prof)]

    def version_args(self, prof: Profile) -> list[str]:
        v = prof.server.sglang_version                  # the stand-in plays 0.5.9 unless told otherwise
        return [] if v == "0.5.9" else ["--sim-sglang-version", v]

    def patch_env(self, patches: list[str]) -> dict[str, str]:
        return {"TUNECTL_SIM_PATCHES": ",".join(patches)}

    def gpu_env(self, prof: Profile) -> dict[str, str]:
        """Servers given GPUs claim them in one folder of the host's workdir (sim/gpus.py): two on one GPU fail."""
        return {} if prof.host.gpus is None else {"TUNECTL_SIM_GPU_DIR": f"{prof.host.workdir}/sim-gpus"}

    def smi(self, python: str, host_url: str) -> list[str]:
        """The stand-in's nvidia-smi (sim/smi.py): the same queries and output, from the server it runs."""
        return [python, "-m", "tunectl.sim.smi", "--server", host_url]

    def tokenizer(self, prof: Profile) -> str:
        """The profile's, else the stand-in's own (its cards' models are names, not folders on disk)."""
        from tunectl.sim import TOKENIZER

        return prof.model.tokenizer or str(TOKENIZER)


ENGINES: dict[str, Engine] = {e.name: e for e in (Engine(), Sim())}


def engine(prof: Profile) -> Engine:
    return ENGINES[prof.server.engine]
