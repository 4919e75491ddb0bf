"""The sglang.bench_serving adapter against the real client's outputs (tests/fixtures/bench_serving)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.base import OpenLoad
from tunectl.runners.clients.bench_serving import (
    bench_serving_argv,
    interpret,
    parse_result_jsonl,
    parse_stdout,
)

FIX = Path(__file__).parent.parent / "fixtures" / "bench_serving"
HELP = Path(__file__).parent.parent.parent / "tunectl" / "sglang" / "help" / "bench_serving-0.5.23.txt"


def _read(name: str) -> str:
    return (FIX / name).read_text()


def test_argv_uses_only_flags_the_real_client_has() -> None:
    flags = set(re.findall(r"(--[a-z][\w-]+)", HELP.read_text()))
    for kind in ("random", "shared_prefix", "long_prompt"):
        argv = bench_serving_argv("python3", "http://127.0.0.1:30000", "sglang", "m", "tok",
                                  WorkloadSpec(kind=kind, input_len=9000), 64, 16, "out.jsonl", 7)
        assert {a for a in argv if a.startswith("--")} <= flags
        assert argv[:3] == ["python3", "-m", "sglang.bench_serving"]
    argv = bench_serving_argv("python3", None, "sglang-oai", "m", "tok", WorkloadSpec(input_len=300, output_len=20),
                              64, 16, "o.jsonl", 7, host="127.0.0.1", port=30001)
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--dataset-name"] == "random-ids" and pairs["--request-rate"] == "inf"
    assert (pairs["--max-concurrency"], pairs["--num-prompts"], pairs["--seed"]) == ("16", "64", "7")
    assert (pairs["--random-input-len"], pairs["--random-output-len"], pairs["--port"]) == ("300", "20", "30001")
    assert "--disable-tqdm" in argv


def test_argv_needs_a_target() -> None:
    with pytest.raises(ValueError):
        bench_serving_argv("python3", None, "sglang", "m", "t", WorkloadSpec(), 1, 1, "o", 0)


@pytest.mark.parametrize("name,n", [("0.5.23-result.jsonl", 1), ("0.5.17-h200-result.jsonl", 2)])
def test_result_jsonl_last_line_wins_and_infinity_parses(name: str, n: int) -> None:
    text = _read(name)
    res = parse_result_jsonl(text)
    last = json.loads(text.strip().splitlines()[-1])
    assert len(text.strip().splitlines()) == n
    assert math.isinf(res["request_rate"]) and res["completed"] == last["completed"]
    assert res["max_concurrency"] == last["max_concurrency"]


@pytest.mark.parametrize("stdout,jsonl,line", [("0.5.23-ok.stdout.txt", "0.5.23-result.jsonl", 0),
                                               ("0.5.17-h200-c16.stdout.txt", "0.5.17-h200-result.jsonl", 0),
                                               ("0.5.17-h200-c128.stdout.txt", "0.5.17-h200-result.jsonl", 1)])
def test_stdout_summary_matches_the_result_file(stdout: str, jsonl: str, line: int) -> None:
    parsed = parse_stdout(_read(stdout))
    truth = json.loads(_read(jsonl).splitlines()[line])
    shared = set(parsed) & set(truth)
    assert {"completed", "output_throughput", "p99_ttft_ms", "median_itl_ms", "concurrency",
            "total_output_tokens"} <= shared
    for key in shared - {"backend"}:
        assert parsed[key] == pytest.approx(truth[key], abs=0.006), key


def test_planned_token_totals_are_never_results() -> None:
    died = _read("0.5.23-server-died.stdout.txt")
    assert "#Output tokens: 1077" in died               # printed before the run...
    assert parse_stdout(died) == {}                     # ...and never read as a result
    ok = parse_stdout(_read("0.5.23-ok.stdout.txt"))
    assert "#Input tokens" not in json.dumps(ok)


def test_server_died_outcome_carries_the_evidence() -> None:
    out = interpret(1, _read("0.5.23-server-died.stdout.txt"), None, num_prompts=64)
    assert out.status == "server_died" and out.metrics == {} and out.completed == 0 and out.failed == 64
    assert any("ClientPayloadError" in e for e in out.evidence)
    assert any("Connection refused" in e for e in out.evidence)


def test_ok_outcome_prefers_the_result_file() -> None:
    out = interpret(0, _read("0.5.23-ok.stdout.txt"), _read("0.5.23-result.jsonl"), num_prompts=64)
    assert out.status == "ok" and out.failed == 0
    assert out.metrics["std_ttft_ms"] == pytest.approx(3.5397, abs=1e-3)    # only in the file, not stdout


def test_ok_without_result_file_falls_back_to_the_summary_block() -> None:
    out = interpret(0, _read("0.5.17-h200-c128.stdout.txt"), None, num_prompts=512)
    assert out.status == "ok" and out.metrics["output_throughput"] == pytest.approx(7111.48)


def test_partial_success_is_not_ok() -> None:
    out = interpret(0, _read("0.5.23-ok.stdout.txt"), _read("0.5.23-result.jsonl"), num_prompts=80)
    assert out.status == "error" and out.failed == 16


def test_other_failures_are_errors() -> None:
    out = interpret(2, "sglang.bench_serving: error: argument --backend: invalid choice: 'x'\n", None)
    assert out.status == "error" and out.metrics == {}


def test_rate_levels_pass_request_rate_and_the_cap_only_when_set() -> None:
    flags = set(re.findall(r"(--[a-z][\w-]+)", HELP.read_text()))
    argv = bench_serving_argv("python3", "http://127.0.0.1:30000", "sglang", "m", "tok", WorkloadSpec(), 80, 0,
                              "o.jsonl", 7, request_rate=160.0)
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--request-rate"] == "160.0" and "--max-concurrency" not in argv and "--burstiness" not in argv
    assert {a for a in argv if a.startswith("--")} <= flags
    argv = bench_serving_argv("python3", "http://127.0.0.1:30000", "sglang", "m", "tok", WorkloadSpec(), 80, 8,
                              "o.jsonl", 7, request_rate=4.0)
    assert dict(zip(argv[3::2], argv[4::2]))["--max-concurrency"] == "8"


@pytest.mark.parametrize("load,why", [(OpenLoad(None, 1.0, None, 10), "trace"), (OpenLoad(4.0, 0.5, None, 10),
                                                                                   "--burstiness")])
def test_what_sglang_bench_serving_cannot_send_is_a_failed_level_saying_so(load: OpenLoad, why: str) -> None:
    from tunectl.runners.clients.bench_serving import CLIENT

    m = CLIENT.run_open(None, WorkloadSpec(), load)  # type: ignore[arg-type]   # nothing runs: no target needed
    assert not m.ok and m.failed == 10 and why in m.errors[0] and "builtin" in m.errors[0]
