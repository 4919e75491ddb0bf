"""One trial: plan -> patch -> launch -> ready -> ladder -> teardown, written through the StudyStore as it goes.

Stable entry point (the search calls exactly this):

    ctx = TrialContext(profile, runner, store, patcher=None)
    result = run_trial(ctx, n, params, role="sweep", on_event=None, should_prune=None)

- `params`: knob name (profile `search.space`) or SGLang flag name without dashes -> value.
- `patcher`: an object with `.ensure(patch_ids) -> {id: sha256}`, called before every launch of engine
  "sglang" (default: runners/checks/patches.Patcher on ctx.runner); for engine "sim" the patches travel as env
  TUNECTL_SIM_PATCHES.
- `on_event(kind, data)`: progress for the CLI. kinds: "plan", "launch", "milestone", "ready", "level_start",
  "level", "crash", "teardown", "done".
- `should_prune(level_result) -> bool`: asked after each stable level; True stops the ladder ("pruned").

Never raises for a failure of the server or the host: a crash is status "crashed" with its CrashInfo, a dirty host
or runner fault is status "infra". Every step is written to results/<study>/trials/<n>/ at once (trial.json,
launch.json, config.yaml, levels/*.json, server.log), so an interrupted run leaves readable results. Teardown
always runs once the server was started.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunectl.engines import engine
from tunectl.errors import TunectlError
from tunectl.models import CrashInfo, LevelResult, TrialResult
from tunectl.profile import Profile
from tunectl.runners.server import lifecycle
from tunectl.runners.server import plan as plan_mod
from tunectl.runners.server.ladder import run_ladder
from tunectl.store import StudyStore

Event = Callable[[str, dict[str, Any]], None]


@dataclass
class TrialContext:
    profile: Profile
    runner: Any                      # tunectl.runners.hosts.base.Runner
    store: StudyStore
    patcher: Any = None              # .ensure(patch_ids) -> {id: sha256}
    levels: list[int] | None = None  # overrides profile bench.levels (tunectl sweep --concurrency)
    rates: list[float] | None = None  # overrides profile bench.rates (tunectl sweep --request-rate; [] = none)
    capacity: bool = False           # the SLA capacity search instead of the ladder (goodput mode: always)


def _emit(on_event: Event | None, kind: str, **data: Any) -> None:
    if on_event is not None:
        on_event(kind, data)


def run_trial(ctx: TrialContext, n: int, params: dict[str, Any], role: str = "sweep",
              on_event: Event | None = None, should_prune: Callable[[LevelResult], bool] | None = None) -> TrialResult:
    prof, store = ctx.profile, ctx.store
    run_id = plan_mod.make_run_id(store.name, n)
    plan = plan_mod.build_plan(prof, params, run_id, f"{prof.host.workdir}/{run_id}")
    result = TrialResult(trial=n, status="running", params=dict(params), launch=plan, host=ctx.runner.name,
                         sglang_version=prof.server.sglang_version, started_at=time.time(), role=role)
    store.write_launch(n, plan, plan_mod.config_yaml(plan))
    store.write_trial(result)
    _emit(on_event, "plan", argv=plan.argv, patches=plan.patches, run_id=run_id)
    t0 = time.monotonic()
    try:
        _launch_and_measure(ctx, result, on_event, should_prune)
    except TunectlError as e:
        result.status = "infra"
        result.crash = CrashInfo(cls="infra", signature=type(e).__name__, phase="startup", message=str(e))
        _emit(on_event, "crash", crash=result.crash.to_dict())
    finally:
        if result.status == "running":      # stopped mid-trial (Ctrl-C, SIGTERM, given up): its server is down
            result.status = "interrupted"
        result.finished_at = time.time()
        result.wall_s = round(time.monotonic() - t0, 3)
        store.write_trial(result)
    _emit(on_event, "done", status=result.status, wall_s=result.wall_s)
    return result


def _stopped_by_us(crash: CrashInfo) -> bool:
    """A hang or a startup deadline (`timeout_<phase>`, `timeout_compile`) is tunectl's own stop: the exit code is
    teardown's kill, not the server's."""
    return crash.cls == "hang" or crash.signature.startswith("timeout_")


def _launch_and_measure(ctx: TrialContext, result: TrialResult, on_event: Event | None,
                        should_prune: Callable[[LevelResult], bool] | None) -> None:
    prof, runner, store, plan = ctx.profile, ctx.runner, ctx.store, result.launch
    assert plan is not None
    if engine(prof).patches_on_host:
        patcher = _patcher(ctx)
        result.patch_hashes = dict(patcher.ensure(plan.patches))  # also reverts patches not wanted now
        found = getattr(getattr(patcher, "last", None), "version", "")
        result.sglang_version = found or result.sglang_version   # what the host runs, not what the profile says
    lifecycle.preflight(runner, prof, plan)
    result.machine = lifecycle.machine(runner, prof)
    srv = lifecycle.launch(runner, prof, plan, plan_mod.config_yaml(plan))
    _emit(on_event, "launch", pgid=srv.handle.pgid, trial_dir=plan.trial_dir)
    try:
        _measure(ctx, srv, result, on_event, should_prune)
    finally:
        # a second Ctrl-C (or `timeout`'s second SIGINT, to the process group) waits until the server is down
        with lifecycle.signals_held():
            result.teardown = lifecycle.teardown(srv)
            _emit(on_event, "teardown", **result.teardown)
            if result.crash is not None and result.crash.exit_code is None and not _stopped_by_us(result.crash):
                result.crash.exit_code = result.teardown.get("exit_code")
            store.write_log(result.trial, srv.tail())
            if result.teardown.get("verdict") == "clean":      # its log is in results/: the host keeps nothing
                with contextlib.suppress(ValueError, TunectlError):
                    runner.remove_tree(plan.trial_dir)


def _patcher(ctx: TrialContext) -> Any:
    if ctx.patcher is None:
        from tunectl.runners.checks.patches import Patcher

        ctx.patcher = Patcher(ctx.runner, ctx.profile.server.python, ctx.profile.host.workdir)
    return ctx.patcher


def _crash_status(crash: CrashInfo | None) -> str:
    """A crash that is not the config's fault (port taken at bind time, ...) is an infra result."""
    return "infra" if crash is not None and crash.cls == "infra" else "crashed"


def _measure(ctx: TrialContext, srv: lifecycle.Server, result: TrialResult, on_event: Event | None,
             should_prune: Callable[[LevelResult], bool] | None) -> None:
    prof, store = ctx.profile, ctx.store
    startup = lifecycle.wait_ready(srv, on_event)
    result.startup_phases, result.ready_s = startup.phases, startup.ready_s
    result.server_facts = srv.watcher.facts           # the same dict: facts logged under load join it
    if not startup.ready:
        result.status, result.crash = _crash_status(startup.crash), startup.crash
        _emit(on_event, "crash", crash=startup.crash.to_dict() if startup.crash else None)
        return
    _emit(on_event, "ready", ready_s=startup.ready_s)
    store.write_trial(result)

    def on_level(lv: LevelResult) -> None:
        result.levels.append(lv)
        store.write_level(result.trial, lv)
        store.write_trial(result)
        store.write_log(result.trial, srv.tail())
        _emit(on_event, "level", level=lv.to_dict())

    if ctx.capacity or prof.objective.mode == "goodput":
        ladder = _capacity(srv, result, on_level, on_event)
    else:
        ladder = run_ladder(srv, ctx.levels or prof.bench.levels, prof.bench.workloads, on_level,
                            on_event, should_prune, rates=ctx.rates)
    if ladder.crash is not None:
        result.status, result.crash = _crash_status(ladder.crash), ladder.crash
        _emit(on_event, "crash", crash=ladder.crash.to_dict())
    else:
        result.status = "pruned" if ladder.pruned else "ok"


def _capacity(srv: lifecycle.Server, result: TrialResult, on_level: Callable[[LevelResult], None],
              on_event: Event | None) -> Any:
    from tunectl.goodput import capacity_record
    from tunectl.runners.server.capacity import run_capacity

    obj = srv.prof.objective
    ladder, br = run_capacity(srv, srv.prof.bench.workloads[0], on_level, on_event)
    result.capacity = capacity_record(br, obj.capacity.by, obj.capacity.tolerance, obj.slo, obj.slo_attainment)
    return ladder
