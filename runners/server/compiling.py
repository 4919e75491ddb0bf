"""Kernel compiles during startup: a phase whose deadline passes while the server's compilers run is not late.

On a fresh GPU host the first start of a backend JIT-compiles its kernels: FlashInfer runs `ninja` and `nvcc` inside
the server's run (each ninja job in its own process group, but with the server's environment, so
`Runner.group_processes` lists them). Captured graphs then wait minutes with the GPU idle and the log silent.
`wait_ready` asks `CompileWait.step` once a phase deadline has passed: while a compiler runs the deadline waits, and
when they are gone it is re-armed from that moment (the phase gets its whole budget after the compile). The
wait per launch is capped by `Timeouts.compile_s`; past it the launch ends `timeout_compile`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tunectl.runners.hosts.base import ProcInfo

# argv[0] basenames of kernel compilers and the build tools that drive them (FlashInfer / Triton / DeepGEMM JIT)
COMPILERS = frozenset({"nvcc", "cicc", "ptxas", "ninja", "cc1plus", "gcc", "g++", "c++", "cudafe++", "fatbinary",
                       "nvlink"})
SCAN_S = 1.0              # during a compile: how often the process table is read again
TIMEOUT_COMPILE = "timeout_compile"


def compilers(procs: Iterable[ProcInfo]) -> Counter[str]:
    """How many processes of each compiler name run among `procs` (by argv[0]'s basename)."""
    found: Counter[str] = Counter()
    for p in procs:
        name = p.cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]
        if name in COMPILERS:
            found[name] += 1
    return found


def describe(found: Counter[str] | dict[str, int]) -> str:
    """`nvcc x3, ninja x1`, the most numerous first."""
    return ", ".join(f"{name} x{n}" for name, n in sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class CompileWait:
    """Seconds a launch waited on its compilers past a phase deadline, and the stretch in progress."""

    waited_s: float = 0.0                 # finished stretches
    since: float | None = None            # the stretch in progress began (monotonic); None: none in progress
    scanned: float = 0.0                  # the process table was last read
    rearm_at: float = 0.0                 # phase deadlines count from no earlier than this
    over_cap: bool = False
    found: dict[str, int] = field(default_factory=dict)   # compilers at the last sighting

    def total(self, now: float) -> float:
        return self.waited_s + (now - self.since if self.since is not None else 0.0)

    def due(self, now: float) -> bool:
        """Whether to read the process table now (inside a stretch, once per SCAN_S)."""
        return self.since is None or now - self.scanned >= SCAN_S

    def step(self, procs: Iterable[ProcInfo], now: float, cap_s: float) -> str:
        """One look at the server's processes after a deadline passed: "compiling" (wait on; a new stretch is
        "started"), "finished" (a stretch ended: deadlines re-armed), "none" or "over_cap"."""
        found, self.scanned = compilers(procs), now
        if not found:
            if self.since is None:
                return "none"
            self.waited_s += now - self.since        # they ended since the last sighting: count up to now
            self.since, self.rearm_at = None, now
            return "finished"
        started = self.since is None
        self.since = now if started else self.since
        self.found = dict(found)
        if self.total(now) > cap_s:
            self.waited_s, self.since, self.over_cap = self.total(now), None, True
            return "over_cap"
        return "started" if started else "compiling"
