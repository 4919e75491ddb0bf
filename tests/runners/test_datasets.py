"""Dataset workloads (sharegpt, jsonl, scenarios, multi-turn): what a level sends is what the file holds, the real
sglang.bench_serving reads the same ShareGPT file alike, and a bad file is one line naming file, line and field."""
from __future__ import annotations

import importlib.util
import json
import random
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from tests.sim._server import Server, start
from tunectl.errors import ProfileError
from tunectl.profile import WorkloadSpec, load_profile
from tunectl.runners.clients import bench_serving, builtin
from tunectl.runners.clients.base import Target
from tunectl.runners.clients.datasets import tokenized
from tunectl.runners.clients.prompts import PromptStream, count_requests, make_prompts
from tunectl.runners.hosts.local import LocalRunner
from tunectl.sim import TOKENIZER

SAMPLES = Path(__file__).resolve().parents[2] / "profiles" / "data"
SHAREGPT = SAMPLES / "sharegpt-sample.json"
CHAT = SAMPLES / "chat-sample.jsonl"
PROMPTS = SAMPLES / "prompts-sample.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv: Server = start(tmp_path_factory.mktemp("sim"), "--disable-radix-cache", "--stream-interval", "8",
                        scale=0.002)
    yield srv
    srv.stop()


def _target(srv: Server, out: Path) -> Target:
    return Target(base_url=srv.url, host_url=srv.url, runner=LocalRunner(), python=sys.executable, out_dir=str(out),
                  backend="sglang", model="default", tokenizer=str(TOKENIZER), request_timeout_s=60,
                  level_timeout_s=300)


def _sharegpt_truth() -> tuple[int, int, int]:
    """(requests, input tokens, output tokens) of the sample, counted here by bench_serving's rule."""
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    n = inp = out = 0
    for item in json.loads(SHAREGPT.read_text()):
        conv = item["conversations"]
        if len(conv) < 2:
            continue
        p, o = len(tok.encode(conv[0]["value"])), len(tok.encode(conv[1]["value"]))
        if p >= 2 and o >= 2:
            n, inp, out = n + 1, inp + p, out + o
    return n, inp, out


def test_a_level_sends_the_files_requests_and_tokens(server: Server, tmp_path: Path) -> None:
    n, inp, out = _sharegpt_truth()
    w = WorkloadSpec(kind="sharegpt", path=str(SHAREGPT), warmup_requests=0)
    lv = builtin.CLIENT.run_level(_target(server, tmp_path), w, 8, n)
    assert lv.ok and lv.completed == n
    assert lv.metrics["total_input_tokens"] == inp and lv.metrics["total_output_tokens"] == out


def test_multi_turn_sends_every_answered_turn_with_its_history(server: Server, tmp_path: Path) -> None:
    w = WorkloadSpec(kind="jsonl", path=str(CHAT), multi_turn=True, warmup_requests=0)
    rows = [json.loads(x)["messages"] for x in CHAT.read_text().splitlines()]
    turns = sum(sum(m["role"] == "assistant" for m in row) for row in rows)
    convs = tokenized(w, str(TOKENIZER))
    assert len(convs) == len(rows) and sum(len(c) for c in convs) == turns
    for conv in convs:          # each turn's prompt starts with the one before (the radix cache's prefix)
        for (a, _), (b, _) in zip(conv, conv[1:]):
            assert len(b) > len(a) and b[:len(a) - 4] == a[:len(a) - 4]
    lv = builtin.CLIENT.run_level(_target(server, tmp_path), w, 4, turns)
    assert lv.ok and lv.completed == turns
    assert lv.metrics["total_input_tokens"] == sum(len(i) for c in convs for i, _ in c)


def test_jsonl_output_len_is_the_files(tmp_path: Path) -> None:
    w = WorkloadSpec(kind="jsonl", path=str(PROMPTS))
    want = [json.loads(x)["output_len"] for x in PROMPTS.read_text().splitlines()]
    prompts = make_prompts(w, len(want), convs=tokenized(w, str(TOKENIZER)))
    assert [p.output_len for p in prompts] == want
    assert [p.output_len for p in make_prompts(w, len(want) + 3, convs=tokenized(w, str(TOKENIZER)))][-3:] == want[:3]


def test_synthetic_turns_and_scenarios() -> None:
    w = WorkloadSpec(kind="shared_prefix", shared_prefix_len=128, input_len=50, output_len=20, turns=3)
    chains = make_prompts(w, 7)
    assert count_requests(chains) == 7 and [len(c.turns()) for c in chains] == [3, 3, 1]
    a, b, c = chains[0].turns()
    assert b.ids[:len(a.ids)] == a.ids and len(b.ids) == len(a.ids) + a.output_len + 50
    assert c.ids[:len(b.ids)] == b.ids and a.ids[:128] == chains[1].ids[:128]
    sc = WorkloadSpec(kind="scenarios", scenarios={"rag": {"input_len": {"dist": "lognormal", "mean": 400, "std": 100,
                                                                          "max": 900},
                                                            "output_len": {"dist": "uniform", "low": 10, "high": 20}}})
    drawn = [PromptStream(sc, 1)() for _ in range(1)] + make_prompts(sc, 400)
    ins = [p.input_len for p in drawn if p]
    assert 370 < sum(ins) / len(ins) < 430 and max(ins) <= 900
    assert all(10 <= p.output_len <= 20 for p in drawn if p)


def _profile(tmp_path: Path, workload: dict, **extra) -> Path:
    data = {"name": "t", "model": {"path": "m"}, "bench": {"workloads": [workload], **extra}}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_relative_path_resolves_against_the_profile_and_scenarios_expand(tmp_path: Path) -> None:
    shutil.copy(SHAREGPT, tmp_path / "conv.json")
    prof = load_profile(_profile(tmp_path, {"kind": "sharegpt", "path": "conv.json"}))
    assert prof.bench.workloads[0].path == str((tmp_path / "conv.json").resolve())
    prof = load_profile(_profile(tmp_path, {"kind": "scenarios", "scenarios": {
        "chat": {"input_len": 512, "output_len": 256}, "summarize": {"input_len": 4096, "output_len": 128}}}))
    assert [w.label for w in prof.bench.workloads] == ["chat", "summarize"]


@pytest.mark.parametrize(("body", "where", "says"), [
    (None, "missing.jsonl", "cannot be read"),
    ('{"prompt": "hi"}\n{"messages": [{"role": "user"}]}\n', "bad.jsonl:2: messages[0].content", "missing key"),
    ('{"prompt": "hi", "output_len": 0}\n', "bad.jsonl:1: output_len: 0", "positive integer"),
    ('{"prompt": "hi"}\n{"prompt": \n', "bad.jsonl:2:", "not JSON"),
    ('{"messages": [{"role": "bot", "content": "x"}]}\n', "bad.jsonl:1: messages[0].role: 'bot'", "must be one of"),
])
def test_a_bad_dataset_is_one_line_naming_file_line_and_field(tmp_path: Path, body: str | None, where: str,
                                                              says: str) -> None:
    name = where.split(":")[0]
    if body is not None:
        (tmp_path / name).write_text(body)
    with pytest.raises(ProfileError) as err:
        load_profile(_profile(tmp_path, {"kind": "jsonl", "path": name}))
    msg = str(err.value)
    assert where in msg and says in msg and "\n" not in msg and err.value.exit_code == 2


def test_bench_serving_is_refused_for_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="use client: builtin"):
        load_profile(_profile(tmp_path, {"kind": "jsonl", "path": str(CHAT)}, client="bench_serving"))


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang.bench_serving 0.5.9 not installed")
def test_the_real_bench_serving_reads_the_same_sharegpt_file(server: Server, tmp_path: Path) -> None:
    n, _, _ = _sharegpt_truth()
    w = WorkloadSpec(kind="sharegpt", path=str(SHAREGPT), warmup_requests=1, seed=random.randrange(100))
    real = bench_serving.CLIENT.run_level(_target(server, tmp_path), w, 8, n)
    ours = builtin.CLIENT.run_level(_target(server, tmp_path), w, 8, n)
    assert real.ok and ours.ok, real.errors
    got, want = real.metrics["total_output_tokens"], ours.metrics["total_output_tokens"]
    assert abs(got - want) <= 0.02 * want


def test_both_clients_on_a_data_profile_leave_bench_serving_what_it_reads(tmp_path: Path) -> None:
    from tunectl.commands.sweep import with_clients
    from tunectl.errors import UsageError

    prof = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "sim-glm5-chat.yaml")
    got = [w.label for w in with_clients(prof, "builtin,bench_serving").bench.workloads]
    assert got == ["chat@builtin", "sharegpt@builtin", "sharegpt@bench_serving", "random@builtin",
                   "random@bench_serving"]
    chat_only = load_profile(_profile(tmp_path, {"kind": "jsonl", "path": str(CHAT), "multi_turn": True}))
    with pytest.raises(UsageError, match="sends none of this profile's workloads"):
        with_clients(chat_only, "bench_serving")
