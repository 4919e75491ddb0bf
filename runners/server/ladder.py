"""The concurrency ladder: every level of every workload on one launch, watched for crashes and hangs.

`run_ladder(server, levels, workloads, on_level=None, on_event=None, should_prune=None) -> Ladder`

Each level runs the workload's client (`clients.get(name).run_level`, the Client protocol) in a thread while this thread
polls the server log every `lifecycle.POLL_S`. A crash (LogWatcher, or the process gone) aborts the client at once and
stops the ladder:
the level is recorded as "crashed" with the CrashInfo, later levels are not run. A hang (requests in flight and
no token progress for `timeouts.hang_s`) is a crash of class "hang". `should_prune(level_result)` returning True
stops the ladder after that level (the trial is "pruned"); `bench.saturation_stop` stops a workload's ladder
when throughput gained less than that share over the previous level.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunectl.engines import engine
from tunectl.goodput import level_requests
from tunectl.models import CrashInfo, LevelResult
from tunectl.profile import WorkloadSpec
from tunectl.runners import clients
from tunectl.runners.clients.base import OpenLoad, Target
from tunectl.runners.clients.prompts import WARMUP_OUTPUT_LEN
from tunectl.runners.server.lifecycle import POLL_S, Server, scaled, time_scale
from tunectl.runners.server.power import add_energy, power_sampler
from tunectl.runners.server.witness import Pulse, Witness, accept_length
from tunectl.traces import load_trace

HANG_FLOOR_S = 3.0        # never call a hang faster than this (wall seconds): scheduling noise on busy hosts


@dataclass
class Ladder:
    levels: list[LevelResult] = field(default_factory=list)
    crash: CrashInfo | None = None
    pruned: bool = False
    saturated: list[str] = field(default_factory=list)   # workloads stopped early


def num_prompts(w: WorkloadSpec, concurrency: int) -> int:
    return max(w.min_prompts, w.prompts_per_level * concurrency)


class _Progress:
    """Token progress of the running level, from the client's callback and the server's batch log lines."""

    def __init__(self) -> None:
        self.tokens, self.done, self.total, self.at = 0, 0, 0, time.monotonic()
        self.expect, self.batches0 = 0, 0      # a client without callbacks: requests once the server prefills

    def from_server(self, server: Server) -> None:
        if self.expect and not self.total and server.watcher.prefill_batches > self.batches0:
            self.total, self.at = self.expect, time.monotonic()

    def __call__(self, d: dict[str, Any]) -> None:
        if d["output_tokens"] != self.tokens or d["done"] + d["failed"] != self.done or d["total"] != self.total:
            self.at = time.monotonic()
        self.tokens, self.done, self.total = d["output_tokens"], d["done"] + d["failed"], d["total"]


def _hang(server: Server, prog: _Progress, level: int, stalled_s: float) -> CrashInfo:
    return CrashInfo(cls="hang", signature="no_token_progress", phase="load", level=level,
                     exception_line=f"no token progress for {stalled_s:.1f} s with "
                                    f"{prog.total - prog.done} requests in flight",
                     message="requests in flight and no tokens streamed: the server hangs")


def open_load(server: Server, w: WorkloadSpec, rate: float | None) -> OpenLoad:
    """A rate level (at least `min_prompts` requests and `bench.min_level_s` of arrivals), or a trace replay."""
    b = server.prof.bench
    n = len(load_trace(w.path or "").requests) if w.kind == "trace" else \
        level_requests(rate or 0.0, w.min_prompts, b.min_level_s)
    return OpenLoad(None if w.kind == "trace" else rate, b.burstiness, b.max_concurrency, n)


def run_level(server: Server, w: WorkloadSpec, concurrency: int, load: OpenLoad | None = None) -> LevelResult:
    """A closed-loop level of `concurrency` streams, or with `load` an open-loop one (a rate or a trace)."""
    prof = server.prof
    server.level = concurrency
    n = load.num_prompts if load is not None else num_prompts(w, concurrency)
    abort = threading.Event()
    prog = _Progress()
    box: dict[str, Any] = {}

    impl = clients.get(w.client or prof.bench.client)
    if not impl.streams_progress:              # progress from the server's batches once it prefills
        prog.expect, prog.batches0 = n, server.watcher.prefill_batches

    def client() -> None:
        try:
            box["m"] = impl.run_open(target(server), w, load, progress=prog, abort=abort) if load is not None \
                else impl.run_level(target(server), w, concurrency, n, progress=prog, abort=abort)
        except Exception as e:  # noqa: BLE001 - the client's failure is evidence, not a crash of ours
            box["error"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=client, daemon=True, name=f"level-{concurrency}")
    wit = Witness.start(server.base_url, len(server.watcher.decode_rates),
                        bool(prof.server.flags.get("enable-metrics")))
    t0, epoch = time.monotonic(), _link_epoch(server)
    watts = power_sampler(server).start()      # GPU power during the level (power.py)
    th.start()
    crash = _watch(server, th, prog, abort, concurrency, t0)
    th.join(timeout=30)
    lv = _level_result(w, concurrency, box, crash, time.monotonic() - t0)
    power = watts.stop()
    if load is not None:
        lv.request_rate = load.rate if load.rate is not None else round(lv.metrics.get("request_rate", 0.0), 4)
        lv.speedup = w.speedup if w.kind == "trace" else None
    if lv.status == "ok" and load is None:   # an open-loop level's whole-run rate has idle gaps the server's lacks
        lv.witness = _witness(server, wit, lv, w, impl.name == "builtin")
    add_energy(server, lv, power)
    if _lost_to_link(server, lv, epoch):
        if server.crash is lv.crash:
            server.crash = None            # the hang verdict was the link's
        lv.status, lv.crash = "failed", CrashInfo(cls="infra", signature="link_lost", phase="load", level=concurrency,
                             message=f"the link to {server.runner.name} was re-dialled during the level: requests "
                                     "were lost to the link, not to the server")
    return lv


def _witness(server: Server, wit: Witness, lv: LevelResult, w: WorkloadSpec, builtin: bool) -> dict[str, Any]:
    """The server's own figures for the level, beside the client's (see witness.py)."""
    server.check()                           # read the log lines written up to now
    tokens = int(lv.metrics.get("total_output_tokens", 0)) + WARMUP_OUTPUT_LEN * w.warmup_requests \
        if builtin else None
    acc = accept_length(server.watcher.decode_accept[wit.lines0:])
    if acc is not None:                      # speculative decoding: the server's acceptance length in the level
        lv.metrics["spec_accept_length"] = round(acc, 3)
    return wit.finish(server.base_url, server.watcher.decode_rates, lv.metrics, tokens, lv.client_bound)


def target(server: Server) -> Target:
    """The server under test as a client sees it (its slice of the profile and the launch)."""
    prof, plan = server.prof, server.plan
    return Target(base_url=server.base_url, host_url=plan.url, runner=server.runner,
                  python=prof.server.python, out_dir=plan.trial_dir, backend=prof.bench.backend,
                  model=prof.model.served_name or prof.model.path, tokenizer=engine(prof).tokenizer(prof),
                  time_scale=time_scale(prof), request_timeout_s=prof.bench.request_timeout_s,
                  level_timeout_s=scaled(prof, prof.server.timeouts.level_s, slack=30.0),
                  precision=prof.bench.precision, min_level_s=prof.bench.min_level_s,
                  max_level_s=prof.bench.max_level_s, relayed=getattr(server.runner, "relays_in_process", False),
                  slo=dict(prof.objective.slo))


def _link_epoch(server: Server) -> int:
    """Runners with a network link (SSH) count re-dials; requests failing across one are not the server's."""
    return int(getattr(server.runner, "link_epoch", 0))


def _lost_to_link(server: Server, lv: LevelResult, epoch: int) -> bool:
    """A failed level, or a 'hang' (streams through a dropped port forward stop without an error), across a
    re-dial. The link is checked first (one round trip), so a drop not yet noticed is counted too."""
    hang = lv.crash is not None and lv.crash.cls == "hang"
    if lv.status != "failed" and not hang or not hasattr(server.runner, "link_epoch"):
        return False
    if _link_epoch(server) == epoch:
        try:
            server.runner.run(["true"], timeout=30)
        except Exception:  # noqa: BLE001 - a link that stays down is the runner's InfraError elsewhere
            pass
    return _link_epoch(server) != epoch


def _watch(server: Server, th: threading.Thread, prog: _Progress, abort: threading.Event, level: int,
           t0: float) -> CrashInfo | None:
    t = server.prof.server.timeouts
    hang_s = max(HANG_FLOOR_S, scaled(server.prof, t.hang_s, slack=0.0))
    level_deadline = t0 + scaled(server.prof, t.level_s, slack=30.0)
    pulse = Pulse(server.base_url, bool(server.prof.server.flags.get("enable-metrics")))
    while th.is_alive():
        crash = server.check()
        prog.from_server(server)
        now = time.monotonic()
        last = max(prog.at, server.watcher.last_progress_at or 0.0)
        if crash is None and prog.total and prog.done < prog.total and now - last > hang_s \
                and pulse.stuck(now, hang_s):
            crash = server.crash = _hang(server, prog, level, now - last)
        if crash is not None:
            abort.set()
            return crash
        if now > level_deadline:
            abort.set()
            return None
        th.join(POLL_S)
    return server.check()


def _level_result(w: WorkloadSpec, c: int, box: dict[str, Any], crash: CrashInfo | None,
                  wall: float) -> LevelResult:
    m = box.get("m")
    lv = LevelResult(concurrency=c, status="ok", workload=w.label, duration_s=round(wall, 3))
    if m is not None:
        lv.metrics, lv.completed, lv.failed_requests, lv.client_bound = (dict(m.metrics), m.completed, m.failed,
                                                                          m.client_bound)
        st = getattr(m, "steady", None)
        if st is not None:
            lv.output_throughput_ci95 = [round(st.interval.low, 2), round(st.interval.high, 2)]
            lv.samples, lv.batches = st.samples, st.interval.n
        lv.capped = bool(getattr(m, "capped", False))
    if crash is not None or m is None or not m.ok:          # the evidence of a level that did not pass
        lv.errors = ([box["error"]] if "error" in box else []) + (list(m.errors[:5]) if m is not None else [])
    if crash is not None:
        lv.status, lv.crash = "crashed", crash
    elif m is None or not m.ok:
        lv.status = "failed"
    return lv


def _saturated(prev: LevelResult | None, lv: LevelResult, share: float | None) -> bool:
    if share is None or prev is None or prev.output_throughput <= 0:
        return False
    return (lv.output_throughput - prev.output_throughput) / prev.output_throughput < share


def _steps(server: Server, w: WorkloadSpec, levels: list[int], rates: list[float]) -> list[tuple[int, OpenLoad | None]]:
    """A trace workload: one replay; else the rate levels when there are any, else the concurrency levels."""
    if w.kind == "trace":
        return [(0, open_load(server, w, None))]
    if rates:
        return [(server.prof.bench.max_concurrency or 0, open_load(server, w, r)) for r in rates]
    return [(c, None) for c in levels]


def level_start(w: WorkloadSpec, c: int, load: OpenLoad | None) -> dict[str, Any]:
    """The `level_start` event: what the level sends (progress lines)."""
    return {"workload": w.label, "concurrency": c, "num_prompts": load.num_prompts if load else num_prompts(w, c),
            "request_rate": load.rate if load else None, "trace": w.kind == "trace"}


def run_ladder(server: Server, levels: list[int], workloads: list[WorkloadSpec],
               on_level: Callable[[LevelResult], None] | None = None,
               on_event: Callable[[str, dict[str, Any]], None] | None = None,
               should_prune: Callable[[LevelResult], bool] | None = None, rates: list[float] | None = None) -> Ladder:
    """`rates` (or the profile's `bench.rates`): open-loop levels instead of the concurrency levels."""
    out = Ladder()
    rates = server.prof.bench.rates if rates is None else rates
    for w in workloads:
        prev = None
        for c, load in _steps(server, w, levels, rates):
            if on_event:
                on_event("level_start", level_start(w, c, load))
            lv = run_level(server, w, c, load)
            out.levels.append(lv)
            if on_level:
                on_level(lv)
            if lv.crash is not None:           # crashed, hung, or lost to the link (infra)
                out.crash = lv.crash
                return out
            if lv.status == "ok" and should_prune is not None and should_prune(lv):
                out.pruned = True
                return out
            if lv.status != "ok" or _saturated(prev, lv, server.prof.bench.saturation_stop):
                out.saturated.append(w.label)
                break
            prev = lv
    return out
