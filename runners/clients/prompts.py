"""Prompts for the built-in client: seeded random token ids, or a dataset's conversations (no downloads).

Lengths of the synthetic kinds follow `sglang.bench_serving --dataset-name random-ids`: each request's input and
output length is drawn uniformly from [max(1, int(len * range_ratio)), len]. Workload kinds (docs/workloads.md):
- random: `input_len` random token ids per prompt.
- shared_prefix: one common prefix of `shared_prefix_len` ids (the same for every level of a workload seed),
  then `input_len` random ids per prompt: the radix-cache / chunked-prefix path that some crashes need.
- long_prompt: like random; the profile sets `input_len` above the server's `--chunked-prefill-size`, so every
  prompt is prefilled in several chunks.
- scenarios: like random, lengths drawn from the scenario's distributions.
- sharegpt / jsonl: the file's conversations, tokenized (`datasets.tokenized`), in file order for a level of
  fixed length (a level longer than the file goes round it again), in a seeded order per worker otherwise.

A conversation of several turns is a chain of `Prompt`s (`then`): one stream sends them in order, each turn's
prompt being the previous one, its answer and the next user message (synthetic `turns`: random ids of the
planned lengths), so every turn shares its history's prefix with the one before.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tunectl.profile import WorkloadSpec

# Token ids drawn from this range exist in every common vocabulary (32k and up) and avoid special tokens.
# A smaller vocabulary (WorkloadSpec.vocab_size) caps it: an id outside the model's vocabulary is a
# device-side assert in the server (seen on real SGLang 0.5.17), not a measurement.
ID_LOW, ID_HIGH = 1000, 30000
WARMUP_OUTPUT_LEN = 4      # output tokens of each warm-up request

Conversations = tuple[tuple[tuple[tuple[int, ...], int], ...], ...]   # turns of (prompt ids, output length)


@dataclass
class Prompt:
    ids: list[int]
    output_len: int
    then: Prompt | None = None        # the conversation's next turn, sent by the same stream once this one ended

    @property
    def input_len(self) -> int:
        return len(self.ids)

    def turns(self) -> list[Prompt]:
        out, p = [], self
        while p is not None:
            out.append(p)
            p = p.then
        return out


def count_requests(prompts: Sequence[Prompt]) -> int:
    return sum(len(p.turns()) for p in prompts)


def _length(rng: random.Random, full: int, ratio: float) -> int:
    return rng.randint(max(1, int(full * ratio)), full)


def _ids(rng: random.Random, n: int, vocab: int | None = None) -> list[int]:
    high = min(ID_HIGH, vocab) if vocab else ID_HIGH
    low = min(ID_LOW, high // 4)
    return [rng.randrange(low, high) for _ in range(n)]


def _prefix(spec: WorkloadSpec) -> list[int]:
    if spec.kind != "shared_prefix":
        return []
    return _ids(random.Random(f"{spec.seed}:prefix"), spec.shared_prefix_len, spec.vocab_size)


def _turn(spec: WorkloadSpec, rng: random.Random, base: list[int]) -> Prompt:
    if spec.kind == "scenarios":
        inp, out = next(iter(spec.scenarios.values())).draw(rng)
        return Prompt(base + _ids(rng, inp, spec.vocab_size), out)
    ids = _ids(rng, _length(rng, spec.input_len, spec.range_ratio), spec.vocab_size)
    return Prompt(base + ids, _length(rng, spec.output_len, spec.range_ratio))


def _synthetic(spec: WorkloadSpec, rng: random.Random, prefix: list[int]) -> Prompt:
    head = cur = _turn(spec, rng, prefix)
    for _ in range(spec.turns - 1):
        cur.then = _turn(spec, rng, cur.ids + _ids(rng, cur.output_len, spec.vocab_size))
        cur = cur.then
    return head


def _chain(conv: tuple[tuple[tuple[int, ...], int], ...]) -> Prompt:
    head: Prompt | None = None
    for ids, out in reversed(conv):
        head = Prompt(list(ids), out, head)
    assert head is not None
    return head


def _limit(heads: list[Prompt], num_prompts: int) -> list[Prompt]:
    """Whole conversations until `num_prompts` requests; the last one cut short to fit exactly."""
    out, left = [], num_prompts
    for p in heads:
        if left <= 0:
            break
        turns = p.turns()[:left]
        for a, b in zip(turns, turns[1:]):
            a.then = b
        turns[-1].then = None
        out.append(turns[0])
        left -= len(turns)
    return out


def make_prompts(spec: WorkloadSpec, num_prompts: int, salt: int = 0,
                 convs: Conversations | None = None) -> list[Prompt]:
    """`num_prompts` requests (a conversation's turns count one each). `salt` (e.g. the concurrency level)
    varies synthetic prompts between levels; the shared prefix does not vary. `convs`: a dataset's, tokenized."""
    if convs is not None:
        if not convs:
            return []
        heads, made = [], 0
        while made < num_prompts:
            heads.append(_chain(convs[len(heads) % len(convs)]))
            made += len(convs[(len(heads) - 1) % len(convs)])
        return _limit(heads, num_prompts)
    rng, prefix = random.Random(f"{spec.seed}:{spec.kind}:{salt}"), _prefix(spec)
    heads = []
    while len(heads) * spec.turns < num_prompts:
        heads.append(_synthetic(spec, rng, prefix))
    return _limit(heads, num_prompts)


def warmup_prompts(spec: WorkloadSpec) -> list[Prompt]:
    rng = random.Random(f"{spec.seed}:warmup")
    return [Prompt(_ids(rng, min(spec.input_len, 64), spec.vocab_size), WARMUP_OUTPUT_LEN)
            for _ in range(spec.warmup_requests)]


@dataclass
class PromptStream:
    """Prompts made on demand (a level of open length): part `part` of a level draws its own seeded sequence,
    at most `limit` conversations. Picklable, so a client worker process makes its own."""

    spec: WorkloadSpec
    salt: int
    part: int = 0
    limit: int = 1 << 30
    convs: Conversations | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.spec.seed}:{self.spec.kind}:{self.salt}:{self.part}")
        self._prefix = _prefix(self.spec)
        self._order: list[int] = []
        self._made = 0

    def split(self, part: int, limit: int) -> PromptStream:
        return replace(self, part=part, limit=limit)

    def __call__(self) -> Prompt | None:
        if self._made >= self.limit or (self.convs is not None and not self.convs):
            return None
        self._made += 1
        if self.convs is None:
            return _synthetic(self.spec, self._rng, self._prefix)
        if not self._order:
            self._order = list(range(len(self.convs)))
            self._rng.shuffle(self._order)
        return _chain(self.convs[self._order.pop()])
