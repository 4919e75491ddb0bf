"""Side-by-side comparison of two configurations: a trial (`study:n`), a study's best (`study`), or a profile
(a YAML path, e.g. profiles/k2-thinking-reference.yaml). Flags, environment, patches and results."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from tunectl.reports.command import STAND_IN_ENV, user_env
from tunectl.reports.data import (
    best_trial,
    load_study,
    objective,
    peak_level,
    study_profile,
    unit,
    winner_number,
)

from tunectl.errors import UsageError
from tunectl.store import RecordError, StudyStore, list_studies

RESULT_KEYS = ("objective", "output_throughput", "concurrency", "max_stable_concurrency", "p99_ttft_ms", "p99_tpot_ms",
               "crash", "sglang_version", "host")


def norm_flag(name: str) -> str:
    """SGLang accepts both spellings in a --config file; compare them as `--flag-name` spells them."""
    return name.strip().lstrip("-").replace("_", "-")


def _norm_flags(flags: dict[str, Any]) -> dict[str, Any]:
    return {norm_flag(k): v for k, v in flags.items()}


def trial_side(root: Path, study: str, n: int | None) -> dict[str, Any]:
    store = StudyStore(study, root)
    if not store.dir.is_dir():
        valid = ", ".join(list_studies(root)) or "none"
        raise UsageError(f"{study}: no such study under {root}; valid: {valid}")
    data = load_study(store)
    by_num = {t.trial: t for t in data.trials}
    t = best_trial(data) if n is None else by_num.get(n)
    if t is None and n is not None:
        why = dict(store.unreadable()).get(store.trial_dir(n) / "trial.json")
        if why is not None:                  # there, but truncated or emptied: not "no such trial"
            raise RecordError(f"{study}:{n}: {store.trial_dir(n) / 'trial.json'}: not a trial record ({why})")
    if t is None:
        what = "has no stable trial yet" if n is None else f"has no trial {n}; valid: {_spans(sorted(by_num))}"
        raise UsageError(f"{study}: {what}")
    launch = data.launches.get(t.trial, {})
    peak = peak_level(t)
    results = {"objective": _objective(data, t), "output_throughput": t.best_output_throughput,
               "concurrency": peak.concurrency if peak else None,
               "max_stable_concurrency": t.max_stable_concurrency,
               "p99_ttft_ms": peak.metrics.get("p99_ttft_ms") if peak else None,
               "p99_tpot_ms": peak.metrics.get("p99_tpot_ms") if peak else None,
               "crash": f"{t.crash.cls} at c={t.crash.level}: {t.crash.exception_line}" if t.crash else None,
               "sglang_version": t.sglang_version, "host": t.host}
    return {"label": f"{study}:{t.trial}", "flags": _norm_flags(launch.get("config") or {}),
            "env": _config_env(launch), "patches": list(launch.get("patches") or []),
            "results": results}


def _spans(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8": a 150-trial study's trial numbers in a line one can read."""
    runs: list[list[int]] = []
    for k in numbers:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def _config_env(launch: dict[str, Any]) -> dict[str, str]:
    """The environment that belongs to the config: not tunectl's per-run bookkeeping (TMPDIR, TUNECTL_RUN_ID, ...,
    different on every launch) nor the stand-in's patch switch (the patches have their own section)."""
    return {k: v for k, v in user_env(launch).items() if k not in STAND_IN_ENV}


def _objective(data: Any, t: Any) -> str:
    """The study's objective for this config: the winner's one number (confirmed over its launches) for the winner's
    config; for another config the race relaunched (a tied finalist, the baseline) the mean of its launches as the
    race table prints it; else this trial's own reading of it."""
    number, best = winner_number(data), best_trial(data)
    if number is not None and best is not None and t.params == best.params:
        runs = f"mean of {number['n']} launches" if number["n"] > 1 else "1 launch"
        return f"{number['value']:,.1f} {number['unit']} ({runs})"
    raced = next((v for v in (data.best or {}).get("finalists") or []
                  if v.get("params") == t.params and (v.get("launches") or 1) > 1), None)
    if raced is not None:
        return f"{raced['score']:,.1f} {unit(study_profile(data))} (mean of {raced['launches']} launches)"
    return f"{objective(t, study_profile(data)).value:,.1f} {unit(study_profile(data))} (1 launch)"


def profile_side(path: Path) -> dict[str, Any]:
    from tunectl.profile import load_profile

    prof = load_profile(path)
    ref = prof.reference
    results = {"output_throughput": ref.output_throughput if ref else None,
               "concurrency": ref.concurrency if ref else None,
               "sglang_version": prof.server.sglang_version, "host": prof.host.address or prof.host.kind}
    flags = {"model-path": prof.model.path, **_norm_flags(prof.server.flags)}
    return {"label": prof.name, "flags": flags, "env": dict(prof.server.env),
            "patches": list(prof.server.patches), "results": results, "note": ref.note if ref else ""}


def resolve_side(spec: str, root: Path) -> dict[str, Any]:
    """`study:n` -> that trial; an existing .yaml/.yml path -> a profile; else a study name -> its best."""
    p = Path(spec)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise UsageError(f"{spec}: no such profile file")
        return profile_side(p)
    if ":" in spec:
        study, _, num = spec.rpartition(":")
        if not num.isdigit():
            raise UsageError(f"{spec}: expected STUDY:TRIAL with a trial number, got {num!r}")
        return trial_side(root, study, int(num))
    return trial_side(root, spec, None)


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rows of {key, a, b, same} for flags, env, patches and results. Missing = None."""
    def rows(x: dict[str, Any], y: dict[str, Any], keys: Any = None) -> list[dict[str, Any]]:
        names = list(keys) if keys else sorted(set(x) | set(y))
        return [{"key": k, "a": x.get(k), "b": y.get(k), "same": _same(x.get(k), y.get(k))} for k in names]

    pa, pb = set(a["patches"]), set(b["patches"])
    patches = [{"key": p, "a": p in pa, "b": p in pb, "same": (p in pa) == (p in pb)}
               for p in sorted(pa | pb)]
    return {"flags": rows(a["flags"], b["flags"]), "env": rows(a["env"], b["env"]), "patches": patches,
            "results": rows(a["results"], b["results"], RESULT_KEYS)}


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
        return float(x) == float(y)
    return yaml.safe_dump(x) == yaml.safe_dump(y)
