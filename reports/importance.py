"""Parameter importance: Optuna's evaluator on study.db when there are enough finished trials, else the spread
of the objective across each parameter's values (computed from trial.json files alone)."""
from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

from tunectl.models import TrialResult

MIN_TRIALS = 5


def spread_importance(trials: list[TrialResult]) -> dict[str, float]:
    """Per parameter: max minus min of the mean best throughput across its values (numbers split at the
    median), normalised to sum 1. Crashed trials count with the throughput of their stable levels."""
    done = [t for t in trials if t.status in ("ok", "crashed", "pruned") and t.role != "finalist"]
    names = sorted({k for t in done for k in t.params})
    raw: dict[str, float] = {}
    for name in names:
        having = [t for t in done if name in t.params]
        groups: dict[str, list[float]] = {}
        nums = [t.params[name] for t in having if _is_num(t.params[name])]
        cut = statistics.median(nums) if len(nums) == len(having) and len(set(nums)) > 2 else None
        for t in having:
            v = t.params[name]
            key = ("low" if v <= cut else "high") if cut is not None else repr(v)
            groups.setdefault(key, []).append(t.best_output_throughput)
        means = [statistics.fmean(g) for g in groups.values()]
        raw[name] = (max(means) - min(means)) if len(means) > 1 else 0.0
    total = sum(raw.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in sorted(raw.items(), key=lambda kv: -kv[1])}


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def optuna_importance(db: Path, name: str = "") -> tuple[str, dict[str, float]] | None:
    """(evaluator, importances) from an Optuna SQLite storage (fANOVA needs scikit-learn, else PED-ANOVA),
    or None when it cannot be computed."""
    try:
        import optuna
        from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
    except ImportError:
        return None
    optuna.logging.set_verbosity(logging.ERROR)
    try:
        storage = optuna.storages.RDBStorage(f"sqlite:///{db}", skip_table_creation=True)
        names = [x.study_name for x in optuna.get_all_study_summaries(storage)]
        if name not in names and len(names) != 1:
            return None
        study = optuna.load_study(study_name=name if name in names else names[0], storage=storage)
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if len(complete) < MIN_TRIALS:
            return None
        # multi-objective studies (throughput, p99 TTFT): importance for the throughput objective
        target = None if len(study.directions) == 1 else (lambda t: t.values[0])
        for method, make in (("fanova", lambda: FanovaImportanceEvaluator(seed=0)),
                           ("ped-anova", PedAnovaImportanceEvaluator)):
            try:
                got = optuna.importance.get_param_importances(study, evaluator=make(), target=target)
                return method, dict(got)
            except (ImportError, ValueError, RuntimeError, ZeroDivisionError):
                continue
    except Exception:  # noqa: BLE001 - a foreign or half-written database must not break the report
        return None
    return None


def importance(trials: list[TrialResult], db: Path | None, name: str = "") -> dict[str, Any]:
    if db is not None:
        got = optuna_importance(db, name)
        if got and got[1]:
            return {"method": f"optuna {got[0]}", "values": got[1]}
    done = [t for t in trials if t.status in ("ok", "crashed", "pruned")]
    if len(done) < 3 or not any(t.params for t in done):
        return {"method": "none", "values": {}}
    return {"method": "spread", "values": spread_importance(trials)}
