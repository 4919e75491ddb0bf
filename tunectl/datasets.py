"""Dataset files for workloads (`kind: sharegpt`, `kind: jsonl`): read and checked, not tokenized.

A file becomes a list of conversations; a conversation is a list of `Turn`s sent in order by one client stream
(a single-turn dataset has one turn per conversation). A turn is raw prompt text or chat messages (the client
applies the tokenizer's chat template), and an output length: given (`output_len`), or the token count of the
reference answer (`answer`), as `sglang.bench_serving --dataset-name sharegpt` does.

- ShareGPT JSON: a list of `{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}` (also
  `conversation`). Single-turn (bench_serving's rule): conversations with fewer than 2 messages are skipped; the
  prompt is the first message's text and the answer the second's. `multi_turn`: every human message followed by
  a gpt answer is a turn whose prompt is the conversation so far (the dataset's answers as the history).
- JSONL: one request per line, `{"prompt": "..."}` or `{"messages": [{"role", "content"}, ...]}`, optional
  `output_len` (or OpenAI's `max_tokens`). A trailing assistant message is the reference answer. `multi_turn`:
  every user message followed by an assistant one is a turn, as for ShareGPT.

A missing or malformed file raises `ProfileError` naming the file, the line (JSONL, or the JSON syntax error's
line), the field and what is expected.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tunectl.errors import ProfileError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "system": "system"}


@dataclass(frozen=True)
class Turn:
    prompt: str | None = None                             # raw text, sent as is (no chat template)
    messages: tuple[tuple[str, str], ...] | None = None   # (role, content) up to this turn's user message
    answer: str | None = None                             # reference answer: output length = its token count
    output_len: int | None = None                         # given in the file


Conversation = tuple[Turn, ...]


def read(kind: str, path: str, multi_turn: bool = False) -> list[Conversation]:
    """The file's conversations (cached per path, modification time and mode)."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as e:
        raise ProfileError(path, "(file)", None, f"dataset file cannot be read: {e.strerror or e}") from None
    return list(_read(kind, path, multi_turn, stamp))


@lru_cache(maxsize=16)
def _read(kind: str, path: str, multi_turn: bool, _stamp: int) -> tuple[Conversation, ...]:
    if kind == "sharegpt":
        return tuple(_sharegpt(path, multi_turn))
    if kind == "jsonl":
        return tuple(_jsonl(path, multi_turn))
    raise ValueError(f"unknown dataset kind {kind!r}; valid: sharegpt, jsonl")


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(path, "(file)", None, f"dataset file cannot be read: {e}") from None


def _sharegpt(path: str, multi_turn: bool) -> list[Conversation]:
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as e:
        raise ProfileError(path, "(file)", None, f"not JSON: {e.msg} (column {e.colno}); ShareGPT is a JSON list "
                           "of {\"conversations\": [{\"from\", \"value\"}, ...]}", line=e.lineno) from None
    if not isinstance(data, list):
        raise ProfileError(path, "(top level)", None, f"a ShareGPT file is a JSON list of conversations, "
                           f"got {type(data).__name__}")
    out = []
    for i, item in enumerate(data):
        msgs = _sharegpt_messages(path, i, item)
        if len(msgs) < 2:
            continue                          # bench_serving's rule: fewer than 2 turns is no request
        turns = _turns(msgs) if multi_turn else [Turn(prompt=msgs[0][1], answer=msgs[1][1])]
        if turns:
            out.append(tuple(turns))
    return out


def _sharegpt_messages(path: str, i: int, item: Any) -> list[tuple[str, str]]:
    if not isinstance(item, dict):
        raise ProfileError(path, f"[{i}]", type(item).__name__, "a conversation is an object with 'conversations'")
    key = "conversations" if "conversations" in item else "conversation"
    conv = item.get(key)
    if not isinstance(conv, list):
        raise ProfileError(path, f"[{i}].conversations", None, "missing key or not a list of {from, value}")
    msgs = []
    for j, m in enumerate(conv):
        where = f"[{i}].{key}[{j}]"
        if not isinstance(m, dict) or not isinstance(m.get("value"), str):
            raise ProfileError(path, f"{where}.value", None, "missing key or not a string")
        role = m.get("from", "")
        if role not in ROLES:
            raise ProfileError(path, f"{where}.from", role, f"must be one of {', '.join(ROLES)}")
        msgs.append((ROLES[role], m["value"]))
    return msgs


def _turns(msgs: list[tuple[str, str]], output_len: int | None = None) -> list[Turn]:
    """One turn per user message answered by the next message (an assistant one); the history is the file's."""
    turns = []
    for k, (role, _) in enumerate(msgs[:-1]):
        if role == "user" and msgs[k + 1][0] == "assistant":
            turns.append(Turn(messages=tuple(msgs[:k + 1]), answer=msgs[k + 1][1], output_len=output_len))
    return turns


def _jsonl(path: str, multi_turn: bool) -> list[Conversation]:
    out = []
    for n, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ProfileError(path, "(line)", None, f"not JSON: {e.msg} (column {e.colno}); one request per line: "
                               "{\"prompt\": ...} or {\"messages\": [...]}, optional \"output_len\"", line=n) from None
        out.append(tuple(_jsonl_row(path, n, row, multi_turn)))
    if not out:
        raise ProfileError(path, "(file)", None, "no requests: one JSON object per line")
    return out


def _jsonl_row(path: str, n: int, row: Any, multi_turn: bool) -> list[Turn]:
    if not isinstance(row, dict):
        raise ProfileError(path, "(line)", None, "a line is a JSON object with 'prompt' or 'messages'", line=n)
    out_len = row.get("output_len", row.get("max_tokens"))
    if out_len is not None and (not isinstance(out_len, int) or isinstance(out_len, bool) or out_len < 1):
        field = "output_len" if "output_len" in row else "max_tokens"
        raise ProfileError(path, field, out_len, "must be a positive integer", line=n)
    if isinstance(row.get("prompt"), str):
        return [Turn(prompt=row["prompt"], output_len=out_len)]
    msgs = row.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ProfileError(path, "prompt", None, "missing: each line needs 'prompt' (a string) or 'messages' "
                           "(a non-empty list of {role, content})", line=n)
    pairs = [_message(path, n, j, m) for j, m in enumerate(msgs)]
    if multi_turn:
        turns = _turns(pairs, out_len)
        if turns:
            return turns
    if pairs[-1][0] == "assistant":
        return [Turn(messages=tuple(pairs[:-1]), answer=pairs[-1][1], output_len=out_len)]
    return [Turn(messages=tuple(pairs), output_len=out_len)]


def _message(path: str, n: int, j: int, m: Any) -> tuple[str, str]:
    if not isinstance(m, dict) or not isinstance(m.get("content"), str):
        raise ProfileError(path, f"messages[{j}].content", None, "missing key or not a string", line=n)
    role = m.get("role")
    if role not in ("system", "user", "assistant"):
        raise ProfileError(path, f"messages[{j}].role", role, "must be one of system, user, assistant", line=n)
    return str(role), m["content"]
