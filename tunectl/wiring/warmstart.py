"""`tunectl search --warm-start OLD`: a new study that starts from what an old one learned (another SGLang version,
other patches, another profile).

1. The old winner and the next best old configs (top-k, their knobs translated to the new profile's by
   tunectl/wiring/migrate.py) run first on the new setup, as ordinary search trials (`proposed_by: warm-start`).
2. Then every finished old trial is added to the new study as prior knowledge (`role: prior`, Optuna's
   `study.add_trial`): TPE models the space from them from the start, but a prior trial is never counted as a
   result: not in the budget, not a finalist, not the winner, not in the report's trials. Its value is scaled by
   what the re-runs measured (old configs on the new version / the same configs before), so old and new numbers
   share one scale.
3. The outcome says "old best on new version: X (was Y)" and lists the knobs whose flags changed meaning.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import ValidationError

from tunectl.errors import UsageError
from tunectl.wiring.migrate import ParamMap
from tunectl.profile import Profile
from tunectl.store import StudyStore

PRIOR = "prior"
TOP_K = 3


@dataclass
class Old:
    trial: int
    params: dict[str, Any]                 # in the new profile's knobs
    value: float                           # what it measured on the old setup
    values: list[float] = field(default_factory=list)
    constraints: dict[str, float] = field(default_factory=dict)


@dataclass
class WarmStart:
    study: str
    version: str
    identity: dict[str, Any]
    first: list[Old]                       # the old winner, then the next best: run first
    prior: list[Old]                       # every finished old trial that maps into the new space
    changed_meaning: list[str]

    def info(self) -> dict[str, Any]:
        return {"from": self.study, "sglang_version": self.version, "identity": self.identity,
                "first": [o.trial for o in self.first], "prior": len(self.prior),
                "changed_meaning": self.changed_meaning}


def _old_storage(store: StudyStore, info: dict[str, Any], given: str | None) -> str:
    """The old study's own SQLite file, else the storage this run was given, else the one it recorded."""
    db = store.dir / "study.db"
    if db.exists():
        return f"sqlite:///{db.resolve()}"
    if given:
        return given
    url = str(info.get("storage") or "")
    if not url or "***" in url or url.startswith("memory:"):
        raise UsageError(f"--warm-start {store.name}: its storage ({url or 'none'}) cannot be opened from here; "
                         "pass the new study the same --storage")
    return url


def _olds(trials: list[FrozenTrial], pm: ParamMap, prof: Profile) -> list[Old]:
    from tunectl.search import finalists as fin

    out = []
    for t in trials:
        if fin.role(t) not in fin.SEARCH_ROLES or "duplicate_of" in t.user_attrs or t.state != TrialState.COMPLETE:
            continue
        params = pm.params(dict(t.params), prof)
        if params is not None:
            cons = t.constraints if isinstance(t.constraints, dict) else {}
            out.append(Old(t.number, params, float(t.values[0]), list(t.values), dict(cons)))
    return out


def load(name: str, prof: Profile, root: Path | str, storage_url: str | None = None, top_k: int = TOP_K) -> WarmStart:
    from tunectl.search import finalists as fin
    from tunectl.search.space import config_key
    from tunectl.search.study import open_storage

    store = StudyStore(name, root)
    info = store.read_study()
    if info.get("kind") != "search":
        raise UsageError(f"--warm-start {name}: no search study of that name under {root} (tunectl studies lists "
                         "them)")
    try:
        old_prof = Profile.model_validate(info["profile"])
    except ValidationError as e:
        raise UsageError(f"--warm-start {name}: its study.json holds a profile this tunectl cannot read "
                         f"({e.errors()[0]['msg']})") from None
    url = _old_storage(store, info, storage_url)
    old = optuna.load_study(study_name=name, storage=open_storage(url))
    pm = ParamMap(old_prof, prof)
    trials = old.get_trials(deepcopy=False)
    best = (store.read_best() or {}).get("best") or {}
    ranked = sorted(fin.candidates(trials), key=lambda t: (t.number != best.get("trial"), -t.values[0]))
    first, seen = [], set()
    for t in ranked:
        params = pm.params(dict(t.params), prof)
        if params is None or config_key(params) in seen:
            continue
        seen.add(config_key(params))
        value = best.get("confirmed_value") or best.get("value") if t.number == best.get("trial") else None
        first.append(Old(t.number, params, float(value or t.values[0])))
        if len(first) >= top_k:
            break
    return WarmStart(name, old_prof.server.sglang_version, info.get("identity") or {}, first,
                     _olds(trials, pm, prof), pm.changed_meaning)


def enqueue_first(study: optuna.Study, ws: WarmStart) -> None:
    """The old winner and top-k, queued before the baseline (a fresh study only)."""
    for o in ws.first:
        study.enqueue_trial(o.params, user_attrs={"role": "search", "proposed_by": "warm-start",
                                                  "warm_of": o.trial, "old_value": o.value})


def begin(study: optuna.Study, ws: WarmStart, lock: Any) -> None:
    """Queue the old configs once, in a fresh study (under the lock the baseline is queued under: many workers)."""
    with lock("baseline"):
        if not study.get_trials(deepcopy=False):
            enqueue_first(study, ws)


def learn(study: optuna.Study, ws: WarmStart, prof: Profile, lock: Any) -> int:
    """Add the prior once (the first worker to finish the old configs does it); how many trials were added."""
    with lock("prior"):
        return 0 if has_prior(study) else add_prior(study, ws, prof)


def has_prior(study: optuna.Study) -> bool:
    return any(t.user_attrs.get("role") == PRIOR for t in study.get_trials(deepcopy=False))


def rerun(study: optuna.Study) -> list[tuple[FrozenTrial, float]]:
    """The warm-start trials that ran on the new setup, with what their configs measured on the old one."""
    return [(t, float(t.user_attrs["old_value"])) for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("proposed_by") == "warm-start" and "old_value" in t.user_attrs
            and t.state.is_finished() and t.state != TrialState.FAIL]


def _ok(t: FrozenTrial) -> bool:
    from tunectl.search import finalists as fin

    return t.state == TrialState.COMPLETE and fin.feasible(t)


def scale(study: optuna.Study) -> float:
    """New over old for the re-run configs that stayed stable (the median ratio), 1 when none did."""
    ratios = [t.values[0] / old for t, old in rerun(study) if _ok(t) and old > 0]
    return statistics.median(ratios) if ratios else 1.0


def add_prior(study: optuna.Study, ws: WarmStart, prof: Profile) -> int:
    """Every old trial as prior knowledge, its values on the new scale; returns how many were added."""
    from tunectl.search.space import distribution

    factor = scale(study)
    study.set_user_attr("tunectl:warm_start", {**ws.info(), "scale": round(factor, 4)})
    for o in ws.prior:
        values = [o.values[0] * factor, *o.values[1:]]
        study.add_trial(optuna.trial.create_trial(
            params=o.params, distributions={k: distribution(prof.search.space[k]) for k in o.params},
            values=values, constraints=o.constraints or None,
            user_attrs={"role": PRIOR, "prior_of": f"{ws.study}:{o.trial}", "old_value": o.value}))
    return len(ws.prior)


def summary(study: optuna.Study) -> dict[str, Any] | None:
    """'old best on new version: X (was Y)' as data, plus the flags that changed meaning."""
    info = study.user_attrs.get("tunectl:warm_start")
    if not info:
        return None
    runs = rerun(study)
    old_best = next(((t, old) for t, old in runs if t.user_attrs.get("warm_of") == (info["first"] or [None])[0]),
                    None)
    now = None if old_best is None else (old_best[0].values[0] if _ok(old_best[0]) else None)
    return {**info, "old_best_trial": old_best[0].number if old_best else None,
            "old_best_now": now, "old_best_was": old_best[1] if old_best else None,
            "old_best_status": None if old_best is None else old_best[0].user_attrs.get("status")
            or ("ok" if now is not None else "crashed")}
