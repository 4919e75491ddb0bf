"""Plain data types shared by runners, search, store and reports. No behaviour beyond (de)serialisation.

Metric names follow `sglang.bench_serving` (output_throughput, p99_ttft_ms, ...) so result files keep the
producer's names. Every record carries `schema` so readers can evolve.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# A crash catalog repair (tunectl/sglang/crashes/catalog.py), as the search reads it (search/repair.py): (target, change),
# target a flag without dashes, an environment variable or `patch:<id>`; change a value or one of the directions.
LOWER, RAISE = "<lower>", "<raise>"
Repair = tuple[str, object]

SCHEMA_VERSION = 1

# Failure classes (issue 3): what a failed launch or level means for the search.
CrashClass = Literal[
    "config_error",      # deterministic for these flags (argparse exit 2, startup OOM, ...): infeasible
    "load_crash",        # died under load at a given concurrency level
    "flaky",             # nondeterministic (NCCL timeout, autotune race): one retry on a clean host
    "hang",              # no token progress with requests in flight / watchdog
    "startup_timeout",   # never became ready within the phase deadlines
    "infra",             # not the config's fault (link lost, dirty host): retried, never told to the sampler
]
CRASH_CLASSES: tuple[str, ...] = ("config_error", "load_crash", "flaky", "hang", "startup_timeout", "infra")

LevelStatus = Literal["ok", "crashed", "failed", "pruned", "skipped"]
TrialStatus = Literal["ok", "crashed", "infra", "pruned", "running", "interrupted", "dry_run"]

# The latency metrics of sglang.bench_serving, with the stats it reports for each.
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e_latency")
LATENCY_STATS = ("mean", "median", "std", "p90", "p95", "p99")


def metric_key(stat: str, metric: str) -> str:
    """`metric_key("p99", "ttft") == "p99_ttft_ms"` — SGLang's naming."""
    return f"{stat}_{metric}_ms"


@dataclass
class CrashInfo:
    cls: str                      # one of CRASH_CLASSES
    signature: str                # catalog id, e.g. "page_table_1_flattened", "cuda_oom_startup", "unknown"
    phase: str                    # "startup" | "load" | "teardown"
    level: int | None = None      # concurrency level at which it happened (load phase)
    exception_line: str = ""      # e.g. "AttributeError: 'PrefillMetadata' object has no attribute ..."
    traceback_excerpt: str = ""   # last lines of the traceback
    exit_code: int | None = None  # server wrapper's exit code when known (137 = SIGKILL)
    detect_latency_s: float | None = None  # first traceback line written -> detected
    log_offset: int | None = None  # byte offset of the first traceback line in server.log
    message: str = ""             # one human line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> CrashInfo | None:
        return None if not d else cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


@dataclass
class LevelResult:
    concurrency: int
    status: str                               # LevelStatus
    workload: str = "random"
    metrics: dict[str, float] = field(default_factory=dict)  # SGLang names: output_throughput, p99_ttft_ms, ...
    completed: int = 0
    failed_requests: int = 0
    duration_s: float = 0.0
    client_bound: bool = False
    crash: CrashInfo | None = None
    # The steady window (warm-up and drain left out): metrics["steady_output_throughput"] with its 95% interval,
    # the steady requests it rests on, the batches the interval comes from, and whether the level's time cap
    # ended it before the interval was as precise as asked. metrics["output_throughput"] stays
    # sglang.bench_serving's whole-run definition (all tokens / whole duration).
    output_throughput_ci95: list[float] | None = None
    samples: int = 0
    batches: int = 0
    capped: bool = False
    witness: dict[str, Any] = field(default_factory=dict)   # server-side figures and the client/server gap
    errors: list[str] = field(default_factory=list)          # a failed level: the client's own error lines
    request_rate: float | None = None     # an open-loop level: the rate asked for (req/s); None: closed loop
    speedup: float | None = None          # a trace replay: its speed-up
    schema: int = SCHEMA_VERSION

    @property
    def load(self) -> str:
        """The level's name in results: `c64` (concurrency), `r4` (request rate), `x2` (a trace at 2x)."""
        if self.speedup is not None:
            return f"x{self.speedup:g}"
        return f"r{self.request_rate:.4g}" if self.request_rate is not None else f"c{self.concurrency}"

    @property
    def output_throughput(self) -> float:
        """The level's throughput: the steady window's when measured, else the whole run's."""
        return self.value("output_throughput")

    def value(self, metric: str) -> float:
        if metric == "output_throughput" and "steady_output_throughput" in self.metrics:
            return float(self.metrics["steady_output_throughput"])
        return float(self.metrics.get(metric, 0.0))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["crash"] = self.crash.to_dict() if self.crash else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LevelResult:
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["crash"] = CrashInfo.from_dict(d.get("crash"))
        return cls(**kw)


@dataclass(frozen=True)
class LadderStep:
    """One level of a trial's ladder as a study keeps it (the `ladder` user attribute, best.json): compact, named."""
    workload: str
    concurrency: int
    status: str
    output_throughput: float
    duration_s: float
    request_rate: float | None = None     # an open-loop level (a capacity search's probe): its req/s

    @classmethod
    def of(cls, lv: LevelResult) -> LadderStep:
        return cls(lv.workload, lv.concurrency, lv.status, round(lv.output_throughput, 2), round(lv.duration_s, 3),
                   lv.request_rate)

    @property
    def load(self) -> float:
        """What the level offered: its request rate when open-loop, else its concurrency."""
        return float(self.request_rate) if self.request_rate is not None else float(self.concurrency)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["request_rate"] is None:
            del d["request_rate"]           # closed-loop levels are stored as before
        return d

    @classmethod
    def from_attr(cls, raw: Any) -> LadderStep:
        """From a stored dict, or from the positional [workload, concurrency, status, throughput, duration] list
        that studies before the named record stored."""
        rate = raw.get("request_rate") if isinstance(raw, dict) else None
        if isinstance(raw, dict):
            raw = [raw["workload"], raw["concurrency"], raw["status"], raw["output_throughput"], raw["duration_s"]]
        workload, conc, status, thr, dur = raw
        return cls(str(workload), int(conc), str(status), float(thr), float(dur),
                   None if rate is None else float(rate))


def ladder_steps(raw: Any) -> list[LadderStep]:
    """A stored ladder (user attribute or best.json) as records; [] when there is none."""
    return [LadderStep.from_attr(x) for x in raw] if isinstance(raw, list) else []


def http_url(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets."""
    return f"http://{'[' + host + ']' if ':' in host and not host.startswith('[') else host}:{port}"


@dataclass
class LaunchPlan:
    """Everything needed to reproduce a launch by hand."""

    argv: list[str]                       # full command-line equivalent, e.g. [python, -m, sglang.launch_server, ...]
    config: dict[str, Any]                # SGLang --config YAML content (flag names without dashes)
    env: dict[str, str]                   # environment the server gets (secrets redacted when stored)
    exec_argv: list[str] = field(default_factory=list)  # what actually runs: [python, -m, ..., --config, file]
    patches: list[str] = field(default_factory=list)    # patch ids in effect
    port: int = 30000
    host: str = "127.0.0.1"
    run_id: str = ""
    trial_dir: str = ""                   # on the GPU host
    params: dict[str, Any] = field(default_factory=dict)  # the search-space values that produced this plan
    # env read from the caller's (`${NAME}` in server.env): name -> the profile's own text, stored and shown in
    # place of the value it expanded to, whatever the name (the value may be a secret; the text is the profile's)
    env_refs: dict[str, str] = field(default_factory=dict)

    @property
    def reach_host(self) -> str:
        """Where a client on the server's host reaches it: its bind address, or loopback when that is every
        interface (`--host 0.0.0.0`: connecting to a wildcard address works on Linux only, and past a proxy whose
        no_proxy names loopback only)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "": "127.0.0.1"}.get(self.host, self.host)

    @property
    def url(self) -> str:
        """The server's base URL on its own host."""
        return http_url(self.reach_host, self.port)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaunchPlan:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class TrialResult:
    trial: int                                  # trial number within the study (or sweep index)
    status: str                                 # TrialStatus
    params: dict[str, Any] = field(default_factory=dict)
    levels: list[LevelResult] = field(default_factory=list)
    crash: CrashInfo | None = None
    launch: LaunchPlan | None = None
    ready_s: float | None = None                # launch -> ready
    startup_phases: dict[str, float] = field(default_factory=dict)  # milestone -> seconds since launch;
    # "compiling_s": seconds the startup waited on kernel compilers past a phase deadline
    server_facts: dict[str, float] = field(default_factory=dict)    # read from the server log: pool, limits,
                                                                    # free memory, retracted requests
    teardown: dict[str, Any] = field(default_factory=dict)  # {"verdict": "clean"|"dirty", "seconds": .., ...}
    host: str = "local"
    # the GPUs it ran on (runners/checks/hostcheck.py `machine`: model, count, power limit, a hash of their UUIDs):
    # two machines of one model can differ by 20% (docs/real-gpu.md); "" where unknown (the stand-in, older studies)
    machine: str = ""
    sglang_version: str = ""
    patch_hashes: dict[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    wall_s: float = 0.0
    saved_s: float = 0.0                        # time saved by pruning / early stop (estimated)
    role: str = "search"                        # "baseline" | "search" | "finalist" | "sweep"
    attempt: int = 1
    # SLA capacity (objective mode goodput, `sweep --capacity`): the load found, the final bracket, the SLO
    capacity: dict[str, Any] | None = None
    schema: int = SCHEMA_VERSION

    @property
    def stable_levels(self) -> list[LevelResult]:
        return [lv for lv in self.levels if lv.status == "ok"]

    @property
    def best_output_throughput(self) -> float:
        return max((lv.output_throughput for lv in self.stable_levels), default=0.0)

    @property
    def max_stable_concurrency(self) -> int:
        return max((lv.concurrency for lv in self.stable_levels), default=0)

    @property
    def crashed_level(self) -> int | None:
        return self.crash.level if self.crash else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["levels"] = [lv.to_dict() for lv in self.levels]
        d["crash"] = self.crash.to_dict() if self.crash else None
        d["launch"] = self.launch.to_dict() if self.launch else None
        d["best_output_throughput"] = self.best_output_throughput
        d["max_stable_concurrency"] = self.max_stable_concurrency
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["levels"] = [LevelResult.from_dict(x) for x in d.get("levels", [])]
        kw["crash"] = CrashInfo.from_dict(d.get("crash"))
        kw["launch"] = LaunchPlan.from_dict(d["launch"]) if d.get("launch") else None
        return cls(**kw)
