"""A profile's workloads (`bench.workloads[]`): what each concurrency level sends. Re-exported by tunectl.profile.

Kinds: `random`, `shared_prefix`, `long_prompt` (seeded random token ids, docs/workloads.md), `sharegpt` and
`jsonl` (a dataset file, `path`), `scenarios` (named input/output length pairs or distributions; one workload per
scenario in results), `trace` (a request trace with timestamps, replayed: docs/load.md). `turns` > 1 makes
multi-turn conversations of the synthetic kinds; `multi_turn` does so for a dataset's conversations. Each turn's prompt
carries the conversation so far, so turns share their history's prefix.
"""
from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tunectl import datasets
from tunectl.errors import ProfileError
from tunectl.yamlmodel import Strict

SYNTHETIC = ("random", "shared_prefix", "long_prompt", "scenarios")
DATASETS = ("sharegpt", "jsonl")
KINDS = (*SYNTHETIC, *DATASETS)


class Length(Strict):
    """A token length: `fixed` (value), `uniform` (low..high), `normal` (mean, std), `lognormal` (mean, std of
    the length itself), each clipped to [min, max]."""

    dist: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    value: int | None = Field(None, ge=1)
    low: int | None = Field(None, ge=1)
    high: int | None = Field(None, ge=1)
    mean: float | None = Field(None, gt=0)
    std: float | None = Field(None, ge=0)
    min: int = Field(1, ge=1)
    max: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _params(self) -> Length:
        need = {"fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "std"),
                "lognormal": ("mean", "std")}[self.dist]
        missing = [p for p in need if getattr(self, p) is None]
        if missing:
            raise ValueError(f"dist '{self.dist}' needs {' and '.join(need)}; missing: {', '.join(missing)}")
        if self.dist == "uniform" and self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low <= high must hold, but got (low={self.low}, high={self.high})")
        return self

    def draw(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            n = float(self.value or 1)
        elif self.dist == "uniform":
            n = rng.randint(self.low or 1, self.high or 1)
        elif self.dist == "normal":
            n = rng.gauss(self.mean or 1.0, self.std or 0.0)
        else:
            m, s = self.mean or 1.0, self.std or 0.0
            sigma2 = math.log(1.0 + (s / m) ** 2)
            n = rng.lognormvariate(math.log(m) - sigma2 / 2, math.sqrt(sigma2))
        return int(min(max(round(n), self.min), self.max or 1 << 30))


def _length(v: int | Length) -> Length:
    return Length(value=v) if isinstance(v, int) else v


class Scenario(Strict):
    input_len: int | Length
    output_len: int | Length

    def draw(self, rng: random.Random) -> tuple[int, int]:
        return _length(self.input_len).draw(rng), _length(self.output_len).draw(rng)


class WorkloadSpec(Strict):
    kind: Literal["random", "shared_prefix", "long_prompt", "scenarios", "sharegpt", "jsonl", "trace"] = "random"
    name: str | None = None                       # the label in results (default: the kind, or the scenario's name)
    input_len: int = Field(256, ge=1)             # synthetic kinds; a dataset turn without an answer: output_len
    output_len: int = Field(128, ge=1)
    range_ratio: float = Field(1.0, gt=0, le=1)   # like bench_serving --random-range-ratio
    shared_prefix_len: int = Field(2048, ge=0)    # shared_prefix: the common system prompt length
    turns: int = Field(1, ge=1)                   # synthetic kinds: turns per conversation (history reused)
    path: str | None = None                       # sharegpt / jsonl / trace: the file (relative: the profile's folder)
    speedup: float = Field(1.0, gt=0)             # kind trace (docs/load.md): replayed at this x its pace
    multi_turn: bool = False                      # sharegpt / jsonl: every answered user turn is a request
    chat_template: bool | None = None             # None: for messages yes, for a ShareGPT first turn no
    tokenizer: str | None = None                  # datasets: default the model's (model.tokenizer, else its path)
    scenarios: dict[str, Scenario] = Field(default_factory=dict)   # kind scenarios: name -> lengths
    prompts_per_level: int = Field(2, ge=1)       # requests per level = max(min_prompts, this x concurrency)
    min_prompts: int = Field(16, ge=1)
    warmup_requests: int = Field(2, ge=0)
    seed: int = 1
    client: Literal["builtin", "bench_serving"] | None = None   # None: bench.client
    vocab_size: int | None = Field(None, ge=8)    # the model's vocabulary when under 30k token ids

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> WorkloadSpec:
        if self.kind == "trace" and not self.path:
            raise ValueError("kind 'trace' needs path: a Mooncake .jsonl or an Azure .csv trace file")
        if self.kind in DATASETS and not self.path:
            raise ValueError(f"kind '{self.kind}' needs 'path' (the dataset file)")
        if self.kind not in (*DATASETS, "trace") and self.path:
            raise ValueError(f"'path' is for kinds {', '.join(DATASETS)}, trace; not '{self.kind}'")
        if self.kind not in DATASETS and self.multi_turn:
            raise ValueError(f"'multi_turn' is for kinds {', '.join(DATASETS)}; use 'turns' for kind '{self.kind}'")
        if self.kind == "scenarios" and not self.scenarios:
            raise ValueError("kind 'scenarios' needs 'scenarios' ({name: {input_len, output_len}})")
        if self.kind != "scenarios" and self.scenarios:
            raise ValueError(f"'scenarios' is for kind 'scenarios', not '{self.kind}'")
        if self.kind in (*DATASETS, "trace") and self.turns > 1:
            raise ValueError("'turns' is for synthetic kinds; a file's conversations come from the file "
                             "(multi_turn: true)")
        return self

    @property
    def label(self) -> str:
        """The workload's name in results: its name (else its kind), plus the client when one is named for it."""
        base = self.name or self.kind
        return base if self.client is None else f"{base}@{self.client}"

    def expanded(self) -> list[WorkloadSpec]:
        """A scenarios workload as one workload per scenario (each measured and reported on its own)."""
        if self.kind != "scenarios" or len(self.scenarios) == 1 and self.name:
            return [self]
        return [self.model_copy(update={"name": name, "scenarios": {name: sc}}) for name, sc in self.scenarios.items()]


def bench_serving_reads(w: WorkloadSpec) -> bool:
    """What `sglang.bench_serving` can send as this workload (single-turn data, synthetic kinds)."""
    if w.kind == "sharegpt":
        return not w.multi_turn and not w.chat_template
    return w.kind in ("random", "shared_prefix", "long_prompt", "trace") and w.turns == 1   # trace: docs/load.md


def check_files(workloads: list[WorkloadSpec], folder: Path, source: str) -> None:
    """Dataset paths resolve against the profile's folder; each file is read and checked now (one line naming the
    file, line and field when it is missing or malformed), not when its level starts."""
    data = [w for w in workloads if w.kind in DATASETS]
    missing = [m for m in ("transformers", "jinja2") if importlib.util.find_spec(m) is None] if data else []
    if missing:
        raise ProfileError(source, "bench.workloads.kind", data[0].kind, "dataset workloads need a tokenizer and "
                           f"its chat template: pip install 'tunectl[datasets]' ({', '.join(missing)})")
    for w in data:
        if w.path:
            where = Path(w.path).expanduser()
            w.path = str(where if where.is_absolute() else (folder / where).resolve())
            if not datasets.read(w.kind, w.path, w.multi_turn):
                raise ProfileError(w.path, "(file)", None, f"no conversations of 2 or more turns (workload "
                                   f"{w.label!r})")
