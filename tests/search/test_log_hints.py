"""What a served config's own log asks for: decode batches above the captured CUDA graph sizes, and requests queued
while the running batch stood at max-running-requests. Read from real SGLang 0.5.17 logs, turned into one-knob
moves, and taken by the search (on the stand-in's virtual model)."""
from __future__ import annotations

from pathlib import Path

import optuna

from tests.search.test_repair import search_trials
from tunectl import knobs
from tunectl.sglang.crashes.classifier import LogWatcher
from tunectl.profile import load_profile
from tunectl.search.repair import log_hints, repair_moves
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"
PROFILE = ROOT / "profiles" / "sim-llama8b-h200.yaml"


def facts_of(log: Path) -> dict[str, float]:
    return LogWatcher.read(log.read_bytes()).facts


def test_real_decode_lines_show_a_batch_above_the_captured_graphs_and_a_queue_at_the_cap() -> None:
    # graphs captured to bs 64: the batch of 235 ran without them, those of 64 and below with them
    on = facts_of(LOGS / "server-graphs-on.log")
    assert (on["decode_bs_max"], on["decode_bs_nograph_max"]) == (235, 235)
    assert "decode_queue_at_cap" not in on                         # never at its max_running_requests of 256
    # max_running_requests=256, graphs to 256: every batch a graph, 256 requests queued at the cap
    capped = facts_of(LOGS / "h200-tunectl" / "sweep-both-clients.log")
    assert (capped["max_running_requests"], capped["decode_bs_max"], capped["decode_queue_at_cap"]) == (256, 256, 256)
    assert "decode_bs_nograph_max" not in capped


PARAMS = {"disable-cuda-graph": False, "cuda-graph-max-bs": 64, "max-running-requests": 256,
          "mem-fraction-static": 0.88, "chunked-prefill-size": 8192, "kv-cache-dtype": "auto",
          "attention-backend": "fa3"}


def hint_moves(facts: dict[str, float], p: dict) -> list[dict]:
    """The one-knob moves the 8B profile's log hints make of these facts for config `p`."""
    prof = load_profile(PROFILE)
    tokens = prof.bench.workloads[0].input_len + prof.bench.workloads[0].output_len
    return [m for fixes, bounds in log_hints(prof.search, p, knobs.merge(prof, p)[0], facts, tokens)
            for m in repair_moves(prof.search, p, fixes, bounds)]


def test_the_hints_become_one_knob_moves_as_far_as_the_log_says() -> None:
    params, moves = PARAMS, hint_moves
    wl = load_profile(PROFILE).bench.workloads[0]

    # 235 uncovered: the smallest captured size that holds it, not one step (128)
    assert moves(facts_of(LOGS / "server-graphs-on.log"), params) == [{"cuda-graph-max-bs": 256}]
    # graphs off: no max bs to raise; the move is graphs on (its max bs then covers the batch: the next test)
    assert moves(facts_of(LOGS / "server-graphs-on.log"), {**params, "disable-cuda-graph": True}) == [
        {"disable-cuda-graph": False}]
    # 256 running + 256 queued: max-running on the log scale's grid at or above 512
    capped = facts_of(LOGS / "h200-tunectl" / "sweep-both-clients.log")
    (move,) = moves(capped, params)
    assert list(move) == ["max-running-requests"] and move["max-running-requests"] >= 512
    # the KV pool already sent requests back: the cap is not what held them
    assert moves({**capped, "retracted_reqs": 40}, params) == []
    # a pool that holds no more requests than run now: no raise
    assert moves({**capped, "max_total_num_tokens": 256 * (wl.input_len + wl.output_len)}, params) == []


def test_graphs_switched_on_cover_the_batch_the_log_showed_not_the_baseline_max_bs() -> None:
    """Real SGLang with graphs off (all decode lines `cuda graph: False`, batches up to 256): the hint turns graphs on
    with a max bs that covers 256, where a plain switch would take the knob's baseline (SGLang's 256 here, 32 on
    the GLM-5 profile) and read graphs as useless."""
    import random

    from tunectl.search.repair import repaired_configs
    from tunectl.search.sampler import complete
    from tunectl.search.space import baseline_params

    prof = load_profile(PROFILE)
    prof.search.space["cuda-graph-max-bs"].default = 64
    base = baseline_params(prof)
    off = {k: v for k, v in base.items() if k != "cuda-graph-max-bs"} | {"disable-cuda-graph": True}
    facts = facts_of(LOGS / "server-graphs-off.log")
    assert (facts["decode_bs_max"], facts["decode_bs_nograph_max"]) == (256, 256)
    tokens = prof.bench.workloads[0].input_len + prof.bench.workloads[0].output_len
    hints = log_hints(prof.search, off, knobs.merge(prof, off)[0], facts, tokens)
    cands = [c for fixes, bounds in hints for c in repaired_configs(
        prof.search, off, fixes, lambda p: complete(prof.search, p, random.Random(0), base), bounds)]
    assert cands == [{**off, "disable-cuda-graph": False, "cuda-graph-max-bs": 256}]


def test_a_baseline_whose_big_batches_ran_without_graphs_gets_its_graphs_raised_next(tmp_path: Path) -> None:
    """SGLang's default on the 8B card captures graphs to bs 256 and the ladder runs batches of 1024: the loop's
    first own step is the baseline with graphs covering that batch, and it serves more."""
    prof = load_profile(PROFILE)
    prof.search.finalists.top_k = 0
    out = run_search(prof, trials=5, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    trials = search_trials(out.storage, prof.name)
    base = trials[0]
    assert base.user_attrs["role"] == "baseline"
    missed = base.user_attrs["server_facts"]["decode_bs_nograph_max"]
    assert missed > base.params["cuda-graph-max-bs"]
    hint = next(t for t in trials if t.user_attrs.get("proposed_by") == "repair")
    assert hint.user_attrs["repair_of"] == base.number
    changed = {k: v for k, v in hint.params.items() if base.params.get(k) != v}
    assert list(changed) == ["cuda-graph-max-bs"] and changed["cuda-graph-max-bs"] >= missed
    assert hint.values[0] > base.values[0]


POOL_FULL_LINE = ("[2026-12-02 16:20:07] Decode batch, #running-req: 417, #token: 610000, token usage: 0.95, "
                  "cuda graph: True, gen throughput (token/s): 5120.31, #queue-req: 95")
RAMP_LINE = ("[2026-12-02 16:20:01] Decode batch, #running-req: 300, #token: 120000, token usage: 0.19, "
             "cuda graph: True, gen throughput (token/s): 2048.00, #queue-req: 200")


def facts_of_lines(*lines: str) -> dict[str, float]:
    return LogWatcher.read("".join(line + "\n" for line in lines)).facts


def test_a_full_kv_pool_holding_requests_back_is_read_from_the_decode_lines() -> None:
    """SGLang's decode line carries `token usage` (the pool's share in use): requests queued with the pool full
    is the pool holding them back; requests queued with the pool nearly empty are a level's ramp (prefill)."""
    assert facts_of_lines(RAMP_LINE, POOL_FULL_LINE)["decode_queue_pool_full"] == 95
    assert "decode_queue_pool_full" not in facts_of_lines(RAMP_LINE)
    # the real 0.5.17 logs: queues (256 at the cap), but the tiny model's pool never past 1%
    for log in (LOGS / "server-graphs-on.log", LOGS / "h200-tunectl" / "sweep-both-clients.log"):
        assert "decode_queue_pool_full" not in facts_of(log)


def test_a_full_pool_asks_for_fp8_kv_then_a_larger_pool() -> None:
    params = {**PARAMS, "cuda-graph-max-bs": 512, "max-running-requests": 1024}
    full = facts_of_lines(POOL_FULL_LINE)
    (fp8, larger) = hint_moves(full, params)
    assert fp8 == {"kv-cache-dtype": "fp8_e4m3"}
    assert list(larger) == ["mem-fraction-static"] and larger["mem-fraction-static"] > 0.88
    assert hint_moves(full, {**params, "kv-cache-dtype": "fp8_e4m3"}) == [larger]   # FP8 already: a larger pool
    assert hint_moves(facts_of_lines(RAMP_LINE), params) == []                      # queued while prefilling


def test_a_pool_the_log_says_is_fp8_already_gets_a_larger_pool_not_fp8_kv() -> None:
    """`--kv-cache-dtype auto` resolves to FP8 for some checkpoints and GPUs; SGLang 0.5.17 names the pool's dtype
    (`KV Cache is allocated. dtype: torch.float8_e4m3fn`): a full FP8 pool asks for a larger pool only, not for the
    FP8 KV it already has. The real H200 log's BF16 pool reads 16 bits; 0.5.9's line, without a dtype, nothing."""
    assert facts_of(LOGS / "server-graphs-on.log")["kv_cache_bits"] == 16
    params = {**PARAMS, "cuda-graph-max-bs": 512, "max-running-requests": 1024}
    fp8_pool = facts_of_lines("[2026-12-02 16:10:33] KV Cache is allocated. dtype: torch.float8_e4m3fn, "
                              "#tokens: 610000, K size: 10.0 GB, V size: 10.0 GB", POOL_FULL_LINE)
    assert fp8_pool["kv_cache_bits"] == 8
    (larger,) = hint_moves(fp8_pool, params)
    assert list(larger) == ["mem-fraction-static"]
    no_dtype = facts_of_lines("[2026-12-02 16:10:33] KV Cache is allocated. #tokens: 610000, K size: 10.0 GB, "
                              "V size: 10.0 GB", POOL_FULL_LINE)
    assert "kv_cache_bits" not in no_dtype and hint_moves(no_dtype, params)[0] == {"kv-cache-dtype": "fp8_e4m3"}


def test_a_baseline_whose_kv_pool_was_full_gets_fp8_kv_next(tmp_path: Path) -> None:
    """The L40S card: weights fill two thirds of the GPU and SGLang's default BF16 pool holds fewer requests than
    the ladder sends. The baseline's own log shows the pool full with requests queued (and retracted); the loop's
    first own step is the baseline with an FP8 KV cache alone, and it serves more."""
    prof = load_profile(ROOT / "profiles" / "sim-qwen3-30b-a3b-l40s.yaml")
    prof.search.finalists.top_k = 0
    out = run_search(prof, trials=5, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    trials = search_trials(out.storage, prof.name)
    base = trials[0]
    assert base.user_attrs["server_facts"]["decode_queue_pool_full"] > 0 and base.params["kv-cache-dtype"] == "auto"
    step = next(t for t in trials if t.user_attrs.get("proposed_by") == "repair")
    assert step.user_attrs["repair_of"] == base.number
    assert {k: v for k, v in step.params.items() if base.params.get(k) != v} == {"kv-cache-dtype": "fp8_e4m3"}
    assert step.values[0] > base.values[0]


def test_real_startup_lines_size_the_graphs_and_the_gpu() -> None:
    # SGLang 0.5.17: decode graphs captured to bs 64 took 0.04 GB (the prefill graphs' 0.40 GB are not decode's);
    # the GPU had 139.13 GB before the weights
    on = facts_of(LOGS / "server-graphs-on.log")
    assert (on["graph_bs_max"], on["graph_mem_gb"], on["gpu_mem_gb"]) == (64, 0.04, 139.13)
    off = facts_of(LOGS / "server-graphs-off.log")
    assert "graph_mem_gb" not in off and "graph_bs_max" not in off
    # SGLang 0.5.9's lines, as the stand-in writes them
    w = LogWatcher()
    w.feed(b"[2026-12-05 03:59:45 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]\n"
           b"[2026-12-05 03:59:46 TP0] Capture cuda graph end. Time elapsed: 1.20 s. mem usage=0.88 GB. "
           b"avail mem=11.31 GB.\n", 0.0)
    w.flush(0.0)
    assert (w.facts["graph_bs_max"], w.facts["graph_mem_gb"]) == (32, 0.88)


def test_a_profile_for_sglang_0_5_23_walks_as_its_0_5_9_twin(tmp_path: Path) -> None:
    """SGLang 0.5.23 has no --cuda-graph-max-bs (0.5.17 made it an alias of --cuda-graph-max-bs-decode): the same
    8B profile written for 0.5.23 names its knob cuda-graph-max-bs-decode. Its log hint raises that knob, the
    footprint and vetoes read it, and the stand-in runs it as the 0.5.9 flag: the two walks are the same trial for
    trial (without the spellings, the 0.5.23 walk got no graph hint and went elsewhere)."""
    text = PROFILE.read_text().replace('sglang_version: "0.5.9"', 'sglang_version: "0.5.23"')
    text = text.replace("\n    cuda-graph-max-bs:", "\n    cuda-graph-max-bs-decode:")
    (tmp_path / "p23.yaml").write_text(text)
    walks = []
    for i, path in enumerate((PROFILE, tmp_path / "p23.yaml")):
        prof = load_profile(path)
        prof.search.finalists.top_k = 0
        assert ("cuda-graph-max-bs-decode" in prof.search.space) == (i == 1)
        out = run_search(prof, trials=10, root=tmp_path / str(i), evaluate=VirtualEvaluator(prof), seed=0)
        walks.append(search_trials(out.storage, prof.name))
    old, new = walks
    assert [(t.user_attrs.get("proposed_by"), t.values[0] if t.values else None, t.user_attrs.get("crash_signature"))
            for t in new] == [(t.user_attrs.get("proposed_by"), t.values[0] if t.values else None,
                               t.user_attrs.get("crash_signature")) for t in old]
    hint = new[1]
    assert hint.user_attrs["proposed_by"] == "repair" and hint.user_attrs["repair_of"] == new[0].number
    changed = {k: v for k, v in hint.params.items() if new[0].params.get(k) != v}
    assert list(changed) == ["cuda-graph-max-bs-decode"] and hint.values[0] > new[0].values[0]


def test_every_fact_the_log_gives_reaches_the_search_through_the_one_list() -> None:
    """The classifier writes LOG_FACTS and the search keeps exactly those in a trial's record: no fact the log
    gives can fall between two lists. End to end on a real SGLang 0.5.17 log (the FP8 KV pool of the SSH MoE search)
    with a full pool: log -> facts -> the trial's stored record -> the search's moves: a larger pool, not the FP8 KV
    the pool already has."""
    from tunectl.sglang.crashes.classifier import LOG_FACTS
    from tunectl.models import TrialResult
    from tunectl.search.feedback import evidence_attrs

    real = ROOT / "docs" / "real-gpu" / "ssh-moe" / "results" / "ssh-moe-search" / "trials" / "2" / "server.log"
    seen: set[str] = set()
    for log in [real, *sorted(LOGS.rglob("*.log"))]:
        seen |= set(facts_of(log))
    assert seen and seen <= set(LOG_FACTS)
    w = LogWatcher.read(real.read_bytes() + (POOL_FULL_LINE + "\n").encode())
    stored = evidence_attrs(TrialResult(trial=2, status="ok", server_facts=dict(w.facts)))["server_facts"]
    assert stored["kv_cache_bits"] == 8 and stored["decode_queue_pool_full"] == 95
    params = {**PARAMS, "cuda-graph-max-bs": 512, "max-running-requests": 1024}
    (larger,) = hint_moves(stored, params)
    assert list(larger) == ["mem-fraction-static"]
