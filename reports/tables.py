"""Report data, continued: crash map, finalists and reruns, the table of all trials."""
from __future__ import annotations

import statistics
from typing import Any

from tunectl.reports.data import StudyData, baseline_trial, capacity_text, fmt_value, launch_interval, peak_level

from tunectl.models import TrialResult
from tunectl.stats import pooled, spread


def crash_map(trials: list[TrialResult]) -> dict[str, Any]:
    """Which parameter values crashed at which levels, by class. One cell per (param, value, level):
    how many trials passed it and how many crashed there; plus one row per crash with its exception line."""
    cells: dict[tuple[str, str, int], dict[str, Any]] = {}
    crashes = []
    for t in trials:
        crash_lv = t.crashed_level
        for lv in t.levels:
            if lv.status not in ("ok", "crashed") and lv.concurrency != crash_lv:
                continue
            for name, value in t.params.items():
                key = (name, fmt_value(value), lv.concurrency)
                c = cells.setdefault(key, {"param": name, "value": key[1], "level": lv.concurrency,
                                           "ok": 0, "crashed": {}, "exception_lines": []})
                if lv.status == "ok":
                    c["ok"] += 1
                elif t.crash is not None:
                    c["crashed"][t.crash.cls] = c["crashed"].get(t.crash.cls, 0) + 1
                    if t.crash.exception_line and t.crash.exception_line not in c["exception_lines"]:
                        c["exception_lines"].append(t.crash.exception_line)
        if t.crash is not None:
            crashes.append({"trial": t.trial, "class": t.crash.cls, "signature": t.crash.signature,
                            "phase": t.crash.phase, "level": crash_lv,
                            "exception_line": t.crash.exception_line, "params": dict(t.params)})
    return {"cells": sorted(cells.values(), key=lambda c: (c["param"], c["value"], c["level"])),
            "crashes": crashes}


def _pkey(params: dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def finalists(trials: list[TrialResult], picks: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Finalist configs with their runs (the search run, then the reruns): per config the throughput of each run,
    their mean, range, 95% interval over the launches (`tunectl.stats.pooled`) and spread. `picks` is
    best.json's "finalists" (trial + params of each pick); without it the pick is the first other trial
    (baseline or search) with the same params."""
    groups: dict[str, dict[str, Any]] = {}
    for t in sorted(trials, key=lambda t: t.trial):
        if t.role == "finalist":
            g = groups.setdefault(_pkey(t.params), {"params": dict(t.params), "runs": []})
            g["runs"].append({"trial": t.trial, "attempt": t.attempt, "status": t.status,
                              "output_throughput": t.best_output_throughput,
                              "max_stable_concurrency": t.max_stable_concurrency})
    origin = {_pkey(p.get("params") or {}): p.get("trial") for p in picks or [] if isinstance(p, dict)}
    for t in sorted(trials, key=lambda t: t.trial):
        if t.role != "finalist":
            origin.setdefault(_pkey(t.params), t.trial)
    by_num = {t.trial: t for t in trials}
    out = []
    for key, g in groups.items():
        first = by_num.get(origin.get(key))      # the search run counts too: the mean is winner_number()'s
        if first is not None:
            g["runs"].insert(0, {"trial": first.trial, "attempt": first.attempt, "status": first.status,
                                 "output_throughput": first.best_output_throughput,
                                 "max_stable_concurrency": first.max_stable_concurrency})
        tps = [r["output_throughput"] for r in g["runs"] if r["status"] == "ok"]
        ok = [by_num[r["trial"]] for r in g["runs"] if r["status"] == "ok" and r["trial"] in by_num]
        both = pooled([launch_interval(t) for t in ok]) if ok else None
        out.append({**g, "search_trial": origin.get(key), "ok_runs": len(tps),
                    "ci95": [both.low, both.high] if both else None,
                    "launch_spread": spread(tps) if len(tps) > 1 else None,
                    "mean_output_throughput": statistics.fmean(tps) if tps else 0.0,
                    "min_output_throughput": min(tps, default=0.0),
                    "max_output_throughput": max(tps, default=0.0)})
    return sorted(out, key=lambda g: -g["mean_output_throughput"])


def key_flags(t: TrialResult, base: TrialResult | None) -> dict[str, Any]:
    """The knobs where a trial differs from the baseline (all of them when there is no baseline)."""
    if base is None or t is base:
        return dict(t.params)
    return {k: v for k, v in t.params.items() if k not in base.params or base.params[k] != v}


def per_workload(t: Any) -> dict[str, float]:
    """Each workload's best stable output throughput (0 for a workload without a stable level), in ladder order."""
    out = dict.fromkeys((lv.workload for lv in t.levels), 0.0)
    for lv in t.stable_levels:
        out[lv.workload] = max(out[lv.workload], lv.output_throughput)
    return out


def workload_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The workloads to show a column for: all of them when a study has several, none when it has one."""
    labels = list(dict.fromkeys(k for r in rows for k in r.get("per_workload", {})))
    return labels if len(labels) > 1 else []


def trial_rows(data: StudyData, log_prefix: str = "") -> list[dict[str, Any]]:
    """One row per trial: status, key flags, throughput, max stable concurrency, crash, log link."""
    rows = []
    base = baseline_trial(data.trials)
    for t in sorted(data.trials, key=lambda t: t.trial):
        peak = peak_level(t)
        rows.append({
            "trial": t.trial, "role": t.role, "status": t.status, "attempt": t.attempt,
            "params": dict(t.params), "key_flags": key_flags(t, base),
            "output_throughput": t.best_output_throughput,
            "capacity": capacity_text(t.capacity),
            "per_workload": per_workload(t),
            "peak_concurrency": peak.concurrency if peak else None,
            "p99_ttft_ms": peak.metrics.get("p99_ttft_ms") if peak else None,
            "max_stable_concurrency": t.max_stable_concurrency,
            "crash_class": t.crash.cls if t.crash else None,
            "crash_signature": t.crash.signature if t.crash else None,
            "crashed_at": t.crashed_level,
            "exception_line": t.crash.exception_line if t.crash else "",
            "levels_done": len(t.levels), "wall_s": t.wall_s,
            "log": f"{log_prefix}trials/{t.trial}/server.log"})
    return rows


def warm_lines(w: dict[str, Any]) -> list[str]:
    """'old best on new version: X (was Y)' and the flags that changed meaning."""
    was = f"{w['old_best_was']:,.0f} tok/s on SGLang {w['sglang_version']}" if w.get("old_best_was") else "?"
    now = (f"{w['old_best_now']:,.0f} tok/s" if w.get("old_best_now") is not None
           else str(w.get("old_best_status") or "not run"))
    trial = f" (trial {w['old_best_trial']})" if w.get("old_best_trial") is not None else ""
    out = [f"warm start from {w['from']}: old best on new version: {now}{trial} (was {was}); {w['prior']} old "
           f"trials as prior knowledge, values x{w.get('scale', 1):.2f}"]
    out += [f"  changed meaning: {c}" for c in w.get("changed_meaning") or []]
    return out
