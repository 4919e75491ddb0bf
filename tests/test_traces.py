"""Trace files (Mooncake JSONL, Azure CSV): the samples read as written, prompts honour the hash ids, a relative
path resolves against the profile's folder, and a bad file is one line naming file, line and field (exit 2)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tunectl.errors import ProfileError
from tunectl.profile import WorkloadSpec, load_profile
from tunectl.runners.clients.replay import trace_prompt, trace_schedule
from tunectl.traces import HASH_BLOCK, TraceRequest, load_trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "profiles" / "traces" / "mooncake-sample.jsonl"
AZURE = ROOT / "profiles" / "traces" / "azure-sample.csv"


def test_mooncake_sample_reads_as_written() -> None:
    rows = [json.loads(x) for x in MOONCAKE.read_text().splitlines() if x.strip()]
    tr = load_trace(str(MOONCAKE))
    assert tr.format == "mooncake" and len(tr.requests) == len(rows)
    t0 = min(r["timestamp"] for r in rows)
    for got, row in zip(tr.requests, sorted(rows, key=lambda r: r["timestamp"])):
        assert got.t_s == pytest.approx((row["timestamp"] - t0) / 1000)
        assert (got.input_len, got.output_len, list(got.hash_ids)) == (row["input_length"], row["output_length"],
                                                                       row["hash_ids"])


def test_azure_sample_reads_as_written() -> None:
    lines = AZURE.read_text().splitlines()
    tr = load_trace(str(AZURE))
    assert tr.format == "azure" and len(tr.requests) == len(lines) - 1
    first, last = lines[1].split(","), lines[-1].split(",")
    assert (tr.requests[0].input_len, tr.requests[0].output_len) == (int(first[1]), int(first[2]))
    # 2025-05-14 09:00:00.1605980 -> ... : the span from the two date-times, to the microsecond
    from datetime import datetime
    span = (datetime.fromisoformat(last[0][:26]) - datetime.fromisoformat(first[0][:26])).total_seconds()
    assert tr.span_s == pytest.approx(span, abs=1e-6)


def test_requests_sharing_a_hash_id_share_that_blocks_tokens() -> None:
    a = trace_prompt(TraceRequest(0, 2 * HASH_BLOCK + 10, 8, (1, 2, 3)), 0, seed=1)
    b = trace_prompt(TraceRequest(0, 2 * HASH_BLOCK + 100, 8, (1, 2, 4)), 1, seed=1)
    c = trace_prompt(TraceRequest(0, 2 * HASH_BLOCK, 8, (5, 2)), 2, seed=1)
    assert a.input_len == 2 * HASH_BLOCK + 10 and b.input_len == 2 * HASH_BLOCK + 100
    assert a.ids[:2 * HASH_BLOCK] == b.ids[:2 * HASH_BLOCK]                    # blocks 1, 2 shared
    assert a.ids[2 * HASH_BLOCK:] != b.ids[2 * HASH_BLOCK:2 * HASH_BLOCK + 10]  # blocks 3 and 4 differ
    assert c.ids[HASH_BLOCK:] == a.ids[HASH_BLOCK:2 * HASH_BLOCK]              # block 2 is the same anywhere
    assert c.ids[:HASH_BLOCK] != a.ids[:HASH_BLOCK]
    # no hash ids (Azure) or more tokens than blocks: the rest is the request's own
    d = trace_prompt(TraceRequest(0, 700, 8), 3, seed=1)
    e = trace_prompt(TraceRequest(0, 700, 8), 4, seed=1)
    assert d.input_len == 700 and d.ids != e.ids and trace_prompt(TraceRequest(0, 700, 8), 3, seed=1).ids == d.ids


def test_schedule_follows_the_timestamps_at_the_speedup() -> None:
    tr = load_trace(str(MOONCAKE))
    for speed in (1.0, 4.0):
        plan = trace_schedule(WorkloadSpec(kind="trace", path=str(MOONCAKE), speedup=speed))
        assert [t for t, _ in plan] == [r.t_s / speed for r in tr.requests]
        assert [(p.input_len, p.output_len) for _, p in plan] == [(r.input_len, r.output_len) for r in tr.requests]


def _profile_with(tmp_path: Path, trace_name: str, text: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / trace_name).write_text(text)
    data = yaml.safe_load((ROOT / "profiles" / "sim-glm5-trace.yaml").read_text())
    data["bench"]["workloads"][0]["path"] = f"data/{trace_name}"          # relative to the profile
    (tmp_path / "sim-glm5-trace.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "sim-glm5-trace.yaml"


def test_relative_trace_path_resolves_against_the_profile(tmp_path: Path) -> None:
    prof = load_profile(_profile_with(tmp_path, "t.jsonl", MOONCAKE.read_text()))
    assert prof.bench.workloads[0].path == str((tmp_path / "data" / "t.jsonl").resolve())


@pytest.mark.parametrize("name,text,where,field", [
    ("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                '{"timestamp": 5, "input_length": "ten", "output_length": 5}\n', ":2", "input_length"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 10}\n', ":1", "output_length"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n', ":2", "not JSON"),
    ("t.jsonl", '{"timestamp": -4, "input_length": 10, "output_length": 5}\n', ":1", "timestamp"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "a"}\n', ":1", "hash_ids"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2025-01-01 00:00:00.1,10,5\n"
              "2025-01-01 00:00:01.1,10,0\n", ":3", "GeneratedTokens"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", ":2", "TIMESTAMP"),
    ("t.csv", "TIMESTAMP,Context\n1,2\n", ":1", "ContextTokens"),
    ("t.txt", "x", "", "Mooncake .jsonl or an Azure .csv"),
])
def test_a_bad_trace_is_one_line_naming_file_line_and_field(tmp_path: Path, name: str, text: str, where: str,
                                                            field: str) -> None:
    path = _profile_with(tmp_path, name, text)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    msg = str(e.value)
    assert msg.startswith(str((tmp_path / "data" / name).resolve()) + where) and field in msg and "\n" not in msg


def test_a_bad_trace_exits_2_with_one_line_from_the_cli(tmp_path: Path) -> None:
    path = _profile_with(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 0, "output_length": 5}\n')
    res = subprocess.run([sys.executable, "-m", "tunectl", "sweep", "-p", str(path), "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "t.jsonl:1" in lines[0] and "input_length" in lines[0] and "Traceback" not in res.stderr
