"""Profiles: strict YAML config (pydantic v2, unknown keys rejected).

Precedence: model defaults, then the YAML file, then CLI overrides (`--set`). A bad profile raises
`ProfileError`, which the CLI prints as one line naming file, field (with line), value and valid choices.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, StrictInt, field_validator, model_validator

from tunectl.energy import Cost
from tunectl.objective import Capacity, Objective, Reference
from tunectl.redact import secret_flag
from tunectl.sglang import scopes
from tunectl.slurmspec import SlurmSpec
from tunectl.workloads import WorkloadSpec, bench_serving_reads, check_files
from tunectl.yamlmodel import Strict, load_model

# an environment variable's name (POSIX): it is written unquoted before the launch command and in the host's env file
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_RULE = "letters, digits and '_', not starting with a digit"

__all__ = ["Capacity", "Objective", "Profile", "Reference", "WorkloadSpec", "load_profile"]

DEFAULT_LEVELS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


class ModelSpec(Strict):
    path: str
    served_name: str | None = None
    tokenizer: str | None = None          # for the real bench_serving client; defaults to path


class HostSpec(Strict):
    kind: Literal["local", "ssh", "slurm"] = "local"
    address: str | None = None            # ssh: a host name or a ~/.ssh/config alias
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)   # ssh: the sshd's port
    identity_file: str | None = None
    known_hosts: str | None = None        # extra known_hosts file; ~/.ssh/known_hosts is always read
    proxy_jump: str | None = None
    ssh_config: str | None = None         # default ~/.ssh/config
    connect_timeout_s: float = Field(15.0, gt=0, allow_inf_nan=False)
    workdir: str = "/tmp/tunectl"         # trial directories live under here on the host
    gpus: list[int] | None = None         # the GPUs tunectl may use (CUDA_VISIBLE_DEVICES); a count N = 0..N-1
    gpu_clean_mib: int = Field(1024, ge=0)            # a GPU using more than this before launch = dirty host
    min_free_disk_gb: float = Field(5.0, ge=0, allow_inf_nan=False)
    slurm: SlurmSpec | None = None        # kind slurm: the cluster (docs/slurm.md)

    @field_validator("gpus", mode="before")
    @classmethod
    def _count_is_ids(cls, v: Any) -> Any:
        return list(range(v)) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else v

    @field_validator("gpus")
    @classmethod
    def _gpu_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 0 or len(set(v)) != len(v)):
            raise ValueError("GPU ids are distinct integers >= 0 (CUDA_VISIBLE_DEVICES), or a count N >= 1 for "
                             "0..N-1")
        return v

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, v: str) -> str:
        """Every trial folder is `<workdir>/<run>`: a relative one lands wherever the server's shell starts."""
        if not v.startswith("/") or v.rstrip("/") == "":
            raise ValueError("an absolute folder on the host other than / (e.g. /tmp/tunectl)")
        return v

    @model_validator(mode="after")
    def _ssh_needs_address(self) -> HostSpec:
        if self.kind == "ssh" and not self.address:
            raise ValueError("host.kind 'ssh' needs host.address (a host name or ~/.ssh/config alias)")
        if (self.kind == "slurm") != (self.slurm is not None):
            raise ValueError("host.kind 'slurm' goes with a host.slurm section (shared_dir, partition, ...), "
                             "and host.slurm only with kind 'slurm'")
        return self


class SimSpec(Strict):
    card: str = "glm5-nvfp4-8x-rtx-pro-6000"   # a name under sim/cards/ or a path to a YAML file
    time_scale: float = Field(0.01, gt=0, le=1.0)  # wall seconds per modeled second
    seed: int = 0
    noise: float = Field(1.0, ge=0)                # the card's launch and drift noise x this (0: noise-free)

    @field_validator("card")
    @classmethod
    def _known_card(cls, v: str) -> str:
        """A card by name must be one the stand-in ships (a path is read where the stand-in runs)."""
        from tunectl.sim.card import known_cards

        if "/" not in v and not v.endswith((".yaml", ".yml")) and v not in known_cards():
            raise ValueError(f"no such sim card; known cards: {', '.join(known_cards())} (or a path to a card YAML)")
        return v


class Timeouts(Strict):
    """Per-phase deadlines (modeled seconds are scaled for the stand-in)."""

    launch_s: float = 120.0               # first log line
    load_weights_s: float = 1800.0        # `Load weight begin` -> `Load weight end`
    memory_pool_s: float = 600.0
    cuda_graph_s: float = 1200.0
    autotune_s: float = 1200.0
    compile_s: float = 1800.0             # per launch: waiting on the server's kernel compilers (nvcc, ninja) past a
                                          # phase deadline; a fresh host JIT-compiles a backend's kernels once
    ready_s: float = 600.0                # last milestone -> ready
    level_s: float = 900.0                # one concurrency level
    hang_s: float = 60.0                  # no token progress with requests in flight
    teardown_grace_s: float = 30.0        # TERM -> KILL
    port_release_s: float = 120.0
    gpu_release_s: float = 120.0


class ServerSpec(Strict):
    engine: Literal["sim", "sglang"] = "sim"
    # None: the interpreter running tunectl (the stand-in ships with it; a local SGLang shares its venv), or
    # `python3` on an SSH host running real SGLang. Never the login shell's guess for the stand-in.
    python: str | None = None
    sglang_version: str = "0.5.9"
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1024, le=65535)       # slot i of a host: port + i x 10 (docs/parallel.md)
    gpus_per_trial: int | None = Field(None, ge=1)    # None: from tp-size x dp-size x pp-size (docs/parallel.md)
    flags: dict[str, Any] = Field(default_factory=dict)   # SGLang flag names without dashes
    # Flags that go on the command line (an argv list, never shell text) instead of into the --config file:
    # SGLang's config parser rejects options whose destination a deprecated alias shares
    # (0.5.17: "Unsupported config option 'cuda_graph_backend_prefill' with action 'DeprecatedStoreConstAction'").
    argv_flags: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    patches: list[str] = Field(default_factory=list)      # bundled patch ids always applied
    sim: SimSpec = Field(default_factory=SimSpec)
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @model_validator(mode="after")
    def _no_secrets_in_flags(self) -> ServerSpec:
        for key in self.env:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"server.env: {key!r} is not an environment variable's name ({ENV_NAME_RULE})")
        for key in filter(secret_flag, self.flags):
            raise ValueError(f"server.flags.{key}: put secrets in the environment "
                             "(server.env: {SGLANG_API_KEY: ${SGLANG_API_KEY}}), not in a profile")
        if any(k.lstrip("-") == "config" for k in self.flags):
            raise ValueError("server.flags.config: tunectl writes the server's --config file itself (every flag "
                             "goes into it); list the flags under server.flags one by one")
        return self


class ParamSpec(Strict):
    """One search-space knob. Targets exactly one of: an SGLang flag (default: the knob's name), a bundled
    patch (bool knob: applied or not), or an environment variable."""

    type: Literal["categorical", "int", "float", "bool"]
    flag: str | None = None
    patch: str | None = None
    env: str | None = None
    choices: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    when: dict[str, Any] = Field(default_factory=dict)   # only sampled when these knobs have these values
    default: Any = None                                   # value in the baseline (trial 0); None = base flags
    # the `when:` SGLang's source implies where the profile wrote none (tunectl/sglang/scopes.py; not part of the YAML)
    _implied: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def conditions(self) -> dict[str, Any]:
        """When the knob is active: the profile's `when:`, else the condition its flag's scope implies."""
        return self.when if "when" in self.model_fields_set else self._implied

    def set_implied(self, when: dict[str, Any]) -> None:
        self._implied = dict(when)

    @model_validator(mode="after")
    def _check(self) -> ParamSpec:
        if sum(x is not None for x in (self.flag, self.patch, self.env)) > 1:
            raise ValueError("a knob targets one of flag, patch or env, not several")
        if self.env is not None and not ENV_NAME.fullmatch(self.env):
            raise ValueError(f"env: {self.env!r} is not an environment variable's name ({ENV_NAME_RULE})")
        if self.patch is not None and self.type != "bool":
            raise ValueError("a patch knob must have type 'bool'")
        if self.type == "categorical" and not self.choices:
            raise ValueError("type 'categorical' needs a non-empty 'choices' list")
        if self.type in ("int", "float") and self.choices is None:
            if self.low is None or self.high is None:
                raise ValueError(f"type '{self.type}' needs 'low' and 'high' (or 'choices')")
            if not self.low <= self.high:
                raise ValueError(f"low <= high must hold, but got (low={self.low}, high={self.high})")
            if self.log and self.low <= 0:
                raise ValueError(f"log scale needs low > 0, got low={self.low}")
            if self.type == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
                raise ValueError(f"type 'int' needs whole low and high, got (low={self.low}, high={self.high})")
        if self.step is not None and not self.step > 0:
            raise ValueError(f"step must be > 0, got step={self.step}")
        if self.choices is not None:
            twice = [c for i, c in enumerate(self.choices) if c in self.choices[:i]]
            if twice:
                raise ValueError(f"choices name {twice[0]!r} twice: {self.choices}")
        if self.default is not None:
            why = self.refuses(self.default)
            if why:
                raise ValueError(f"default: {why}")
        return self

    def refuses(self, value: Any) -> str | None:
        """Why `value` is not one this knob can take (None: it can): a bool knob's true/false, one of the choices,
        a number within low..high."""
        if self.type == "bool":
            return None if isinstance(value, bool) else f"{value!r} is not true or false"
        if self.choices is not None:
            return None if value in self.choices else f"{value!r} is not one of the choices {self.choices}"
        if self.type in ("int", "float"):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or (self.type == "int" and not float(value).is_integer()):
                return f"{value!r} is not {'a whole number' if self.type == 'int' else 'a number'}"
            if self.low is not None and self.high is not None and not self.low <= value <= self.high:
                return f"{value!r} is outside low..high ({self.low}..{self.high})"
        return None


class Finalists(Strict):
    """The race on fresh launches before a winner is named (search/race.py)."""

    top_k: int = Field(3, ge=0)       # 0: no finalists (the best single reading wins); else the race decides who runs
    reruns: int = Field(2, ge=0)      # the winner rests on 1 + reruns launches at least (0: no finalists)
    budget: int = Field(12, ge=0)     # reruns in all, for every config raced
    noise: float = Field(0.05, ge=0, le=1)   # launch-to-launch sd assumed until the study measures its own


class Pruning(Strict):
    enabled: bool = True
    min_levels: int = Field(3, ge=1)        # never prune before this many levels
    margin: float = Field(0.5, gt=0, le=1)  # prune when below margin x best seen at the same level


# The search's own rules (docs/search.md, "The policy"), by name, in the order they are asked: proposers queue a
# config before the sampler's next proposal (the first that has one wins); vetoes drop a proposal the history says
# will crash. The names live here, with the profile's schema; the rules in search/policy.py.
PROPOSERS = ("load_repair", "kv_pressure", "startup_repair", "log_hint", "split", "local")
VETOES = ("gpu", "foresight", "startup_risk")


class Policy(Strict):
    proposers: list[Literal[PROPOSERS]] = Field(default_factory=lambda: list(PROPOSERS))  # type: ignore[valid-type]
    vetoes: list[Literal[VETOES]] = Field(default_factory=lambda: list(VETOES))  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _once(self) -> Policy:
        for field in ("proposers", "vetoes"):
            names = getattr(self, field)
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"search.policy.{field}: {', '.join(twice)} named twice; each rule at most once")
        return self


class SearchSpec(Strict):
    space: dict[str, ParamSpec] = Field(default_factory=dict)
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    seed: int | None = Field(0, ge=0, le=2**32 - 1)    # the samplers' (numpy's) range
    trials: int = Field(40, ge=1)
    finalists: Finalists = Field(default_factory=Finalists)
    pruning: Pruning = Field(default_factory=Pruning)
    try_first: list[dict[str, Any]] = Field(default_factory=list)  # configs to run right after the baseline
    # Rank configs by their readings pooled with what the value model predicts for them from the other configs
    # (search/pooling.py): the config the local steps start from and the finalists' race. false: each config on its
    # own readings (the best single reading leads the walk; the race ranks by each config's mean).
    pool: bool = True
    # The proposers and vetoes the search runs, in order (a subset switches the others off; default: all)
    policy: Policy = Field(default_factory=Policy)
    flaky_retries: int = Field(1, ge=0)
    infra_retries: int = Field(2, ge=0)

    @model_validator(mode="after")
    def _when_refers_to_knobs(self) -> SearchSpec:
        for name, spec in self.space.items():
            for other in spec.when:
                if other not in self.space:
                    raise ValueError(f"search.space.{name}.when: {other!r} is not a knob; "
                                     f"valid: {sorted(self.space)}")
        for name, spec in self.space.items():
            if (spec.flag or name).lstrip("-") == "config" and spec.patch is None and spec.env is None:
                raise ValueError(f"search.space.{name}: drives --config, the file tunectl writes itself; a knob "
                                 "drives one SGLang flag")
            if secret_flag(spec.flag or name) and spec.patch is None and spec.env is None:
                raise ValueError(f"search.space.{name}: drives --{(spec.flag or name).lstrip('-')}, a secret: its "
                                 "values would be stored in results/; put it in the environment (server.env: "
                                 "{SGLANG_API_KEY: ${SGLANG_API_KEY}}), not in a search space")
        for name in self.space:
            cycle = _when_cycle(self.space, name, [name])
            if cycle:
                raise ValueError(f"search.space.{name}.when: circular: {' -> '.join(cycle)}; a knob's `when:` may "
                                 "only name knobs that do not depend on it")
        for i, cfg in enumerate(self.try_first):
            for knob, value in cfg.items():
                if knob not in self.space:
                    raise ValueError(f"search.try_first[{i}]: {knob!r} is not a knob; valid: {sorted(self.space)}")
                why = self.space[knob].refuses(value)
                if why:
                    raise ValueError(f"search.try_first[{i}].{knob}: {why}")
        return self


def _when_cycle(space: dict[str, ParamSpec], name: str, path: list[str]) -> list[str] | None:
    for other in space[name].when:
        if other == path[0]:
            return [*path, other]
        if other in space and other not in path:
            found = _when_cycle(space, other, [*path, other])
            if found:
                return found
    return None


class BenchSpec(Strict):
    levels: list[StrictInt] = Field(default_factory=lambda: list(DEFAULT_LEVELS))
    workloads: list[WorkloadSpec] = Field(default_factory=lambda: [WorkloadSpec()], min_length=1)
    client: Literal["builtin", "bench_serving"] = "builtin"
    backend: Literal["sglang", "sglang-oai"] = "sglang"
    saturation_stop: float | None = None          # stop the ladder when gain over the last level < this share
    request_timeout_s: float = 600.0
    # Steady-state levels (built-in client): a level lasts at least min_level_s (modeled seconds on the stand-in)
    # and prompts_per_level waves, then until its 95% interval's half-width is <= precision x the steady
    # throughput, or max_level_s (the cap, reported on the level). precision null: exactly the planned requests.
    min_level_s: float = Field(10.0, ge=0)
    precision: float | None = Field(0.03, gt=0, lt=1)
    max_level_s: float = Field(120.0, gt=0)
    # Open-loop levels (docs/load.md): requests arrive at these rates (req/s, modeled on the stand-in), Poisson,
    # or gamma when burstiness != 1 (< 1 burstier); max_concurrency caps the requests in flight
    rates: list[float] = Field(default_factory=list)
    burstiness: float = Field(1.0, gt=0)
    max_concurrency: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _levels_sorted(self) -> BenchSpec:
        if not self.levels or any(x < 1 for x in self.levels):
            raise ValueError(f"levels must be positive integers, got {self.levels}")
        if self.levels != sorted(set(self.levels)):
            raise ValueError(f"levels must be strictly increasing, got {self.levels}")
        if any(r <= 0 for r in self.rates) or self.rates != sorted(set(self.rates)):
            raise ValueError(f"rates must be positive and strictly increasing, got {self.rates}")
        if self.min_level_s > self.max_level_s:
            raise ValueError(f"bench.min_level_s: {self.min_level_s}: must be at most max_level_s "
                             f"({self.max_level_s})")
        return self

    @model_validator(mode="after")
    def _workloads(self) -> BenchSpec:
        wls = [x for w in self.workloads for x in w.expanded()]
        if len(wls) != len(self.workloads):
            self.workloads = wls
        labels = [w.label for w in wls]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"workloads: two workloads are labelled {twice[0]!r} in results; give each a 'name'")
        for w in wls:
            if (w.client or self.client) == "bench_serving" and not bench_serving_reads(w):
                raise ValueError(f"workload {w.label!r}: sglang.bench_serving reads kinds random, shared_prefix, "
                                 "long_prompt and single-turn sharegpt; use client: builtin for this one")
        return self


class Profile(Strict):
    name: str
    description: str = ""
    model: ModelSpec
    host: HostSpec = Field(default_factory=HostSpec)
    hosts: list[HostSpec] = Field(default_factory=list)   # several hosts, one study (docs/parallel.md)
    server: ServerSpec = Field(default_factory=ServerSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    objective: Objective = Field(default_factory=Objective)
    reference: Reference | None = None
    cost: Cost | None = None              # price per GPU-hour: cost per token, objective mode tokens_per_dollar

    # filled by load_profile, not part of the YAML
    source: str = Field("", exclude=True)

    @model_validator(mode="after")
    def _one_cluster(self) -> Profile:
        if len(self.hosts) > 1 and any(h.kind == "slurm" for h in self.hosts):
            raise ValueError("hosts: a Slurm cluster is the study's one host (host.kind: slurm; its scheduler "
                             "places the trials), not one of several")
        return self

    @model_validator(mode="after")
    def _cost_for_dollars(self) -> Profile:
        if self.objective.mode == "tokens_per_dollar" and self.cost is None:
            raise ValueError("objective.mode 'tokens_per_dollar' needs a cost block, e.g. cost: {gpu_hour_usd: 2.5}")
        return self

    @model_validator(mode="after")
    def _weights_name_workloads(self) -> Profile:
        labels = [w.label for w in self.bench.workloads]
        for name in self.objective.weights:
            if name not in labels:
                raise ValueError(f"objective.weights: {name!r} is not a workload; valid: {', '.join(labels)}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _hosts_replace_host(cls, data: Any) -> Any:
        """`hosts:` replaces `host:`; what runs one server at a time (`tunectl sweep`) uses the first of them,
        never the coordinator's own machine by default."""
        if isinstance(data, dict) and data.get("hosts"):
            if data.get("host") not in (None, data["hosts"][0]):     # (equal on re-validation of an assignment)
                raise ValueError("give host: (one host) or hosts: (several), not both")
            data = {**data, "host": data["hosts"][0]}
        return data

    @model_validator(mode="after")
    def _base_values_in_the_space(self) -> Profile:
        """A knob with no `default:` starts the baseline (trial 0) at its base flag or env value: one its own
        choices or range must hold, or trial 0 could not be told to the study."""
        from tunectl import knobs

        for name, spec in self.search.space.items():
            src = None if spec.default is not None else knobs.base_source(name, spec, self)
            if src is None:
                continue
            where, raw = src
            try:
                value = knobs.coerce(spec, raw)
            except (TypeError, ValueError):          # a number knob's flag that is not a number
                value = raw
            why = spec.refuses(value)
            if why:
                raise ValueError(f"search.space.{name}: the baseline takes {where} = {raw!r}, which "
                                 f"{why.removeprefix(repr(value) + ' ')}; add it to the knob, or give the knob a "
                                 "default: for trial 0")
        return self

    @model_validator(mode="after")
    def _implied_conditions(self) -> Profile:
        scopes.apply(self)
        return self

    @model_validator(mode="after")
    def _default_python(self) -> Profile:
        if self.server.python is None:
            here = self.host.kind == "local" or self.server.engine == "sim"
            self.server.python = (sys.executable or "python3") if here else "python3"
        return self


# ---------------------------------------------------------------------------------------------- loading

def load_profile(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Profile:
    """Load and validate a profile file. `overrides` are dotted paths (`server.port`) applied after YAML.
    A relative sim card path resolves against the profile's folder."""
    def edit(data: dict[str, Any]) -> None:
        for dotted, value in (overrides or {}).items():
            _set_dotted(data, dotted.split("."), value)

    prof = load_model(path, Profile, "profile", edit)
    prof.source = str(path)
    check_files(prof.bench.workloads, Path(path).parent, prof.source)
    card = prof.server.sim.card
    if _is_path(card) and not Path(card).is_absolute():
        prof.server.sim.card = str((Path(path).parent / card).resolve())
    for w in prof.bench.workloads:
        if w.path and not Path(w.path).is_absolute():
            w.path = str((Path(path).parent / w.path).resolve())
        if w.kind == "trace":
            from tunectl.traces import load_trace

            load_trace(w.path or "")          # a bad file: one line naming file, line and field (exit 2)
    return prof


def _is_path(card: str) -> bool:
    return "/" in card or card.endswith((".yaml", ".yml"))


def _set_dotted(data: dict[str, Any], parts: list[str], value: Any) -> None:
    for p in parts[:-1]:
        data = data.setdefault(p, {})
    data[parts[-1]] = value


def default_profile_path() -> Path:
    """The embedded default: profiles/sim-glm5.yaml in a checkout, else the packaged copy."""
    from tunectl import REPO_ROOT

    for cand in (Path("profiles/sim-glm5.yaml"), Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml",
                 Path(__file__).parent / "profiles" / "sim-glm5.yaml"):
        if cand.is_file():
            return cand
    return Path("profiles/sim-glm5.yaml")
