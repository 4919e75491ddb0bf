"""Seeded random-ids prompts for the built-in client (no tokenizer, no downloads).

Lengths follow `sglang.bench_serving --dataset-name random-ids`: each request's input and output length is drawn
uniformly from [max(1, int(len * range_ratio)), len]. Workload kinds:
- random: `input_len` random token ids per prompt.
- shared_prefix: one common prefix of `shared_prefix_len` ids (the same for every level of a workload seed),
  then `input_len` random ids per prompt: the radix-cache / chunked-prefix path that some crashes need.
- long_prompt: like random; the profile sets `input_len` above the server's `--chunked-prefill-size`, so every
  prompt is prefilled in several chunks.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from tunectl.profile import WorkloadSpec

# Token ids drawn from this range exist in every common vocabulary (32k and up) and avoid special tokens.
# A smaller vocabulary (WorkloadSpec.vocab_size) caps it: an id outside the model's vocabulary is a
# device-side assert in the server (seen on real SGLang 0.5.17), not a measurement.
ID_LOW, ID_HIGH = 1000, 30000
WARMUP_OUTPUT_LEN = 4      # output tokens of each warm-up request


@dataclass
class Prompt:
    ids: list[int]
    output_len: int

    @property
    def input_len(self) -> int:
        return len(self.ids)


def _length(rng: random.Random, full: int, ratio: float) -> int:
    return rng.randint(max(1, int(full * ratio)), full)


def _ids(rng: random.Random, n: int, vocab: int | None = None) -> list[int]:
    high = min(ID_HIGH, vocab) if vocab else ID_HIGH
    low = min(ID_LOW, high // 4)
    return [rng.randrange(low, high) for _ in range(n)]


def make_prompts(spec: WorkloadSpec, num_prompts: int, salt: int = 0) -> list[Prompt]:
    """`salt` (e.g. the concurrency level) varies the prompts between levels; the shared prefix does not vary."""
    rng = random.Random(f"{spec.seed}:{spec.kind}:{salt}")
    prefix = _ids(random.Random(f"{spec.seed}:prefix"), spec.shared_prefix_len, spec.vocab_size) \
        if spec.kind == "shared_prefix" else []
    return [Prompt(prefix + _ids(rng, _length(rng, spec.input_len, spec.range_ratio), spec.vocab_size),
                   _length(rng, spec.output_len, spec.range_ratio)) for _ in range(num_prompts)]


def warmup_prompts(spec: WorkloadSpec) -> list[Prompt]:
    rng = random.Random(f"{spec.seed}:warmup")
    return [Prompt(_ids(rng, min(spec.input_len, 64), spec.vocab_size), WARMUP_OUTPUT_LEN)
            for _ in range(spec.warmup_requests)]


@dataclass
class PromptStream:
    """Prompts made on demand (a level of open length): part `part` of a level draws its own seeded sequence,
    at most `limit` prompts. Picklable, so a client worker process makes its own."""

    spec: WorkloadSpec
    salt: int
    part: int = 0
    limit: int = 1 << 30

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.spec.seed}:{self.spec.kind}:{self.salt}:{self.part}")
        self._prefix = _ids(random.Random(f"{self.spec.seed}:prefix"), self.spec.shared_prefix_len,
                            self.spec.vocab_size) if self.spec.kind == "shared_prefix" else []
        self._made = 0

    def __call__(self) -> Prompt | None:
        if self._made >= self.limit:
            return None
        self._made += 1
        s, rng = self.spec, self._rng
        return Prompt(self._prefix + _ids(rng, _length(rng, s.input_len, s.range_ratio), s.vocab_size),
                      _length(rng, s.output_len, s.range_ratio))
