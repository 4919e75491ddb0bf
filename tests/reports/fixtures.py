"""Builds realistic result folders through StudyStore, the way the trial engine and the search write them:
a baseline, search trials (completed, crashed under load with the seeds' page_table_1_flattened exception,
a startup OOM, pruned), finalist reruns, best.json, and an Optuna study.db; plus a sweep and a running
study."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tunectl.models import CrashInfo, LaunchPlan, LevelResult, TrialResult
from tunectl.store import StudyStore

LEVELS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
PAGE_TABLE_LINE = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"
MODEL = "zai-org/GLM-5-NVFP4"
PATCH_HASH = "4bb28f790bd6ba2a85f5f13829ccd93b25ab96a66df5c9b48d81a4a79ae7247b"

# (trial, role, status, params, capacity tok/s, crash level or None, crash class)
SEARCH_PLAN: list[tuple[int, str, str, dict[str, Any], float, int | None, str | None]] = [
    (0, "baseline", "ok", {"disable-cuda-graph": False, "max-running-requests": 64,
                           "moe-runner-backend": "flashinfer_trtllm"}, 880.0, None, None),
    (1, "search", "ok", {"disable-cuda-graph": False, "max-running-requests": 256,
                         "moe-runner-backend": "flashinfer_trtllm"}, 1200.0, None, None),
    (2, "search", "crashed", {"disable-cuda-graph": True, "max-running-requests": 2048,
                              "moe-runner-backend": "flashinfer_cutlass"}, 2300.0, 512, "load_crash"),
    (3, "search", "ok", {"disable-cuda-graph": True, "max-running-requests": 1024,
                         "moe-runner-backend": "flashinfer_cutlass"}, 2100.0, None, None),
    (4, "search", "crashed", {"disable-cuda-graph": False, "max-running-requests": 2048,
                              "moe-runner-backend": "triton"}, 0.0, 0, "config_error"),
    (5, "search", "pruned", {"disable-cuda-graph": False, "max-running-requests": 64,
                             "moe-runner-backend": "triton"}, 400.0, None, None),
    (6, "search", "ok", {"disable-cuda-graph": True, "max-running-requests": 512,
                         "moe-runner-backend": "flashinfer_trtllm"}, 1600.0, None, None),
    (7, "search", "ok", {"disable-cuda-graph": False, "max-running-requests": 1024,
                         "moe-runner-backend": "flashinfer_cutlass"}, 1900.0, None, None),
    (8, "finalist", "ok", {"disable-cuda-graph": True, "max-running-requests": 1024,
                           "moe-runner-backend": "flashinfer_cutlass"}, 2150.0, None, None),
    (9, "finalist", "ok", {"disable-cuda-graph": True, "max-running-requests": 1024,
                           "moe-runner-backend": "flashinfer_cutlass"}, 2050.0, None, None),
    (10, "finalist", "ok", {"disable-cuda-graph": False, "max-running-requests": 1024,
                            "moe-runner-backend": "flashinfer_cutlass"}, 1850.0, None, None),
]
BEST_TRIAL = 3   # the search's pick: a search trial whose finalist reruns (8, 9) confirmed it


def level(c: int, cap: float, status: str = "ok") -> LevelResult:
    tp = cap * c / (c + 48.0)
    ttft = 40.0 * (1 + c / 32.0) * (1500.0 / max(cap, 1.0)) ** 0.5
    m = {"output_throughput": tp, "total_throughput": tp * 3, "request_throughput": tp / 128,
         "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 2.5, "median_tpot_ms": 8.0 + 60.0 * c / max(cap, 1.0),
         "p99_tpot_ms": 12.0 + 120.0 * c / max(cap, 1.0), "median_itl_ms": 8.0, "p99_itl_ms": 30.0}
    return LevelResult(concurrency=c, status=status, metrics=m if status == "ok" else {},
                       completed=max(16, 2 * c) if status == "ok" else 0, duration_s=30.0)


def config_for(params: dict[str, Any]) -> dict[str, Any]:
    base = {"model-path": MODEL, "tp": 8, "served-model-name": "glm 5 nvfp4", "max-running-requests": 64,
            "moe-runner-backend": "flashinfer_trtllm", "kv-cache-dtype": "fp8_e4m3", "host": "127.0.0.1",
            "port": 30000}
    return {**base, **{k: v for k, v in params.items() if v is not False}}


def argv_for(config: dict[str, Any]) -> list[str]:
    argv = ["python3", "-m", "sglang.launch_server"]
    for k, v in config.items():
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return argv + ["--json-model-override-args", '{"rope_scaling": {"factor": 2.0}}']


def make_trial(n: int, role: str, status: str, params: dict[str, Any], cap: float, crash_at: int | None,
               cls: str | None, attempt: int = 1) -> TrialResult:
    config = config_for(params)
    env = {"SGLANG_API_KEY": "s3cret", "NCCL_DEBUG": "WARN"}
    plan = LaunchPlan(argv=argv_for(config), config=config, env=env,
                      patches=["flashinfer-cutlass-autotune"] if "flashinfer_cutlass" in str(params) else [],
                      run_id=f"run-{n}", params=params)
    t = TrialResult(trial=n, status=status, params=params, launch=plan, role=role, attempt=attempt,
                    host="gpu-box-1", sglang_version="0.5.9", started_at=1000.0 + 100 * n,
                    finished_at=1090.0 + 100 * n, wall_s=90.0, ready_s=42.0,
                    patch_hashes={p: PATCH_HASH for p in plan.patches})
    if cls == "config_error":
        t.crash = CrashInfo(cls=cls, signature="cuda_oom_startup", phase="startup", exit_code=137,
                            exception_line="torch.OutOfMemoryError: CUDA out of memory. "
                                           "Tried to allocate 2.00 GiB")
        return t
    stop = 3 if status == "pruned" else len(LEVELS)
    for c in LEVELS[:stop]:
        if crash_at is not None and c >= crash_at:
            t.levels.append(level(c, cap, "crashed"))
            t.crash = CrashInfo(cls=cls or "load_crash", signature="page_table_1_flattened", phase="load",
                                level=c, exception_line=PAGE_TABLE_LINE, exit_code=137, detect_latency_s=0.4)
            break
        t.levels.append(level(c, cap))
    if status == "pruned":
        t.levels.append(LevelResult(concurrency=LEVELS[stop], status="pruned"))
    return t


def write_trial(store: StudyStore, t: TrialResult, level_files: bool = True) -> None:
    assert t.launch is not None
    store.write_launch(t.trial, t.launch, yaml.safe_dump(t.launch.config, sort_keys=False))
    if level_files:
        for lv in t.levels:
            store.write_level(t.trial, lv)
    log = "[2026-12-02 16:09:24] server_args=ServerArgs(api_key='s3cret', ...)\n"
    if t.crash is not None:
        log += ("[2026-12-02 16:12:01] Scheduler hit an exception: Traceback (most recent call last):\n"
                f"{t.crash.exception_line}\n")
    store.write_log(t.trial, log)
    store.write_trial(t)


def profile_dict(name: str) -> dict[str, Any]:
    return {"name": name, "model": {"path": MODEL}, "server": {"flags": {"tp": 8}},
            "reference": {"output_throughput": 5816.0, "note": "K2-Thinking reference run"}}


def build_search_study(root: Path, name: str = "glm5-search", with_db: bool = True) -> StudyStore:
    store = StudyStore(name, root)
    store.write_study({"kind": "search", "profile": profile_dict(name), "started_at": 1000.0})
    for n, role, status, params, cap, crash_at, cls in SEARCH_PLAN:
        write_trial(store, make_trial(n, role, status, params, cap, crash_at, cls, 2 if n == 9 else 1))
    write_best(store)
    if with_db:
        write_optuna_db(store)
    return store


def write_best(store: StudyStore) -> None:
    """best.json as tunectl.wiring.study.SearchOutcome.to_dict() writes it: the winner nested under "best"."""
    best = store.read_trial(BEST_TRIAL)
    assert best.launch is not None
    reruns = [t.best_output_throughput for t in store.trials()
              if t.role == "finalist" and t.params == best.params]
    store.write_best({"study": store.name, "trials": 7, "crashed": 2, "pruned": 1,
                      "best": {"trial": BEST_TRIAL, "params": best.params,
                               "value": best.best_output_throughput,
                               "confirmed_value": sum(reruns) / len(reruns), "metric": "output_throughput",
                               "argv": best.launch.argv, "config": best.launch.config, "env": best.launch.env,
                               "patches": best.launch.patches},
                      "finalists": [{"trial": BEST_TRIAL, "params": best.params}]})


def write_optuna_db(store: StudyStore) -> None:
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    dists = {"disable-cuda-graph": CategoricalDistribution([False, True]),
             "max-running-requests": IntDistribution(64, 2048, log=True),
             "moe-runner-backend": CategoricalDistribution(
                 ["flashinfer_trtllm", "flashinfer_cutlass", "triton"])}
    study = optuna.create_study(study_name=store.name, storage=f"sqlite:///{store.dir / 'study.db'}",
                                direction="maximize")
    for t in store.trials():
        if t.role == "search":
            states = optuna.trial.TrialState
            state = states.PRUNED if t.status == "pruned" else states.COMPLETE
            value = t.best_output_throughput if state == optuna.trial.TrialState.COMPLETE else None
            study.add_trial(optuna.trial.create_trial(params=t.params, distributions=dists, value=value,
                                                      state=state))


def build_sweep(root: Path, name: str = "sweep-1") -> StudyStore:
    store = StudyStore(name, root)
    store.write_study({"kind": "sweep", "profile": {"name": name, "model": {"path": MODEL}}})
    t = make_trial(0, "sweep", "ok", {}, 1950.0, None, None)
    for lv in t.levels:   # the metrics tunectl.wiring.virtual reports: no median, no TPOT
        lv.metrics = {k: lv.metrics[k] for k in ("output_throughput", "p99_ttft_ms")}
        lv.metrics["mean_ttft_ms"] = lv.metrics["p99_ttft_ms"] / 2
    write_trial(store, t)
    return store


def build_running(root: Path, name: str = "in-progress") -> StudyStore:
    """A study whose trial 1 is mid-ladder: trial.json knows 2 levels, levels/ already has 3."""
    store = StudyStore(name, root)
    store.write_study({"kind": "search", "profile": profile_dict(name)})
    write_trial(store, make_trial(0, "baseline", "ok", {}, 880.0, None, None))
    t = make_trial(1, "search", "running", {"disable-cuda-graph": True}, 2000.0, None, None)
    t.levels = t.levels[:3]
    write_trial(store, t)
    t.levels = t.levels[:2]
    store.write_trial(t)
    return store

