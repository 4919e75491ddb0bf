"""A virtual-clock trial: the stand-in's performance and crash model evaluated without processes.

`VirtualEvaluator(profile)` has the trial engine's call shape (n, params, role, should_prune) -> TrialResult, so a
whole search runs in seconds (bench/search_efficiency.py, search tests). Numbers are the model's, in modeled
units; the live stand-in runs the same model in scaled time.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tunectl import knobs
from tunectl.energy import energy_metrics
from tunectl.engines import engine
from tunectl.models import CrashInfo, LevelResult, TrialResult
from tunectl.profile import Profile, WorkloadSpec
from tunectl.workloads import DATASETS


class VirtualEvaluator:
    def __init__(self, prof: Profile, seed: int = 0, noise: float | None = None):
        from tunectl.sim.model import load_card

        self.prof, self.seed = prof, seed
        self.card = load_card(prof.server.sim.card)
        self.noise = prof.server.sim.noise if noise is None else noise     # 0: the true (noise-free) value
        self.calls = 0
        self.label_machines = False       # each machine state recorded as its own machine (bench: --label-machines)

    def __call__(self, n: int, params: dict[str, Any], role: str,
                 should_prune: Callable[[LevelResult], bool] | None = None) -> TrialResult:
        from tunectl.sim.model import virtual_ladder

        self.calls += 1
        flags, env, patches = knobs.merge(self.prof, params)
        if self.prof.objective.mode == "goodput":
            return self.capacity(n, params, role, flags, env, patches)
        res = TrialResult(trial=n, status="ok", params=dict(params), role=role, host="virtual")
        for wl in self.prof.bench.workloads:
            lad = virtual_ladder(self.card, flags, env, patches, levels=self.prof.bench.levels,
                                 seed=self.seed * 100003 + n, noise=self.noise, machine=(self.seed, n),
                                 sglang_version=self.prof.server.sglang_version or "0.5.9", **self._workload(wl))
            if not self._add(res, lad, wl.label, should_prune):
                break
        res.wall_s = res.ready_s + sum(lv.duration_s for lv in res.levels)
        res.machine = self._machine(n)
        return res

    def _machine(self, n: int) -> str:
        """The trial's machine: "" (the stand-in uses no GPU), or with `label_machines` the machine state it ran in
        as a machine of its own, as a study resumed on other GPUs records them (search/race.py `machine_terms`)."""
        noise = self.card.noise
        if not self.label_machines or not self.noise or noise.machine <= 0:
            return ""
        from tunectl.sim.noise import machine_start

        return f"sim machine {machine_start(self.seed, n, noise.machine_launches)}"

    def _workload(self, wl: WorkloadSpec) -> dict[str, Any]:
        """The ladder's requests: the workload's lengths, turns and (a dataset's) token ids."""
        kw: dict[str, Any] = {"workload_kind": wl.kind, "input_len": wl.input_len, "output_len": wl.output_len,
                              "prompts_per_level": wl.prompts_per_level, "min_prompts": wl.min_prompts,
                              "shared_prefix_len": wl.shared_prefix_len, "range_ratio": wl.range_ratio,
                              "turns": wl.turns}
        if wl.kind == "scenarios":
            kw["draw"] = next(iter(wl.scenarios.values())).draw
        if wl.kind in DATASETS:
            from tunectl.runners.clients.datasets import tokenized
            from tunectl.runners.clients.prompts import make_prompts

            convs = tokenized(wl, engine(self.prof).tokenizer(self.prof))
            kw["conversations"] = lambda c, num: [[(p.ids, p.output_len) for p in head.turns()]
                                                  for head in make_prompts(wl, num, c, convs)]
        return kw

    def _add(self, res: TrialResult, lad: Any, label: str,
             should_prune: Callable[[LevelResult], bool] | None) -> bool:
        """The ladder's levels into the trial; False when the trial ends here (a crash or a prune)."""
        watcher = read_log(lad)
        if not res.levels:
            res.ready_s, res.server_facts = lad.startup_s, dict(watcher.facts)
        if lad.startup_crash is not None:
            res.status, res.crash = "crashed", watcher.crash_info("startup", None, KILLED)
            return False
        for lv in lad.levels:
            if lv.output_throughput is None:
                res.crash = watcher.crash_info("load", lv.concurrency, KILLED)
                res.levels.append(LevelResult(lv.concurrency, "crashed", label, crash=res.crash))
                res.status = "crashed"
                return False
            out = LevelResult(lv.concurrency, "ok", label, completed=lv.completed, duration_s=lv.duration_s,
                              metrics={"output_throughput": lv.output_throughput,
                                       "mean_ttft_ms": lv.mean_ttft_ms, "p99_ttft_ms": lv.p99_ttft_ms})
            if lv.spec_accept_length is not None:
                out.metrics["spec_accept_length"] = round(lv.spec_accept_length, 3)
            cost = self.prof.cost
            out.metrics.update(energy_metrics(lv.output_throughput, lad.setup.card.gpu.count if lad.setup else 1,
                                              lv.gpu_power_w, cost.gpu_hour_usd if cost else None))
            res.levels.append(out)
            if should_prune is not None and should_prune(out):
                res.status = "pruned"
                return False
        return True


    def capacity(self, n: int, params: dict[str, Any], role: str, flags: dict[str, Any], env: dict[str, str],
                 patches: list[str]) -> TrialResult:
        """Goodput mode: the bracketing search of the live trial (runners/server/capacity.py) on the model, one
        scheduler for all probes as on one launch; the same arrivals and prompts as the live client sends."""
        from tunectl.goodput import bracket, capacity_record
        from tunectl.sim.model import virtual_ladder
        from tunectl.sim.sched import Scheduler

        if self.prof.objective.capacity.by != "rate":
            from tunectl.errors import UsageError

            raise UsageError("objective.capacity.by: 'concurrency' is searched on live launches only; the virtual "
                             "model brackets request rates (by: rate)")
        lad = virtual_ladder(self.card, flags, env, patches, levels=[],
                             sglang_version=self.prof.server.sglang_version or "0.5.9")
        res = TrialResult(trial=n, status="ok", params=dict(params), role=role, host="virtual",
                          ready_s=lad.startup_s)
        if lad.startup_crash is not None:
            res.status, res.crash = "crashed", read_log(lad).crash_info("startup", None, KILLED)
            return res
        sched, cap = Scheduler(lad.setup, self.seed * 100003 + n, self.noise,
                                machine=(self.seed, n)), self.prof.objective.capacity
        obj = self.prof.objective
        br = bracket(lambda load: virtual_probe(self.prof, sched, load, res), cap.start, cap.tolerance,
                     cap.max_probes)
        res.capacity = capacity_record(br, "rate", cap.tolerance, obj.slo, obj.slo_attainment)
        res.wall_s = res.ready_s + sum(lv.duration_s for lv in res.levels)
        res.machine = self._machine(n)
        return res


def virtual_probe(prof: Profile, sched: Any, rate: float, res: TrialResult) -> Any:
    """One open-loop level at `rate` on the model: its LevelResult joins `res`; a crash ends the search."""
    from tunectl.goodput import Probe, arrival_times, attainment_metrics, level_requests, meets
    from tunectl.runners.clients.prompts import make_prompts
    from tunectl.sim.openloop import open_level

    w, b, obj = prof.bench.workloads[0], prof.bench, prof.objective
    prompts = make_prompts(w, level_requests(rate, w.min_prompts, b.min_level_s), salt=int(rate * 1000))
    offsets = arrival_times(len(prompts), rate, b.burstiness, seed=w.seed)
    o = open_level(sched, [(t, p.input_len, p.output_len) for t, p in zip(offsets, prompts)], b.max_concurrency)
    if o.crash is not None:
        res.status = "crashed"
        res.crash = CrashInfo(cls="load_crash", signature=o.crash.signature, phase="load", level=0,
                              exception_line=o.crash.exception)
        res.levels.append(LevelResult(0, "crashed", w.label, crash=res.crash, request_rate=rate))
        return Probe(rate, False, 0.0, stop="crash")
    tpot = [(e - t) / max(1, k - 1) for t, e, k in zip(o.ttft_s, o.e2e_s, o.output_len)]
    met = sum(meets(t * 1000, p * 1000, e * 1000, p * 1000, obj.slo) for t, p, e in zip(o.ttft_s, tpot, o.e2e_s))
    ttft = sorted(o.ttft_s)
    metrics = {"request_rate": rate, "completed": len(ttft), "duration": o.duration_s,
               "output_throughput": sum(o.output_len) / max(o.duration_s, 1e-9),
               "p99_ttft_ms": 1000 * float(np.percentile(ttft, 99)) if ttft else 0.0,
               **attainment_metrics(met, len(prompts), o.duration_s)}
    res.levels.append(LevelResult(0, "ok", w.label, metrics=metrics, completed=len(ttft),
                                  duration_s=o.duration_s, request_rate=rate))
    return Probe(rate, metrics["slo_attainment"] >= obj.slo_attainment, metrics["slo_attainment"])


def recorded(evaluate: Callable[..., TrialResult], prof: Profile, store: Any) -> Callable[..., TrialResult]:
    """`evaluate` with each trial written as the trial engine writes a real one (launch.json, config.yaml,
    levels/, trial.json), so `tunectl best`, `trials`, `report` and `export` read a virtual study too."""
    from tunectl.runners.server import plan as plan_mod

    def run(n: int, params: dict[str, Any], role: str,
            should_prune: Callable[[LevelResult], bool] | None = None) -> TrialResult:
        plan = plan_mod.build_plan(prof, params, f"virtual-t{n}", f"{prof.host.workdir}/virtual-t{n}")
        store.write_launch(n, plan, plan_mod.config_yaml(plan))
        res = evaluate(n, params, role, should_prune)
        res.launch = plan
        for lv in res.levels:
            store.write_level(n, lv)
        store.write_trial(res)
        return res

    return run


KILLED = 137          # the stand-in SIGKILLs itself after a crash, like SGLang's kill_process_tree


def read_log(lad: Any) -> Any:
    """The stand-in's log for this virtual run (sim/transcript.py), read by the live path's log watcher: the same
    crash signatures, exception lines and facts (pool size, free memory, retractions) as a live trial."""
    from tunectl.sglang.crashes.classifier import LogWatcher
    from tunectl.sim.transcript import transcript

    return LogWatcher.read(transcript(lad.setup, lad))
