"""A dataset workload's conversations as token ids: `tokenized(spec, tokenizer) -> Conversations`.

The file is read by `tunectl.datasets` (checked when the profile loads). Token counts follow
`sglang.bench_serving --dataset-name sharegpt`: prompt ids = `tokenizer.encode(prompt)`, output length =
`len(tokenizer.encode(answer))` unless the file gives `output_len`; a ShareGPT request whose prompt or output is
under 2 tokens is skipped, as there. Chat messages go through the tokenizer's chat template (a plain
`role: content` layout when it has none) with the generation prompt; a turn without an answer or `output_len`
gets the workload's `output_len`.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from tunectl import datasets
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.prompts import Conversations


@lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")    # library code does not print
    from transformers import AutoTokenizer     # slow to import: only when a dataset needs it

    return AutoTokenizer.from_pretrained(path)


def render(tok: Any, messages: tuple[tuple[str, str], ...]) -> str:
    """The chat prompt as text, ending with the assistant's turn opening."""
    msgs = [{"role": r, "content": c} for r, c in messages]
    if getattr(tok, "chat_template", None):
        return str(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    return "".join(f"{r}: {c}\n\n" for r, c in messages) + "assistant: "


def tokenized(spec: WorkloadSpec, tokenizer: str) -> Conversations:
    assert spec.path is not None
    return _tokenized(spec.kind, spec.path, spec.multi_turn, spec.chat_template, spec.output_len,
                      spec.tokenizer or tokenizer)


@lru_cache(maxsize=8)
def _tokenized(kind: str, path: str, multi_turn: bool, template: bool | None, default_out: int,
               tokenizer: str) -> Conversations:
    tok = load_tokenizer(tokenizer)
    out = []
    for conv in datasets.read(kind, path, multi_turn):
        turns = tuple(_turn(tok, x, template, default_out) for x in conv)
        if turns and (kind != "sharegpt" or multi_turn or all(len(i) >= 2 and n >= 2 for i, n in turns)):
            out.append(turns)
    return tuple(out)


def _turn(tok: Any, t: datasets.Turn, template: bool | None, default_out: int) -> tuple[tuple[int, ...], int]:
    if t.messages is not None and template is not False:
        ids = tok.encode(render(tok, t.messages), add_special_tokens=False)
    elif t.messages is not None:
        ids = tok.encode("\n\n".join(c for _, c in t.messages))
    elif template:
        ids = tok.encode(render(tok, (("user", t.prompt or ""),)), add_special_tokens=False)
    else:
        ids = tok.encode(t.prompt or "")
    out = t.output_len or (len(tok.encode(t.answer)) if t.answer is not None else default_out)
    return tuple(ids), out
