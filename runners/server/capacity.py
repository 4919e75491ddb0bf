"""SLA capacity on one launch: the highest load at which the objective's SLO holds for its share of requests.

`run_capacity(server, workload, on_level=None, on_event=None) -> (Ladder, Bracket)`: `tunectl.goodput.bracket`
over open-loop request rates (`objective.capacity.by: rate`) or closed-loop concurrency levels (`by:
concurrency`), each probe one level of the ladder (`ladder.run_level`), passed when its `slo_attainment` is at
least `objective.slo_attainment`. A crash ends the search (the ladder carries it); a level that failed requests
fails its probe (a failed request never meets the SLO).

The client must send the load it is asked for. A probe that failed while the client sent late (client_bound:
late requests bunch into bursts the load does not have), or whose p99 lateness exceeds `tolerance` x the level's
span of arrivals (the client could not keep the rate), is run again, at most `LATE_RETRIES` times; if it still
did, the search stops there (`stopped: client_bound`): the capacity is at least the last pass, and this host's
client cannot tell more. Every run is a level of the ladder, and `Bracket.runs` lists each one (load, passed,
attainment, "late" when the client did not send it on schedule): a probe that passed on its third run after two
late failures shows all three.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunectl.goodput import Bracket, Probe, bracket
from tunectl.models import LevelResult
from tunectl.profile import WorkloadSpec
from tunectl.runners.server.ladder import Ladder, level_start, open_load, run_level
from tunectl.runners.server.lifecycle import Server


LATE_RETRIES = 2


def run_capacity(server: Server, w: WorkloadSpec, on_level: Callable[[LevelResult], None] | None = None,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> tuple[Ladder, Bracket]:
    obj = server.prof.objective
    cap, by = obj.capacity, obj.capacity.by
    out = Ladder()
    runs: list[list[Any]] = []                    # every run of every probe, reruns and the last included

    def probe(load: float) -> Probe | None:
        c = int(load) if by == "concurrency" else server.prof.bench.max_concurrency or 0
        ol = open_load(server, w, load) if by == "rate" else None
        passed, got, late = False, 0.0, False
        for _ in range(1 + LATE_RETRIES):
            if on_event:
                on_event("level_start", level_start(w, c, ol))
            lv = run_level(server, w, c, ol)
            out.levels.append(lv)
            if on_level:
                on_level(lv)
            if lv.crash is not None:
                out.crash = lv.crash
                runs.append([load, False, 0.0, "crash"])
                return Probe(load, False, 0.0, stop="crash")
            got = float(lv.metrics.get("slo_attainment", 0.0))
            passed = lv.status == "ok" and got >= obj.slo_attainment
            late = _undelivered(lv, cap.tolerance) or (lv.client_bound and not passed)
            runs.append([load, passed, round(got, 4), "late" if late else ""])
            if not late:
                break
        return Probe(load, passed, got, stop="client_bound" if late else "")

    br = bracket(probe, cap.start, cap.tolerance, cap.max_probes, integer=by == "concurrency")
    br.runs = runs
    return out, br


def _undelivered(lv: LevelResult, tolerance: float) -> bool:
    """The client's p99 lateness is more than `tolerance` of the level's arrival span: the rate was not sent."""
    rate, n = lv.request_rate, lv.completed + lv.failed_requests
    if not rate or n < 2:
        return False
    return lv.metrics.get("p99_lateness_ms", 0.0) / 1000 > tolerance * (n - 1) / rate
