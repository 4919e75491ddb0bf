"""Study storage, resume and worker ownership.

- Storage: SQLite at results/<study>/study.db unless a URL is given (PostgreSQL for many workers). It is a plain
  Optuna RDB storage: `optuna.load_study` and optuna-dashboard open it as it is.
- Heartbeat: Optuna's heartbeat only runs inside `Study.optimize`; with ask/tell we run our own thread calling
  `storage.record_heartbeat`, and call `fail_stale_trials` on startup and before each ask. A stale trial is told
  FAIL and its params are queued again.
- Ownership: one worker per host. A lock held for the worker's life (a PostgreSQL advisory lock on a held
  connection, else an flock): both vanish with the process, kill -9 included. Holding it means every RUNNING trial
  recorded for this host is an orphan of a dead worker: its server is torn down and its params re-queued. A
  RUNNING trial no host claimed (its worker died between the ask and naming the host) is failed and re-queued on
  resume and before each ask (`fail_hostless`; a worker ages such a trial on its own clock, not by the asking
  machine's timestamp).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from tunectl.errors import UsageError

HOST_ATTR = "tunectl:host"
# Heartbeat with ask/tell and `group` are what this module is for; Optuna's notes about them are noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
HEARTBEAT_S = 10
RETRY_KEEP = ("role", "finalist_of", "rerun", "infra_tries", "flaky_tries", "proposed_by", "repair_of",
              "repair_for", "unset", "gain_baseline")   # gain_baseline: a baseline relaunch stays outside the budget


def default_storage_url(study_dir: Path) -> str:
    study_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(study_dir / 'study.db').resolve()}"


_MEMORY: dict[str, optuna.storages.InMemoryStorage] = {}


def open_storage(url: str, heartbeat_s: int = HEARTBEAT_S) -> optuna.storages.BaseStorage:
    """An RDB storage; `memory:<name>` is an in-process one (no heartbeat, gone with the process: virtual-clock
    benchmarks), the same object for the same name."""
    if url.startswith("memory:"):
        return _MEMORY.setdefault(url, optuna.storages.InMemoryStorage())
    return RDBStorage(url, heartbeat_interval=heartbeat_s, grace_period=3 * heartbeat_s,
                      heartbeat_stale_trial_callback=lambda study, t: requeue(study, t, "stale heartbeat"),
                      engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None)


def requeue(study: optuna.Study, t: FrozenTrial, reason: str, **bump: int) -> None:
    """Queue the same params again, keeping the trial's role and retry counters (a queued trial's params as they
    were queued, where it ended before drawing them)."""
    attrs = {k: t.user_attrs[k] for k in RETRY_KEEP if k in t.user_attrs}
    for k, inc in bump.items():
        attrs[k] = int(attrs.get(k, 0)) + inc
    attrs.update(retry_of=t.number, retry_reason=reason)
    study.enqueue_trial({**t.system_attrs.get("fixed_params", {}), **t.params}, user_attrs=attrs)


def fail_running(study: optuna.Study, t: FrozenTrial) -> bool:
    """FAIL a RUNNING trial; False if someone else finished it first."""
    try:
        return study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True).state == TrialState.FAIL
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):  # another worker got there first
        return False


def queued(trial: optuna.trial.Trial) -> bool:
    """Was this trial popped from the queue (`enqueue_trial`) rather than proposed by the sampler? Every enqueue
    of tunectl passes user attributes with the trial's role; a sampler's proposal has none until it runs."""
    return "role" in trial.user_attrs


def host_of(t: FrozenTrial) -> str | None:
    """The host that holds the trial (a user attribute; studies before it kept it as a system attribute)."""
    return t.user_attrs.get(HOST_ATTR, t.system_attrs.get(HOST_ATTR))


class Heartbeat:
    """Records a heartbeat for one trial every interval while the trial runs."""

    def __init__(self, storage: Any, trial_id: int, interval: float):
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="tunectl-heartbeat")

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(SQLAlchemyError):  # a transient DB error: the next beat retries
                self.storage.record_heartbeat(self.trial_id)
            if self.stop.wait(self.interval):
                return

    def __enter__(self) -> Heartbeat:  # noqa: PYI034
        if getattr(self.storage, "get_heartbeat_interval", lambda: None)():
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]


class WorkerLock:
    """A named lock for one study, released when the holder dies."""

    def __init__(self, url: str, lock_dir: Path, study_name: str, name: str):
        self.url, self.name = url, f"{study_name}:{name}"
        self.path = lock_dir / f"{_slug(self.name)}.lock"
        self._fd: int | None = None
        self._conn: Any = None

    def acquire(self, blocking: bool = False) -> bool:
        if self.url.startswith("postgresql"):
            return self._pg_acquire(blocking)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def _pg_acquire(self, blocking: bool) -> bool:
        import sqlalchemy as sa

        key = int.from_bytes(hashlib.sha1(self.name.encode()).digest()[:8], "big", signed=True)
        conn = sa.create_engine(self.url, poolclass=sa.pool.NullPool).connect()
        fn = "pg_advisory_lock" if blocking else "pg_try_advisory_lock"
        got = conn.execute(sa.text(f"SELECT {fn}(:k)"), {"k": key}).scalar()
        if got is False:
            conn.close()
            return False
        conn.commit()
        self._conn = conn
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> WorkerLock:  # noqa: PYI034
        self.acquire(blocking=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_host(url: str, lock_dir: Path, study_name: str, host_key: str) -> WorkerLock:
    lock = WorkerLock(url, lock_dir, study_name, f"host:{host_key}")
    if not lock.acquire(blocking=False):
        raise UsageError(f"host {host_key} already has a worker in study {study_name!r}: one worker per host "
                         "(give this worker another host, or other GPUs with host.gpus)")
    return lock


class HostState:
    """results/<study>/hosts/<host>.json: the trial this host is running now (survives kill -9)."""

    def __init__(self, state_dir: Path, host_key: str):
        self.path = state_dir / f"{_slug(host_key)}.json"

    def set(self, n: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{n}\n")
        os.replace(tmp, self.path)

    def get(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


HOSTLESS_AGE_S = 1.0   # a live worker records its trial's host within milliseconds of the ask


def fail_hostless(study: optuna.Study, min_age_s: float = HOSTLESS_AGE_S,
                  first_seen: dict[int, float] | None = None) -> list[int]:
    """FAIL RUNNING trials no host ever claimed, their params (those drawn, a queued trial's attributes) queued
    again: the worker that asked for them died between the ask and recording the host (`SearchLoop._ask`), so no
    resume finds them by host, no heartbeat marks them stale, and the budget would count them forever. Only those
    older than `min_age_s` (another worker's ask in progress is not an orphan). Returns their numbers.
    `first_seen` (trial id -> this process's monotonic time when it first saw the trial without a host; updated):
    age on this process's own clock. Without it, age from `datetime_start`, which the asking worker stamped on its
    clock: on another machine running ahead or behind, a trial asked a moment ago can look a minute old."""
    now, mono, out = datetime.datetime.now(), time.monotonic(), []
    hostless = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if host_of(t) is None]
    if first_seen is not None:
        kept = {t._trial_id: first_seen.get(t._trial_id, mono) for t in hostless}
        first_seen.clear()
        first_seen.update(kept)
    for t in hostless:
        age = mono - first_seen[t._trial_id] if first_seen is not None else \
            (now - t.datetime_start).total_seconds() if t.datetime_start is not None else 0.0
        if age >= min_age_s and fail_running(study, t):
            requeue(study, t, "worker died before it recorded the trial's host")
            out.append(t.number)
            if first_seen is not None:
                first_seen.pop(t._trial_id, None)
    return out


def fail_hostless_at_resume(study: optuna.Study, min_age_s: float = HOSTLESS_AGE_S) -> list[int]:
    """`fail_hostless` at resume, on this process's own clock: the trials seen without a host, looked at again
    `min_age_s` later (only when there are any)."""
    first_seen: dict[int, float] = {}
    out = fail_hostless(study, min_age_s, first_seen)
    if first_seen:
        time.sleep(min_age_s)
        out += fail_hostless(study, min_age_s, first_seen)
    return out


def fail_stale(study: optuna.Study, first_seen: dict[int, float] | None = None) -> None:
    """Before each ask: trials whose worker stopped beating (`fail_stale_trials`), and trials no host claimed
    (`first_seen`: the caller's record of when it first saw each, `fail_hostless`)."""
    optuna.storages.fail_stale_trials(study)
    fail_hostless(study, first_seen=first_seen)


def recover(study: optuna.Study, host_key: str, state: HostState,
            cleanup: Callable[[int], None] | None) -> list[int]:
    """Run while holding the host lock: tear down what a dead worker left on this host, FAIL its RUNNING
    trials and queue their params again. Returns the trial numbers recovered."""
    numbers = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
               if host_of(t) == host_key}
    last = state.get()
    todo = sorted(set(numbers) | ({last} if last is not None else set()))
    for n in todo:
        if cleanup is not None:
            cleanup(n)
        t = numbers.get(n)
        if t is not None and fail_running(study, t):
            requeue(study, t, "worker died mid-trial")
    state.clear()
    return todo
