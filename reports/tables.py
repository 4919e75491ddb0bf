"""Report data, continued: crash map, finalists and reruns, the table of all trials."""
from __future__ import annotations

import statistics
from typing import Any

from tunectl.reports.data import (
    StudyData,
    baseline_trial,
    best_trial,
    capacity_text,
    fmt_params,
    launch_interval,
    objective,
    peak_level,
    winner_number,
)

from tunectl.energy import level_energy
from tunectl.models import TrialResult
from tunectl.profile import Profile
from tunectl.stats import machine_short, pooled, spread


def crash_map(trials: list[TrialResult]) -> dict[str, Any]:
    """One row per crashed trial (labelled by its knobs that differ from the baseline's), one mark per crash: at the
    level it crashed at, or at "startup" for a server that never served; the levels it passed first beside it.
    `levels` is the x axis in order ("startup" first); `crashes` keeps one row per crash with its exception line."""
    base = baseline_trial(trials)
    rows, crashes = [], []
    for t in sorted(trials, key=lambda t: t.trial):
        if t.crash is None:
            continue
        c = t.crash
        at = "startup" if c.phase == "startup" or t.crashed_level is None else str(t.crashed_level)
        label = fmt_params(key_flags(t, base)) or "(baseline flags)"
        rows.append({"trial": t.trial, "label": f"#{t.trial} {_clip(label)}", "class": c.cls,
                     "signature": c.signature, "at": at, "exception_line": c.exception_line,
                     "passed": sorted({lv.concurrency for lv in t.stable_levels}), "params": dict(t.params)})
        crashes.append({"trial": t.trial, "class": c.cls, "signature": c.signature, "phase": c.phase,
                        "level": t.crashed_level, "exception_line": c.exception_line, "params": dict(t.params)})
    numbers = sorted({int(r["at"]) for r in rows if r["at"] != "startup"} | {lv for r in rows for lv in r["passed"]})
    levels = (["startup"] if any(r["at"] == "startup" for r in rows) else []) + [str(n) for n in numbers]
    return {"rows": rows, "levels": levels, "crashes": crashes}


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _pkey(params: dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def finalists(trials: list[TrialResult], picks: list[dict[str, Any]] | None = None,
              prof: Profile | None = None) -> list[dict[str, Any]]:
    """Finalist configs with their runs (the search run, then the reruns): per config each run's value, their
    mean, range, 95% interval over the launches (`tunectl.stats.pooled`) and spread. The value is the study's
    objective (`objective`: a capacity, an SLO-bound level, a weighted sum; the peak throughput without a
    profile), the number the race ranked by, so a run, the mean and the spread read in one unit. `picks` is
    best.json's "finalists" (trial + params of each pick); without it the pick is the first other trial
    (baseline or search) with the same params. The keys keep their `output_throughput` names."""
    groups: dict[str, dict[str, Any]] = {}

    def run(t: TrialResult) -> dict[str, Any]:
        return {"trial": t.trial, "attempt": t.attempt, "status": t.status,
                "output_throughput": objective(t, prof).value if t.status == "ok" else t.best_output_throughput,
                "max_stable_concurrency": t.max_stable_concurrency}

    for t in sorted(trials, key=lambda t: t.trial):
        if t.role == "finalist":
            g = groups.setdefault(_pkey(t.params), {"params": dict(t.params), "runs": []})
            g["runs"].append(run(t))
    origin = {_pkey(p.get("params") or {}): p.get("trial") for p in picks or [] if isinstance(p, dict)}
    raced = {p.get("trial"): p for p in picks or [] if isinstance(p, dict)}
    for t in sorted(trials, key=lambda t: t.trial):
        if t.role != "finalist":
            origin.setdefault(_pkey(t.params), t.trial)
    by_num = {t.trial: t for t in trials}
    out = []
    for key, g in groups.items():
        first = by_num.get(origin.get(key))      # the search run counts too: the mean is winner_number()'s
        if first is not None:
            g["runs"].insert(0, run(first))
        tps = [r["output_throughput"] for r in g["runs"] if r["status"] == "ok"]
        ok = [by_num[r["trial"]] for r in g["runs"] if r["status"] == "ok" and r["trial"] in by_num]
        both = pooled([launch_interval(t, prof) for t in ok]) if ok else None
        out.append({**g, "search_trial": origin.get(key), "ok_runs": len(tps),
                    "ci95": [both.low, both.high] if both else None,
                    "launch_spread": spread(tps) if len(tps) > 1 else None,
                    "mean_output_throughput": statistics.fmean(tps) if tps else 0.0,
                    "min_output_throughput": min(tps, default=0.0),
                    "max_output_throughput": max(tps, default=0.0), "verdict": ""})
        _raced(out[-1], raced.get(origin.get(key)))
    return sorted(out, key=lambda g: -g.get("estimate", g["mean_output_throughput"]))


def _raced(group: dict[str, Any], v: dict[str, Any] | None) -> None:
    """The race's own numbers for a finalist (best.json, from the study's storage): its mean objective value over
    the launches it was confirmed on and their 95% interval, the same numbers the search printed."""
    if not v or v.get("score") is None:
        return
    group.update({"mean_output_throughput": v["score"], "ci95": v.get("ci95") or group["ci95"],
                  "verdict": v.get("reason", "")})
    if v.get("estimate") and abs(v["estimate"] - v["score"]) > 1e-9 * max(1.0, abs(v["score"])):
        group["estimate"] = v["estimate"]      # pooled with the other configs (search.pool): the race's ranking


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


def confirmed_values(data: StudyData) -> dict[str, float]:
    """Config -> the race's value for every config it confirmed (two or more launches, best.json's finalists), and
    the winner's one number (winner_number: the same value) for the winner's config."""
    out = {_pkey(v.get("params") or {}): float(v["score"]) for v in (data.best or {}).get("finalists") or []
           if isinstance(v, dict) and v.get("survived") and v.get("score") is not None}
    number, best = winner_number(data), best_trial(data)
    if number and best is not None and number.get("n", 1) > 1:
        out[_pkey(best.params)] = number["value"]
    return out


# a trial's energy and cost at its peak level (tunectl/energy.py): row key -> level metric
PER_TOKEN_COLUMNS = {"w_per_gpu": "gpu_power_w", "j_per_token": "joules_per_output_token",
                     "usd_per_mtok": "usd_per_million_output_tokens"}


def trial_rows(data: StudyData, log_prefix: str = "") -> list[dict[str, Any]]:
    """One row per trial: status, key flags, throughput (this launch's), the config's confirmed value where the
    finalists' race re-ran it (the mean over its launches: the winner's one number on each of its runs), max stable
    concurrency, the machine it ran on (its GPUs' id, "not recorded"; "" for a trial that measured nothing), crash,
    log link."""
    rows = []
    base = baseline_trial(data.trials)
    confirmed = confirmed_values(data)
    for t in sorted(data.trials, key=lambda t: t.trial):
        peak = peak_level(t)
        rows.append({
            "trial": t.trial, "role": t.role, "status": t.status, "attempt": t.attempt,
            "confirmed": confirmed.get(_pkey(t.params)),
            "params": dict(t.params), "key_flags": key_flags(t, base),
            "output_throughput": t.best_output_throughput,
            "capacity": capacity_text(t.capacity),
            "per_workload": per_workload(t),
            "peak_concurrency": peak.concurrency if peak else None,
            "p99_ttft_ms": peak.metrics.get("p99_ttft_ms") if peak else None,
            "accept_len": peak.metrics.get("spec_accept_length") if peak else None,     # speculative decoding
            **{k: level_energy(peak).get(m) for k, m in PER_TOKEN_COLUMNS.items()},   # energy and cost at the peak
            "max_stable_concurrency": t.max_stable_concurrency,
            "machine": machine_short(t.machine or "") if t.levels or t.crash else "",
            "crash_class": t.crash.cls if t.crash else None,
            "crash_signature": t.crash.signature if t.crash else None,
            "crashed_at": t.crashed_level,
            "exception_line": t.crash.exception_line if t.crash else "",
            "levels_done": len(t.levels), "wall_s": t.wall_s,
            "log": f"{log_prefix}trials/{t.trial}/server.log"})
    return rows


def several_machines(rows: list[dict[str, Any]]) -> bool:
    """Whether the trials that measured something ran on more than one machine: then the tables name each one's
    (two H100s of one model read one config up to 20% apart: docs/real-gpu.md)."""
    return len({r["machine"] for r in rows if r["machine"]}) > 1


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
