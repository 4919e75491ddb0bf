"""A virtual-clock trial: the stand-in's performance and crash model evaluated without processes.

`VirtualEvaluator(profile)` has the trial engine's call shape (n, params, role, should_prune) -> TrialResult, so a
whole search runs in seconds (bench/search_efficiency.py, search tests). Numbers are the model's, in modeled
units; the live stand-in runs the same model in scaled time.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunectl import knobs
from tunectl.models import LevelResult, TrialResult
from tunectl.profile import Profile


class VirtualEvaluator:
    def __init__(self, prof: Profile, seed: int = 0):
        from tunectl.sim.model import load_card

        self.prof, self.seed = prof, seed
        self.card = load_card(prof.server.sim.card)
        self.calls = 0

    def __call__(self, n: int, params: dict[str, Any], role: str,
                 should_prune: Callable[[LevelResult], bool] | None = None) -> TrialResult:
        from tunectl.sim.model import virtual_ladder

        self.calls += 1
        flags, env, patches = knobs.merge(self.prof, params)
        wl = self.prof.bench.workloads[0]
        lad = virtual_ladder(self.card, flags, env, patches, levels=self.prof.bench.levels, workload_kind=wl.kind,
                             input_len=wl.input_len, output_len=wl.output_len, seed=self.seed * 100003 + n,
                             prompts_per_level=wl.prompts_per_level, min_prompts=wl.min_prompts,
                             shared_prefix_len=wl.shared_prefix_len, range_ratio=wl.range_ratio)
        res = TrialResult(trial=n, status="ok", params=dict(params), role=role, host="virtual",
                          ready_s=lad.startup_s)
        watcher = read_log(lad)
        res.server_facts = dict(watcher.facts)
        if lad.startup_crash is not None:
            res.status, res.crash = "crashed", watcher.crash_info("startup", None, KILLED)
            return res
        for lv in lad.levels:
            if lv.output_throughput is None:
                res.crash = watcher.crash_info("load", lv.concurrency, KILLED)
                res.levels.append(LevelResult(lv.concurrency, "crashed", wl.label, crash=res.crash))
                res.status = "crashed"
                break
            out = LevelResult(lv.concurrency, "ok", wl.label, completed=lv.completed, duration_s=lv.duration_s,
                              metrics={"output_throughput": lv.output_throughput,
                                       "mean_ttft_ms": lv.mean_ttft_ms, "p99_ttft_ms": lv.p99_ttft_ms})
            res.levels.append(out)
            if should_prune is not None and should_prune(out):
                res.status = "pruned"
                break
        res.wall_s = lad.startup_s + sum(lv.duration_s for lv in res.levels)
        return res


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
    from tunectl.crashes.classifier import LogWatcher
    from tunectl.sim.transcript import transcript

    watcher = LogWatcher()
    watcher.feed(transcript(lad.setup, lad).encode(), 0.0)
    watcher.flush(0.0)
    return watcher
