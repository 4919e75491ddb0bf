"""The stand-in's modeled clock is its own: what it serves does not depend on how fast its client (or its host) is.

A closed loop whose client pauses before each request would, on a wall-time clock scaled by 1/scale, leave the
server idle for modeled seconds. For a client that reads the server's clock (it says how many requests it keeps in
flight, `X-Sim-Clock: streams=N`, as the built-in client does) the pause is waited out (no modeled time passes), so the
server's schedule and the tokens' stamps are those of an instant client, and the live reading equals the virtual
model's.
"""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.sim._server import BASELINE, Server
from tests.sim.test_virtual_parity import _argv_config
from tunectl.profile import WorkloadSpec
from tunectl.runners.clients.builtin import StopRule, run_level
from tunectl.sim.model import virtual_ladder

SCALE = 0.01          # 1 ms of wall time = 0.1 modeled s: a stall of a few ms would be a big dent on a wall clock
CARD = "glm5-nvfp4-8x-rtx-pro-6000"


async def _closed_loop(url: str, streams: int, per_stream: int, pause_s: float) -> list[tuple[float, float, int]]:
    """`streams` closed-loop streams, each pausing `pause_s` of wall time before each request; per request the
    server's stamps (arrival, last chunk) and the tokens it reported."""
    out: list[tuple[float, float, int]] = []

    async def stream(session: aiohttp.ClientSession, k: int) -> None:
        for i in range(per_stream):
            await asyncio.sleep(pause_s)
            body = {"input_ids": [(k * 997 + i * 31 + j) % 4000 + 5 for j in range(256)], "stream": True,
                    "sampling_params": {"max_new_tokens": 128, "ignore_eos": True}}
            last = None
            async with session.post(url + "/generate", json=body,
                                    headers={"X-Sim-Clock": f"streams={streams}"}) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        last = json.loads(line[6:])["meta_info"]
            assert last is not None
            arrival, sent = last["sim_clock_ts"]
            assert last["e2e_latency"] == pytest.approx(sent - arrival)
            out.append((arrival, sent, last["completion_tokens"]))

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(stream(session, k) for k in range(streams)))
    return out


def _throughput(reqs: list[tuple[float, float, int]]) -> float:
    return sum(n for _, _, n in reqs) / (max(s for _, s, _ in reqs) - min(a for a, _, _ in reqs))


def test_a_client_that_pauses_before_each_request_reads_what_an_instant_one_reads(launch) -> None:
    args = ("--stream-interval", "32", "--disable-radix-cache")
    quick = _closed_loop(launch(*args, scale=SCALE).url, 8, 4, 0.0)
    slow = _closed_loop(launch(*args, scale=SCALE).url, 8, 4, 0.004)   # 0.4 modeled s per request on a wall clock
    fast, paused = asyncio.run(quick), asyncio.run(slow)
    assert len(fast) == len(paused) == 32 and all(n == 128 for _, _, n in fast + paused)
    lad = virtual_ladder(CARD, _argv_config([*BASELINE, *args]), levels=[8], prompts_per_level=4, min_prompts=1)
    model = lad.levels[0].output_throughput
    assert _throughput(fast) == pytest.approx(model, rel=0.03)
    assert _throughput(paused) == pytest.approx(_throughput(fast), rel=0.03)


def test_every_chunk_carries_the_server_clock(launch) -> None:
    srv: Server = launch("--stream-interval", "8", scale=SCALE)
    native = [json.loads(line[6:]) for line in srv.post("/generate", {
        "input_ids": list(range(5, 261)), "stream": True,
        "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}).splitlines() if line.startswith(b"data: {")]
    stamps = [e["meta_info"]["sim_clock_ts"] for e in native]
    assert len(stamps) == 6 and len({a for a, _ in stamps}) == 1          # one arrival, on every chunk
    sent = [s for _, s in stamps]
    assert sent == sorted(sent) and sent[0] > stamps[0][0]                 # prefill, then decode steps
    oai = [json.loads(line[6:]) for line in srv.post("/v1/completions", {
        "prompt": list(range(5, 69)), "max_tokens": 16, "stream": True}).splitlines() if line.startswith(b"data: {")]
    assert oai and all(len(c["sim_clock_ts"]) == 2 for c in oai)


def test_the_built_in_client_reads_the_virtual_model_in_the_servers_clock(launch) -> None:
    # Steady levels on the server's clock: the reading is the model's whoever else runs on this host; the client
    # may well flag itself client_bound here (its own loop is late), the number does not move.
    srv: Server = launch("--stream-interval", "32", scale=SCALE)
    wl = WorkloadSpec(input_len=256, output_len=128, range_ratio=1.0)
    lad = virtual_ladder(CARD, _argv_config([*BASELINE, "--stream-interval", "32"]), levels=[16, 64],
                         prompts_per_level=2, min_prompts=2)
    for level in lad.levels:
        c = level.concurrency
        m = run_level(srv.url, c, wl, c, time_scale=SCALE, rule=StopRule(min_prompts=c, min_s=5, max_s=90))
        assert m.completed == m.num_prompts >= 2 * c and m.steady is not None and not m.capped
        assert m.steady.interval.value == pytest.approx(level.output_throughput, rel=0.03), (c, m.client)
