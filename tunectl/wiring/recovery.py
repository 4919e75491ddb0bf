"""A study's trial files and its Optuna storage kept in step: nothing recorded is lost or written over.

- `tell_recorded`: a trial whose final trial.json was written but whose worker was killed before it told the study
  (teardown, the log copy and the study's own writes run in between) is told its recorded result at resume, not
  failed and run again (which left two records of one config).
- `guard_records`: a storage that does not hold the trials the study's files record (a 0-byte or corrupt
  study.db, a bad copy, the wrong --storage) is refused before a trial is asked: the next trial numbers would
  write over `trials/<n>/`.
- `rebuild`: the study made again from its trial files (they hold every param, level and crash), the storage
  that was there kept aside (`tunectl search --rebuild`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunectl.errors import InfraError, UsageError
from tunectl.models import TrialResult
from tunectl.profile import Profile
from tunectl.store import UNREADABLE, StudyStore

FINAL = ("ok", "crashed", "pruned", "infra")   # a trial.json in these states was the trial's last word
CLOCK_SLACK_S = 1.0


def tell_recorded(study: optuna.Study, store: StudyStore, prof: Profile, keys: list[str]) -> list[int]:
    """Tell the study the recorded result of each RUNNING trial of these hosts (slots) whose trial.json is final
    and was written for this Optuna trial (not before it began). Returns the trial numbers told."""
    from tunectl.search.feedback import judge
    from tunectl.search.loop import tell_verdict
    from tunectl.search.study import host_of

    told = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if host_of(t) not in keys:
            continue
        try:
            result = store.read_trial(t.number)
            written = (store.trial_dir(t.number) / "trial.json").stat().st_mtime
        except UNREADABLE:
            continue
        began = t.datetime_start.timestamp() if t.datetime_start else float("inf")
        if result.status not in FINAL or written + CLOCK_SLACK_S < began:      # a record older than the trial
            continue
        verdict = judge(result, prof, int(t.user_attrs.get("infra_tries", 0)),
                        int(t.user_attrs.get("flaky_tries", 0)))
        tell_verdict(study, optuna.trial.Trial(study, t._trial_id), verdict)
        told.append(t.number)
    return told


def guard_records(storage: Any, name: str, store: StudyStore, shown_url: str) -> None:
    """Refuse a storage whose study would give new trials the numbers of trial records already on disk."""
    numbers = _recorded_numbers(store)
    if not numbers:
        return
    try:
        sid = storage.get_study_id_from_name(name)
        held = len(storage.get_all_trials(sid, deepcopy=False))
    except KeyError:
        held = 0
    if max(numbers) < held:
        return
    what = "holds no study of this name" if not held else f"holds only {held} of its trials"
    raise InfraError(f"{shown_url}: the storage {what}, but {len(numbers)} trial records are under "
                     f"{store.dir / 'trials'} (up to trial {max(numbers)}): an empty or corrupt study.db, or "
                     f"another storage; nothing was run or written over. Rebuild the study from its trial files: "
                     f"tunectl search --study {name} --rebuild (the storage there now is kept aside)")


def _recorded_numbers(store: StudyStore) -> list[int]:
    base = store.dir / "trials"
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit() and any(p.iterdir()))


def check_file(url: str, store: StudyStore, name: str) -> None:
    """A SQLite study file that is empty or not a database: one line (exit 1) before anything opens it, the
    way on named; never a new study started over the old one's files."""
    if not url.startswith("sqlite:///"):
        return
    db = Path(url[len("sqlite:///"):])
    why = sqlite_unreadable(db)
    if why is None:
        return
    n = len(_recorded_numbers(store))
    raise InfraError(f"{db}: {why}" + (f", while {n} trial records are under {store.dir / 'trials'}: nothing was "
                                       f"run or written over; rebuild the study from its trial files: tunectl "
                                       f"search --study {name} --rebuild" if n else
                                       "; nothing was run; move it aside to start the study anew"))


def sqlite_unreadable(db: Path) -> str | None:
    """Why a SQLite study file cannot be opened as one (empty, not a database), or None."""
    import sqlite3

    if not db.exists():
        return None
    if db.stat().st_size == 0:
        return "empty (0 bytes)"
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            bad = conn.execute("PRAGMA quick_check").fetchone()[0]
        conn.close()
    except sqlite3.DatabaseError as e:
        return f"not a database ({e})"
    return None if bad == "ok" else f"corrupt ({bad})"


def set_aside(db: Path) -> Path:
    """Move a study file out of the way (never deleted): study.db -> study.db.bad-<time>."""
    aside = db.with_name(f"{db.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    db.rename(aside)
    return aside


def rebuild(study: optuna.Study, store: StudyStore, prof: Profile) -> int:
    """Add every trial the files record to an empty study, numbered as on disk: each trial.json judged as the
    search judged it (its params, values, constraints and evidence); a number without a readable record (a
    duplicate proposal told without running, a garbage file) becomes a FAIL. Returns the trials added."""
    from tunectl.search.feedback import judge
    from tunectl.search.space import config_key, distribution

    if study.get_trials(deepcopy=False):
        raise UsageError(f"--rebuild: study {study.study_name!r} already holds trials in this storage; rebuild "
                         "into an empty one (the default study.db is set aside by --rebuild)")
    numbers = _recorded_numbers(store)
    dists = {name: distribution(spec) for name, spec in prof.search.space.items()}
    first_of: dict[str, int] = {}
    for n in range(max(numbers, default=-1) + 1):
        try:
            result: TrialResult | None = store.read_trial(n)
        except UNREADABLE:
            result = None
        if result is None or result.status not in FINAL:
            study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={
                "role": result.role if result else "search", "reason": "rebuilt: no final trial record"}))
            continue
        params = {k: v for k, v in result.params.items() if k in dists and _fits(dists[k], v)}
        key = config_key(params)
        v = judge(result, prof)
        attrs = {**v.user_attrs, "role": result.role, "reason": v.reason, "rebuilt": True}
        if result.role == "finalist" and key in first_of:
            attrs["finalist_of"] = first_of[key]
        elif result.role in ("search", "baseline"):
            first_of.setdefault(key, n)
        done = v.state == TrialState.COMPLETE and bool(v.values)
        study.add_trial(optuna.trial.create_trial(
            state=v.state if done or v.state != TrialState.COMPLETE else TrialState.FAIL,
            values=v.values if done else None, params=params, distributions={k: dists[k] for k in params},
            user_attrs=attrs, constraints=v.constraints if done else None))
    return max(numbers, default=-1) + 1


def _fits(dist: Any, value: Any) -> bool:
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def rebuild_study(prof: Profile, name: str, root: Path | str,
                  storage_url: str | None = None) -> tuple[int, Path | None]:
    """`tunectl search --rebuild`: the study made again from its trial files in its storage (the default
    study.db set aside first, never deleted). Returns the trials added and where the old file went."""
    from tunectl.wiring import identity
    from tunectl.search.study import default_storage_url, open_storage
    from tunectl.wiring.storage import storage_errors, storage_url_for
    from tunectl.store import in_use

    store = StudyStore(name, root)
    if not _recorded_numbers(store) or store.read_study().get("kind", "search") != "search":
        raise UsageError(f"--rebuild: no search trial records under {store.dir / 'trials'} to rebuild study "
                         f"{name!r} from")
    if in_use(store):
        raise UsageError(f"--rebuild: a tunectl is running study {name!r} now; rebuild once it has stopped")
    aside = None
    db = store.dir / "study.db"
    if storage_url is None and db.exists():
        aside = set_aside(db)
    url = storage_url_for(storage_url) if storage_url is not None else default_storage_url(store.dir)
    with storage_errors(url):
        study = optuna.create_study(study_name=name, storage=open_storage(url), load_if_exists=True,
                                    directions=["maximize", "minimize"] if prof.objective.multi_objective
                                    else ["maximize"])
        added = rebuild(study, store, prof)
        if store.read_study().get("identity"):
            study.set_user_attr(identity.ATTR, store.read_study()["identity"])
    return added, aside
