"""The results store: versioned JSON files under results/<study>/, written atomically.

Layout (every file readable on its own; an interrupted run leaves readable results):

    results/<study>/study.json                  what ran: profile (secrets redacted), kind (search|sweep), times
    results/<study>/trials/<n>/trial.json       TrialResult.to_dict() (written at start, updated per level, final)
    results/<study>/trials/<n>/launch.json      LaunchPlan: argv (full command-line equivalent), config, env
    results/<study>/trials/<n>/config.yaml      the SGLang --config file as launched
    results/<study>/trials/<n>/levels/<workload>-c<concurrency>.json   LevelResult.to_dict()
    results/<study>/trials/<n>/server.log       the server log (copied back from the host, redacted)
    results/<study>/best.json                   the winner: trial number, argv, config, ladder
    results/<study>/study.db                    Optuna SQLite storage (search only)
    results/<study>/report.html                 tunectl report
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunectl import redact
from tunectl.errors import TunectlError, UsageError
from tunectl.models import SCHEMA_VERSION, LaunchPlan, LevelResult, TrialResult

DEFAULT_ROOT = Path("results")
NAME_MAX = 100
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_name(name: str, what: str = "--study") -> str:
    """The one rule for a study's name, in every command: it names a folder under results/ (and the host's run
    ids), so letters, digits, '_', '-' and '.', not starting with '.' or '-', at most NAME_MAX characters."""
    if _NAME.fullmatch(name) and len(name) <= NAME_MAX:
        return name
    shown = repr(name) if len(name) <= 60 else repr(name[:40]) + f"... ({len(name)} characters)"
    raise UsageError(f"{what}: {shown}: a study name is 1-{NAME_MAX} letters, digits, '_', '-' and '.', not "
                     "starting with '.' or '-' (it names a folder under results/)")


def atomic_write(path: Path, data: bytes | str, mode: int | None = None, make_parents: bool = True) -> None:
    """Write through a temp file + rename, so a reader never sees a torn file; `mode` sets the permissions."""
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(obj: Any) -> Any:
    """JSON has no Infinity/NaN: store them as null so strict parsers (browsers, jq) read our files."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(_finite(obj), indent=2, sort_keys=False, default=str) + "\n")


# What reading a trial.json that is not one raises: bad JSON or bytes, not an object, a field missing or mistyped.
UNREADABLE = (ValueError, OSError, KeyError, TypeError, AttributeError)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class RecordError(TunectlError, ValueError):
    """A study's own record (study.json, best.json) that is not one: emptied, truncated, a bad copy. One line
    naming the file (exit 1), never a traceback; a ValueError too, so readers that skip a bad file still do."""


def read_record(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or RecordError naming the file and what is wrong with it."""
    try:
        obj = read_json(path)
    except ValueError as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
    else:
        if isinstance(obj, dict):
            return obj
        why = f"a JSON {type(obj).__name__}, not an object"
    raise RecordError(f"{path}: not a readable record ({why[:160]}): a truncated or damaged copy? Nothing was "
                      "changed; restore it (or move it aside: the same `tunectl search` writes it again)")


class StudyStore:
    """Files of one study (or sweep) under root/<name>/."""

    def __init__(self, name: str, root: Path | str = DEFAULT_ROOT):
        self.name = name
        self.root = Path(root)
        self.dir = self.root / name

    def trial_dir(self, n: int) -> Path:
        return self.dir / "trials" / str(n)

    def write_study(self, info: dict[str, Any]) -> None:
        write_json(self.dir / "study.json", {"schema": SCHEMA_VERSION, "name": self.name, **info})

    def read_study(self) -> dict[str, Any]:
        p = self.dir / "study.json"
        return read_record(p) if p.exists() else {}

    def write_trial(self, t: TrialResult) -> None:
        d = t.to_dict()
        if d.get("launch"):
            redact.launch(d["launch"])
        write_json(self.trial_dir(t.trial) / "trial.json", d)

    def write_launch(self, n: int, plan: LaunchPlan, config_yaml: str) -> None:
        write_json(self.trial_dir(n) / "launch.json", redact.launch(plan.to_dict()))
        atomic_write(self.trial_dir(n) / "config.yaml", config_yaml)

    def write_level(self, n: int, lv: LevelResult) -> None:
        write_json(self.trial_dir(n) / "levels" / f"{lv.workload}-{lv.load}.json", lv.to_dict())

    def write_log(self, n: int, text: str) -> None:
        atomic_write(self.trial_dir(n) / "server.log", redact.text(text))

    def log_path(self, n: int) -> Path:
        return self.trial_dir(n) / "server.log"

    def trial_numbers(self) -> list[int]:
        base = self.dir / "trials"
        if not base.is_dir():
            return []
        return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit() and (p / "trial.json").exists())

    def read_trial(self, n: int) -> TrialResult:
        return TrialResult.from_dict(read_json(self.trial_dir(n) / "trial.json"))

    def trials(self) -> list[TrialResult]:
        """The readable trial records; those that are not (`unreadable`) are left out, never crash the reader."""
        out = []
        for n in self.trial_numbers():
            try:
                out.append(self.read_trial(n))
            except UNREADABLE:
                continue
        return out

    def unreadable(self) -> list[tuple[Path, str]]:
        """The trial records `trials()` leaves out, and the launch records a reader replaces by the copy in
        trial.json (`launch()`), each with why (a file turned to garbage, a bad copy): the commands name them
        instead of skipping them without a word."""
        out = []
        for n in self.trial_numbers():
            for name, read in (("trial.json", self.read_trial), ("launch.json", self.read_launch)):
                try:
                    read(n)
                except UNREADABLE as e:
                    why = str(e).splitlines()[0] if str(e) else type(e).__name__
                    out.append((self.trial_dir(n) / name, f"{type(e).__name__}: {why}"[:160]))
        return out

    def read_launch(self, n: int) -> dict[str, Any] | None:
        """Trial n's launch.json (LaunchPlan.to_dict()), None when it has none."""
        p = self.trial_dir(n) / "launch.json"
        if not p.exists():
            return None
        plan = read_json(p)
        if not isinstance(plan, dict):
            raise TypeError(f"a JSON {type(plan).__name__}, not an object")
        return plan

    def launch(self, t: TrialResult) -> dict[str, Any] | None:
        """The launch of trial `t`: its launch.json, else (none, or one that is not readable: `unreadable` names
        it) the copy its trial.json keeps."""
        try:
            plan = self.read_launch(t.trial)
        except UNREADABLE:
            plan = None
        if plan is None and t.launch is not None:
            plan = t.launch.to_dict()
        return plan

    def write_best(self, info: dict[str, Any]) -> None:
        write_json(self.dir / "best.json", {"schema": SCHEMA_VERSION, **info})

    def read_best(self) -> dict[str, Any] | None:
        p = self.dir / "best.json"
        return read_record(p) if p.exists() else None


RUN_ID = re.compile(r"(?P<study>.+)-t(?P<n>\d+)-[0-9a-f]{8}")


def _lock_file(store: StudyStore, name: str) -> int:
    """results/<study>/locks/<name>, opened for a flock (which vanishes with the process, kill -9 included)."""
    path = store.dir / "locks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


@contextlib.contextmanager
def running(store: StudyStore) -> Iterator[None]:
    """Held (shared, on locks/running.lock) while a tunectl works on the study, whatever its storage. `owner_alive`
    asks it."""
    fd = _lock_file(store, "running.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def searching(store: StudyStore, alone: bool) -> Iterator[None]:
    """Held (on locks/searching.lock) by each search on the study: shared by the workers that write its storage as
    they go (one per host or GPU slot), exclusive by one that holds the study in memory and replaces study.db at its
    end (--virtual), under which another worker's trials would be lost and its trial folders written over. Taken at
    once or refused with one line, never waited for."""
    fd = _lock_file(store, "searching.lock")
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"study {store.name!r} has another search running on {store.dir} now"
                + (": this --virtual search holds the study in memory and replaces study.db at its end, so it "
                   "runs alone" if alone else ", a --virtual one that replaces study.db at its end")
                + "; wait for it to end, or give this one another --study") from None
        yield
    finally:
        os.close(fd)


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def in_use(store: StudyStore) -> bool:
    """Does a tunectl work on this study now (`running` held)?"""
    return _held(store.dir / "locks" / "running.lock")


def owner_alive(run_id: str, root: Path | str = DEFAULT_ROOT) -> tuple[bool | None, str | None]:
    """Is the tunectl that launched run `run_id` (a host trial directory's name) still running? (True/False,
    its study) from the study's files under `root`: its launch record names the run, its lock says whether a
    tunectl holds the study. (None, None) when no study there launched it (another results folder, another
    machine): nobody here can say."""
    m = RUN_ID.fullmatch(run_id)
    if m is None:
        return None, None
    for name in list_studies(root):
        if re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] != m["study"]:
            continue
        store = StudyStore(name, root)
        try:
            launched = read_json(store.trial_dir(int(m["n"])) / "launch.json").get("run_id")
        except UNREADABLE:
            continue
        if launched == run_id:
            return in_use(store), name
    return None, None


def list_studies(root: Path | str = DEFAULT_ROOT) -> list[str]:
    r = Path(root)
    if not r.is_dir():
        return []
    return sorted((p.name for p in r.iterdir() if (p / "study.json").exists()),
                  key=lambda name: (r / name / "study.json").stat().st_mtime)


def study_kind(root: Path | str, name: str) -> str:
    try:
        return str(read_record(Path(root) / name / "study.json").get("kind", "search"))
    except (OSError, ValueError):
        return "search"


def default_study(root: Path | str = DEFAULT_ROOT) -> str | None:
    """The study commands act on without --study: the latest search that ran a trial, else the latest study
    that did, else the latest at all (a failed start leaves no trials)."""
    names = list_studies(root)
    ran = [n for n in names if StudyStore(n, root).trial_numbers()]
    searches = [n for n in ran if study_kind(root, n) == "search"]
    return (searches or ran or names or [None])[-1]


def level_metrics(lv: LevelResult) -> dict[str, Any]:
    """A level's SGLang metrics for a table row: SGLang's measured "concurrency" (0.99, 3.95...) becomes
    `measured_concurrency`, so the row's `concurrency` is the level."""
    return {("measured_concurrency" if k == "concurrency" else k): v for k, v in lv.metrics.items()}


def load_frames(store: StudyStore) -> dict[str, Any]:
    """pandas tables of a study: trials (one row per trial, params flattened) and levels (one row per
    trial x workload x level, SGLang metric names as columns)."""
    import pandas as pd

    trows, lrows = [], []
    for t in store.trials():
        row = {"trial": t.trial, "status": t.status, "role": t.role, "attempt": t.attempt,
               "best_output_throughput": t.best_output_throughput,
               "max_stable_concurrency": t.max_stable_concurrency,
               "crash_class": t.crash.cls if t.crash else None,
               "crash_signature": t.crash.signature if t.crash else None,
               "crashed_level": t.crashed_level, "ready_s": t.ready_s, "wall_s": t.wall_s,
               "host": t.host, "sglang_version": t.sglang_version}
        row.update({f"param.{k}": v for k, v in t.params.items()})
        trows.append(row)
        for lv in t.levels:
            lrows.append({**level_metrics(lv), "trial": t.trial, "workload": lv.workload, "concurrency": lv.concurrency,
                          "status": lv.status, "completed": lv.completed, "client_bound": lv.client_bound})
    return {"trials": _frame(pd, trows), "levels": _frame(pd, lrows)}


def _frame(pd: Any, rows: list[dict[str, Any]]) -> Any:
    """A DataFrame whose integer columns stay integers where some rows have none (pandas' nullable Int64, not
    float: max_stable_concurrency 512, not 512.0)."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        vals = [r[col] for r in rows if r.get(col) is not None]
        if vals and len(vals) < len(rows) and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            df[col] = df[col].astype("Int64")
    return df
