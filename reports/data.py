"""Report data: pure functions from a study's results to plain dicts. Rendering lives in figures.py/render.py.

Everything here reads; nothing runs. Metric names are SGLang's (output_throughput, p99_ttft_ms, ...).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunectl import knobs, redact
from tunectl.errors import TunectlError
from tunectl.models import LevelResult, TrialResult
from tunectl.objective import score
from tunectl.profile import Profile
from tunectl.stats import Interval, compare, gain, machine_words, pooled, spread
from tunectl.store import StudyStore, read_json
from tunectl.reports.command import STAND_IN_ENV, reproduce, user_env  # noqa: F401  (re-exported)

FINISHED = ("ok", "crashed", "pruned")
LATENCY_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
CURVE_KEYS = tuple(f"{stat}_{m}_ms" for m in ("ttft", "tpot") for stat in ("mean", "median", "p90", "p99"))


@dataclass
class StudyData:
    name: str
    study: dict[str, Any]
    trials: list[TrialResult]
    best: dict[str, Any] | None
    launches: dict[int, dict[str, Any]] = field(default_factory=dict)  # trial -> launch.json
    reference: dict[str, Any] | None = None        # {"output_throughput", "concurrency", "note", "label"}
    study_db: Path | None = None


def _merge_level_files(store: StudyStore, t: TrialResult) -> None:
    """A running trial's trial.json may lag its levels/*.json: take the level files it does not know yet."""
    ldir = store.trial_dir(t.trial) / "levels"
    if not ldir.is_dir():
        return
    known = {(lv.workload, lv.concurrency) for lv in t.levels}
    for p in sorted(ldir.glob("*.json")):
        try:
            lv = LevelResult.from_dict(read_json(p))
        except (ValueError, OSError, TypeError):
            continue
        if (lv.workload, lv.concurrency) not in known:
            t.levels.append(lv)
    t.levels.sort(key=lambda lv: (lv.workload, lv.concurrency))


def load_study(store: StudyStore, reference: dict[str, Any] | None = None) -> StudyData:
    trials = store.trials()
    launches = {}
    for t in trials:
        _merge_level_files(store, t)
        if (plan := store.launch(t)) is not None:
            launches[t.trial] = plan
    study = store.read_study()
    ref = reference or _profile_reference(study)
    db = store.dir / "study.db"
    return StudyData(store.name, study, trials, store.read_best(), launches, ref, db if db.exists() else None)


def _profile_reference(study: dict[str, Any]) -> dict[str, Any] | None:
    prof = study.get("profile") or {}
    ref = prof.get("reference") if isinstance(prof, dict) else None
    if not ref:
        return None
    return {**ref, "label": ref.get("note") or f"reference ({prof.get('name', 'profile')})"}


def fmt_value(v: Any) -> str:
    """A knob's value for people: 0.84 not 0.8400000000000001, true/false like YAML."""
    if isinstance(v, float):
        return f"{v:.6g}"
    return "true" if v is True else "false" if v is False else str(v)


def fmt_cell(v: Any) -> str:
    """Throughputs and latencies with one decimal; knob values (0.88) as set, without float noise."""
    if isinstance(v, float) and abs(v) >= 100:
        return f"{v:,.1f}"
    return fmt_value(v)


def fmt_reading(v: float) -> str:
    """A run's objective value in a table: whole numbers for throughputs (2,483), three digits for small values
    such as a capacity in req/s (11.2)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def fmt_params(params: dict[str, Any], sep: str = " ") -> str:
    return sep.join(f"{k}={fmt_value(v)}" for k, v in params.items())


# ------------------------------------------------------------------------------------------ best & peaks

def peak_level(t: TrialResult) -> LevelResult | None:
    """The stable level with the highest output throughput."""
    return max(t.stable_levels, key=lambda lv: lv.output_throughput, default=None)


def study_profile(data: StudyData) -> Profile | None:
    """The profile the study ran with (study.json), or None where it is missing or no longer valid."""
    try:
        return Profile.model_validate(data.study.get("profile") or {})
    except (ValidationError, ValueError, TypeError, TunectlError):
        return None


def rank_trials(trials: list[TrialResult], prof: Profile | None = None) -> list[TrialResult]:
    """Trials with at least one stable level, the best first: by the study's objective where its profile is known
    (the value the search maximized: an SLO met before one missed, the weighted sum over workloads, the capacity),
    else by the peak output throughput."""
    ranked = [t for t in trials if t.stable_levels]
    if prof is None:
        return sorted(ranked, key=lambda t: (-t.best_output_throughput, t.trial))
    scores = {t.trial: score(t, prof) for t in ranked}
    return sorted(ranked, key=lambda t: (scores[t.trial].slo > 0, -scores[t.trial].value,
                                         -t.best_output_throughput, t.trial))


def best_info(data: StudyData) -> dict[str, Any]:
    """The winner's record in best.json: the search writes {"best": {"trial", "argv", "config", ...}, ...};
    a flat {"trial": n, ...} is read too. Empty when there is none (yet)."""
    b = data.best or {}
    inner = b.get("best", b)
    return inner if isinstance(inner, dict) else {}


def unfinished(data: StudyData) -> str | None:
    """Why a search study's best is not yet a winner: no best.json (the search stopped, by a deadline, Ctrl-C or a
    lost host, or runs still), so its best is the best reading so far, not one the finalists' race confirmed.
    None for a finished search and for other kinds of study."""
    if data.study.get("kind") != "search" or best_info(data):
        return None
    return ("the search has not named a winner yet (stopped before its end, or still running): the best so far, "
            "not a finished race's; the same `tunectl search` resumes it")


def best_trial(data: StudyData) -> TrialResult | None:
    """The study's winner: best.json's trial when written, else the best stable trial that finished ok."""
    by_num, info = {t.trial: t for t in data.trials}, best_info(data)
    if info.get("trial") in by_num:
        return by_num[info["trial"]]
    ok = [t for t in rank_trials(data.trials, study_profile(data)) if t.status == "ok"]
    same = [t for t in ok if info.get("params") is not None and t.params == info["params"]]
    return (same or ok or [None])[0]      # its trial.json unreadable (or on another host): a rerun of its config


def _names_winner(data: StudyData, best: TrialResult | None) -> bool:
    """Does best.json's record describe `best`'s config? Not when its winner's trial.json cannot be read and no
    rerun of that config can either: then `best` is another config, which best.json's numbers are not."""
    info = best_info(data)
    return best is None or best.trial == info.get("trial") or info.get("params") in (None, best.params)


def launch_argv(data: StudyData, n: int) -> list[str]:
    launch = data.launches.get(n) or {}
    if launch.get("argv"):
        return list(launch["argv"])
    info = best_info(data)
    if info.get("trial") == n and info.get("argv"):
        return list(info["argv"])
    return []


def baseline_trial(trials: list[TrialResult]) -> TrialResult | None:
    return next((t for t in sorted(trials, key=lambda t: t.trial) if t.role == "baseline"), None)


def objective(t: TrialResult, prof: Profile | None) -> Interval:
    """One launch's objective value (the study's `objective.score`: what the search maximized and told Optuna,
    an SLO-bound level, a weighted sum, a capacity) with its 95% interval; without a profile its peak throughput."""
    if prof is None:
        peak = peak_level(t)
        return Interval.of(t.best_output_throughput, peak.output_throughput_ci95 if peak else None)
    sc = score(t, prof)
    return Interval.of(sc.value, sc.ci95)


def unit(prof: Profile | None) -> str:
    if prof is None:
        return "output tok/s"
    if prof.objective.mode == "goodput":
        return "req/s capacity" if prof.objective.capacity.by == "rate" else "concurrency capacity"
    if prof.objective.mode in ("tokens_per_joule", "tokens_per_dollar"):
        return "output " + prof.objective.mode.replace("_per_", "/")
    return {"output_throughput": "output tok/s", "total_throughput": "total tok/s",
            "request_throughput": "req/s"}[prof.objective.metric] + (" (weighted)" if prof.objective.weights else "")


def winner_number(data: StudyData) -> dict[str, Any] | None:
    """The winner's one number, the same in `tunectl best`, the search's closing lines, `studies`, `diff`,
    `trials` and the report: the study's objective value (`objective.score`), the mean over the fresh launches of
    its config that the finalists' race confirmed it on (best.json, written from the study's storage: the same
    for every worker of a study), with their spread, count and 95% interval, and the gain over the baseline;
    without a race record, the mean over every finished-ok run of its config on disk. Extend here, not beside."""
    prof, info = study_profile(data), best_info(data)
    base = baseline_trial(data.trials)
    drawn = knobs.drawn(prof, base.params) if prof is not None and base is not None else []
    if (info.get("confirmed_value") is not None and info.get("run_values")      # even where its trial ran elsewhere
            and _names_winner(data, best_trial(data))):
        out = _recorded_number(int(info["trial"]), info, unit(prof), base.trial if base is not None else None)
        out = {**out, "baseline_drawn": drawn} if drawn and out.get("gain") else out
        return _with_machines(out, data, base)
    best = best_trial(data)
    if best is None:
        return None
    runs = sorted((t for t in data.trials if t.params == best.params and t.status == "ok"), key=lambda t: t.trial)
    values = [objective(t, prof).value for t in runs] or [objective(best, prof).value]
    value = statistics.fmean(values)
    base_value = objective(base, prof).value if base is not None and base.status == "ok" else None
    out = {"trial": best.trial, "value": value, "runs": [t.trial for t in runs] or [best.trial],
           "values": values, "n": len(values), "min": min(values), "max": max(values), "unit": unit(prof),
           "baseline": base_value, "baseline_trial": base.trial if base is not None else None,
           "gain": value / base_value if base_value else None}
    ties = info.get("ties") or [] if _names_winner(data, best) else []      # best.json's winner's, not another's
    out.update(_intervals(runs or [best], base if base_value else None, ties, prof))
    if drawn and out["gain"]:
        out["baseline_drawn"] = drawn
    return _with_machines(out, data, base)


def _with_machines(out: dict[str, Any], data: StudyData, base: TrialResult | None) -> dict[str, Any]:
    """`mixed_machines` {machine: [trials]} when the winner's launches and the baseline's did not all run on one
    machine (TrialResult.machine; "not recorded" for trials from before it was kept): the same config read 20%
    apart on two H100s of one model (docs/real-gpu.md), so such a number mixes machines as well as configs."""
    ids = set(out.get("runs") or [out["trial"]])
    if base is not None:
        ids |= {t.trial for t in data.trials if t.params == base.params and t.status == "ok"}
    by_num = {t.trial: t for t in data.trials}
    seen: dict[str, list[int]] = {}
    for n in sorted(ids):
        if n in by_num:
            seen.setdefault(by_num[n].machine or "not recorded", []).append(n)
    if len(seen) > 1:
        out["mixed_machines"] = seen
    return out


def _recorded_number(trial: int, info: dict[str, Any], what: str, base_trial: int | None) -> dict[str, Any]:
    """winner_number() from best.json: the race's confirmed value, launches, interval, ties and gain."""
    values = [float(v) for v in info["run_values"]]
    g = info.get("gain") or {}
    base = (g.get("baseline") or {}).get("value")
    out = {"trial": trial, "value": float(info["confirmed_value"]), "runs": list(info.get("runs") or []),
           "values": values, "n": len(values), "min": min(values), "max": max(values), "unit": what,
           "baseline": base, "baseline_trial": base_trial, "gain": g.get("ratio"),
           "ci95": list(info.get("ci95") or []) or None, "spread": spread(values), "ties": list(info.get("ties") or []),
           "race": info.get("race")}
    if g:
        out.update({"gain_ci95": [g["low"], g["high"]], "gain_verdict": g.get("verdict"),
                    "baseline_ci95": [(g.get("baseline") or {}).get("low"), (g.get("baseline") or {}).get("high")]})
    return out


def launch_interval(t: TrialResult, prof: Profile | None = None) -> Interval:
    """One launch's reading: its objective value (peak throughput without a profile) with its 95% interval."""
    return objective(t, prof)


def _intervals(runs: list[TrialResult], base: TrialResult | None, ties: list[int],
               prof: Profile | None = None) -> dict[str, Any]:
    """The winner's 95% interval over its launches (each launch's own interval, pooled: tunectl.stats),
    the launch-to-launch spread, the gain over the baseline with its interval and verdict, and ties."""
    each = [objective(t, prof) for t in runs]
    win = pooled(each)
    out: dict[str, Any] = {"ci95": [win.low, win.high], "spread": spread([i.value for i in each]),
                           "ties": list(ties)}
    if base is not None:
        b = objective(base, prof)
        g = gain(win, b)
        out.update({"baseline_ci95": [b.low, b.high], "gain_ci95": [g.low, g.high], "gain_verdict": compare(win, b)})
    return out


def headline(number: dict[str, Any]) -> str:
    """winner_number() in words: "2,010.3 output tok/s (mean of 3 runs, 1,950.0-2,097.0; 95% interval
    1,930.1-2,090.5), 2.28x the baseline (880.0); gain 2.28x (2.15-2.42)"; a gain or a winner inside the noise is
    called a tie."""
    if not number:
        return "no stable configuration"
    text = f"{number['value']:,.1f} {number.get('unit') or 'output tok/s'}"
    ci = number.get("ci95")
    if number["n"] > 1:
        text += f" (mean of {number['n']} runs, {number['min']:,.1f}-{number['max']:,.1f}"
        text += f"; 95% interval {ci[0]:,.1f}-{ci[1]:,.1f})" if ci else ")"
    else:
        text += f" (1 run; 95% interval {ci[0]:,.1f}-{ci[1]:,.1f})" if ci and ci[0] != ci[1] else " (1 run)"
    if number.get("gain"):
        g = number.get("gain_ci95")
        drawn = number.get("baseline_drawn") or []
        text += f", {number['gain']:.2f}x the baseline ({number['baseline']:,.1f}"
        text += f"; its {', '.join(drawn)} drawn by the sampler: no default in the profile)" if drawn else ")"
        if g:
            text += f"; gain {number['gain']:.2f}x ({g[0]:.2f}-{g[1]:.2f})"
        if number.get("gain_verdict") == "tie":
            text += ": a tie, inside the noise"
    if number.get("ties"):
        text += f"; a tie with trial {', '.join(map(str, number['ties']))} (intervals overlap)"
    race = number.get("race")
    if race:
        text += f"; race: {race['spent']} of {race['budget']} reruns"
    mixed = number.get("mixed_machines")
    if mixed:
        levels = (race or {}).get("machines") or {}
        text += (f"; these launches ran on {len(mixed)} machines ("
                 + "; ".join(f"{m}: trial {', '.join(map(str, ns))}" for m, ns in mixed.items())
                 + (f"): the race put them on one machine's scale ({machine_words(levels)})" if levels else
                    "): readings from different machines are not comparable"))
    return text


def capacity_text(cap: dict[str, Any] | None) -> str:
    """A trial's SLA capacity with its final bracket: "12.3 req/s (12.3-13.4)", "at least 64 req/s"; "" when the
    trial ran no capacity search."""
    if not cap:
        return ""
    from tunectl.goodput import capacity_words        # numpy: only when there is a capacity to show

    both = cap["low"] is not None and cap["high"] is not None
    return capacity_words(cap) + (f" ({cap['low']:.4g}-{cap['high']:.4g})" if both else "")


def summary(data: StudyData) -> dict[str, Any]:
    best = best_trial(data)
    counts: dict[str, int] = {}
    for t in data.trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    out: dict[str, Any] = {"study": data.name, "kind": data.study.get("kind", "search"),
                           "trials": len(data.trials), "status_counts": counts, "best": None,
                           "reference": data.reference, "warm_start": (data.best or {}).get("warm_start")}
    base = baseline_trial(data.trials)
    out["baseline"] = ({"trial": base.trial, "output_throughput": base.best_output_throughput}
                       if base else None)
    if best is None:
        return out
    peak = peak_level(best)
    launch = data.launches.get(best.trial) or ({"argv": launch_argv(data, best.trial)})
    again = reproduce(launch)
    number = winner_number(data) or {}
    out["best"] = {
        "trial": best.trial, "role": best.role, "status": best.status, "params": dict(best.params),
        "output_throughput": best.best_output_throughput,
        "concurrency": peak.concurrency if peak else None,
        "max_stable_concurrency": best.max_stable_concurrency,
        "latencies": {k: peak.metrics.get(k) for k in LATENCY_KEYS} if peak else {},
        "spec_accept_length": peak.metrics.get("spec_accept_length") if peak else None,
        "command": redact.text(again["command"]), "argv": again["argv"], "env": again["env"],
        "patches": again["patches"], "host": best.host, "machine": best.machine,
        "sglang_version": best.sglang_version,
        "patch_hashes": dict(best.patch_hashes), "confirmed": number}
    if best.capacity:
        out["best"]["capacity"] = capacity_text(best.capacity)
        out["best"]["slo"] = dict(best.capacity.get("slo") or {})
    if number.get("n", 0) > 1:
        out["best"]["confirmed_value"] = number["value"]    # the mean over the search run and its reruns
    if number.get("gain"):
        out["best"]["speedup_vs_baseline"] = number["gain"]
    if peak is not None and peak.output_throughput_ci95:
        out["best"]["level_ci95"], out["best"]["samples"] = peak.output_throughput_ci95, peak.samples
    return out


# ------------------------------------------------------------------------------------------ curves

def _label(t: TrialResult) -> str:
    return f"#{t.trial} {t.role}" + ("" if t.status == "ok" else f" ({t.status})")


def top_trials(trials: list[TrialResult], top: int = 5, prof: Profile | None = None) -> list[TrialResult]:
    """The top configs by the objective (`rank_trials`; one per params: reruns collapse), plus the baseline."""
    chosen: list[TrialResult] = []
    seen: set[str] = set()
    for t in rank_trials(trials, prof):
        key = repr(sorted(t.params.items()))
        if key not in seen and len(chosen) < top:
            chosen.append(t)
            seen.add(key)
    base = baseline_trial(trials)
    if base is not None and base not in chosen:
        chosen.append(base)
    return chosen


def curve(t: TrialResult) -> dict[str, Any]:
    """A trial's stable levels of its first workload (a ladder per workload when a profile has several)."""
    workload = t.levels[0].workload if t.levels else ""
    ok = sorted((lv for lv in t.stable_levels if lv.workload == workload), key=lambda lv: lv.concurrency)
    return {"trial": t.trial, "label": _label(t), "role": t.role, "status": t.status, "workload": workload,
            "params": dict(t.params),
            "concurrency": [lv.concurrency for lv in ok],
            "output_throughput": [lv.output_throughput for lv in ok],
            "crashed_at": t.crashed_level,
            **{k: [lv.metrics.get(k) for lv in ok] for k in CURVE_KEYS}}


def throughput_curves(data: StudyData, top: int = 5) -> dict[str, Any]:
    return {"curves": [curve(t) for t in top_trials(data.trials, top, study_profile(data))],
            "reference": data.reference}


def history(trials: list[TrialResult]) -> list[dict[str, Any]]:
    """One row per trial in order, with the running best of stable throughput; crashes marked."""
    rows, running = [], 0.0
    for t in sorted(trials, key=lambda t: (t.started_at or 0.0, t.trial)):
        running = max(running, t.best_output_throughput if t.status in ("ok", "crashed") else 0.0)
        rows.append({"trial": t.trial, "status": t.status, "role": t.role,
                     "output_throughput": t.best_output_throughput, "running_best": running,
                     "crash_class": t.crash.cls if t.crash else None,
                     "crashed_at": t.crashed_level, "params": dict(t.params)})
    return rows


# ------------------------------------------------------------------------------------------ pareto

def pareto(trials: list[TrialResult]) -> dict[str, Any]:
    """All stable (trial, level) operating points, and the front: no other point has both more
    throughput and a lower p99 TTFT."""
    pts = [{"trial": t.trial, "concurrency": lv.concurrency, "output_throughput": lv.output_throughput,
            "p99_ttft_ms": float(lv.metrics["p99_ttft_ms"]), "label": _label(t)}
           for t in trials for lv in t.stable_levels if lv.metrics.get("p99_ttft_ms") is not None]
    front, best_tp = [], -1.0
    for p in sorted(pts, key=lambda p: (p["p99_ttft_ms"], -p["output_throughput"])):
        if p["output_throughput"] > best_tp:
            front.append(p)
            best_tp = p["output_throughput"]
    return {"points": pts, "front": front}


# the per-token costs the report plots throughput against (tunectl/energy.py): lower is better
PER_TOKEN_AXES = {"joules_per_output_token": "joules per output token",
                  "usd_per_million_output_tokens": "USD per million output tokens"}


def pareto_per_token(trials: list[TrialResult]) -> dict[str, dict[str, Any]]:
    """For each per-token cost the levels carry: the stable (trial, level) points and the front where no other
    point has both more throughput and a lower cost per token (energy, or dollars at the profile's price)."""
    out: dict[str, dict[str, Any]] = {}
    for key in PER_TOKEN_AXES:
        pts = [{"trial": t.trial, "concurrency": lv.concurrency, "output_throughput": lv.output_throughput,
                key: float(lv.metrics[key]), "label": _label(t)}
               for t in trials for lv in t.stable_levels if lv.metrics.get(key) is not None]
        front, best_tp = [], -1.0
        for p in sorted(pts, key=lambda p: (p[key], -p["output_throughput"])):
            if p["output_throughput"] > best_tp:
                front.append(p)
                best_tp = p["output_throughput"]
        if pts:
            out[key] = {"points": pts, "front": front, "axis": PER_TOKEN_AXES[key]}
    return out
