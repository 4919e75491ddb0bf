"""The Client protocol: one concurrency level against a running server, measured in SGLang's metric names.

A client gets only its slice of the world (`Target`: where the server is, the model, the time scale, the host it
may run on), never the profile or the Server. Every client passes the same conformance suite
(tests/runners/client_conformance.py); a third client is one module with a `CLIENT` plus its name in
`tunectl.runners.clients.CLIENTS` (and in the profile's `client` choices).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.steady import Steady
from tunectl.runners.hosts.base import Runner

Abort = threading.Event | Callable[[], bool] | None
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Target:
    """The server under test as a client sees it."""
    base_url: str                     # as this process reaches it (through the runner's forward for SSH)
    host_url: str                     # as the server's own host reaches it
    runner: Runner                    # the server's host, for a client that runs there
    python: str                       # the Python on that host
    out_dir: str                      # a directory on that host for the client's files (the trial directory)
    backend: str                      # "sglang" (native /generate) or "sglang-oai" (/v1/completions)
    model: str                        # the served model name
    tokenizer: str
    time_scale: float = 1.0           # the stand-in's clock: wall times / time_scale are modeled units
    request_timeout_s: float = 600.0
    level_timeout_s: float = 600.0    # the whole level, for a client run as one command
    # Steady-state levels, for a client that can measure a steady window (the built-in one): at least
    # num_prompts requests and min_level_s modeled seconds, then until the 95% interval's half-width is
    # <= precision x the value or max_level_s (the cap). precision None: exactly num_prompts requests.
    precision: float | None = None
    min_level_s: float = 0.0
    max_level_s: float = 120.0
    # base_url is relayed by this very process (an SSH port forward): a client here must not share its
    # interpreter (and its lock) with the relay's threads, so it streams from worker processes only
    relayed: bool = False
    # the objective's SLO limits (profile objective.slo): a level reports slo_attainment and goodput against them
    slo: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenLoad:
    """An open-loop level: requests at `rate` per (modeled) second, or a `kind: trace` workload's timestamps."""
    rate: float | None = None             # None: the workload's trace
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_prompts: int = 0


@dataclass
class LevelMetrics:
    concurrency: int
    num_prompts: int
    workload: str = "random"
    metrics: dict[str, float] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    client_bound: bool = False
    wall_s: float = 0.0
    aborted: bool = False
    server_gone: bool = False
    processes: int = 1
    client: dict[str, float] = field(default_factory=dict)
    steady: Steady | None = None          # the steady window's throughput and its 95% interval, when measured
    capped: bool = False                  # the level's time cap came before its interval was precise
    sends: list[tuple[float, float]] = field(default_factory=list)  # open loop: (due, sent) wall s from its start

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.completed == self.num_prompts and not self.aborted


class Client(Protocol):
    name: str
    streams_progress: bool            # calls `progress` as tokens stream; False: the ladder watches server batches

    def run_level(self, target: Target, workload: WorkloadSpec, concurrency: int, num_prompts: int, *,
                  progress: Progress | None = None, abort: Abort = None) -> LevelMetrics:
        """Run `num_prompts` requests of `workload` in `concurrency` closed-loop streams; never raises for a
        failed request or a dead server (those are counted in the result)."""
        ...

    def run_open(self, target: Target, workload: WorkloadSpec, load: OpenLoad, *,
                 progress: Progress | None = None, abort: Abort = None) -> LevelMetrics:
        """An open-loop level: requests sent on a schedule (a rate, or the workload's trace)."""
        ...
