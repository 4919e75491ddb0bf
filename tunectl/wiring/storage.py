"""The Optuna storage URL a user gives (`--storage`): made openable, its errors one line, its password hidden."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tunectl import redact
from tunectl.errors import InfraError, TunectlError, UsageError


def storage_url_for(url: str) -> str:
    """A --storage URL as the README writes it, made openable: `postgresql://` (or `postgres://`) gets the
    PostgreSQL driver that is installed (psycopg2 from tunectl[postgres], else psycopg 3), whatever SQLAlchemy's
    own default is. A URL SQLAlchemy cannot parse is the user's mistake: one line."""
    from importlib.util import find_spec

    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    if url.startswith("memory:"):              # an in-process storage (search/study.py: virtual benchmarks)
        return url
    if not url.strip():                        # `--storage ""` (an unset variable in a script): never the default
        raise UsageError(f"--storage {url!r}: empty; leave --storage out for the study's own SQLite file "
                         "(results/<study>/study.db), or give a URL, e.g. postgresql://user:password@host:5432/db")
    shown = redact.url(url)
    try:
        parsed = make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):     # ValueError: a port that is not a number
        raise UsageError(f"--storage {shown!r}: not a database URL; e.g. sqlite:///results/s/study.db or "
                         "postgresql://user:password@host:5432/db") from None
    if parsed.drivername.split("+")[0] == "sqlite":
        db = parsed.database or ""
        if parsed.host or not db:
            raise UsageError(f"--storage {shown!r}: an SQLite URL names a file: sqlite:///relative/path.db or "
                             "sqlite:////absolute/path.db")
        if db == ":memory:" or db.startswith("file::memory:"):
            raise UsageError(f"--storage {shown!r}: an in-memory database keeps nothing after this run (no resume, "
                             "no report): name a file, e.g. sqlite:///results/s/study.db")
        if Path(db).is_dir():
            raise UsageError(f"--storage {shown!r}: {db} is a folder; name the database file in it, e.g. "
                             f"sqlite:///{Path(db) / 'study.db'}")
        if not Path(db).parent.is_dir():      # SQLite says only "unable to open database file"
            raise UsageError(f"--storage {shown!r}: the folder {Path(db).parent} does not exist; create it "
                             "first, or leave --storage out for results/<study>/study.db")
    if parsed.drivername in ("postgresql", "postgres"):
        driver = next((d for d in ("psycopg2", "psycopg") if find_spec(d) is not None), None)
        if driver is None:
            raise UsageError(f"--storage {shown}: no PostgreSQL driver installed: pip install 'tunectl[postgres]'")
        return parsed.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)
    return url


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Opening the storage: an unknown scheme or a missing driver is the user's mistake (exit 2), an unreachable
    database an infra fault (exit 1); one line each, the password hidden."""
    import sqlalchemy.exc

    shown = redact.url(url)
    try:
        yield
    except (sqlalchemy.exc.NoSuchModuleError, ImportError) as e:     # Optuna: "Failed to import DB access module"
        raise UsageError(f"--storage {shown}: cannot open this kind of database here ({e}); supported: sqlite:///"
                         "PATH, postgresql://... (pip install 'tunectl[postgres]')") from None
    except sqlalchemy.exc.OperationalError as e:
        why = str(getattr(e, "orig", e)).strip().splitlines()[0]
        raise InfraError(f"--storage {shown}: cannot connect: {why}") from None
    except sqlalchemy.exc.DatabaseError as e:      # a truncated or damaged SQLite file: no traceback, no change
        why = str(getattr(e, "orig", e)).strip().splitlines()[0]
        raise TunectlError(f"{_db_name(shown)}: not a readable database ({why}): damaged or truncated; nothing "
                           "was changed, the study's trial records under trials/ are kept") from None


def _db_name(shown: str) -> str:
    return shown[len("sqlite:///"):] if shown.startswith("sqlite:///") else f"--storage {shown}"


@contextmanager
def held_in_memory(open_disk: Callable[[], Any], name: str, db_path: Path) -> Iterator[Any]:
    """A study kept in memory while it runs, written to its SQLite file once at the end, whatever the end
    (finished, an error, Ctrl-C): a virtual-clock study makes thousands of small writes in seconds, each a
    commit on disk. The study already on disk (a rerun resumes it) is read first. The file is replaced whole
    (written beside it, then renamed), so a kill leaves the previous study, never half of one."""
    import optuna

    mem = optuna.storages.InMemoryStorage()
    disk = open_disk() if db_path.exists() else None           # a new study: nothing to read
    if disk is not None and any(s.study_name == name for s in disk.get_all_studies()):
        optuna.copy_study(from_study_name=name, from_storage=disk, to_storage=mem)
    try:
        yield mem
    except BaseException:
        if any(s.study_name == name for s in mem.get_all_studies()):
            with contextlib.suppress(Exception):      # the error that stopped the run is the one to tell
                _write_sqlite(mem, name, db_path)
        raise
    if any(s.study_name == name for s in mem.get_all_studies()):
        _write_sqlite(mem, name, db_path)


def _write_sqlite(mem: Any, name: str, db_path: Path) -> None:
    import optuna
    import sqlalchemy

    tmp = db_path.with_name(f".{db_path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    out = optuna.storages.RDBStorage(f"sqlite:///{tmp}")
    # A scratch file until the rename: no sync per commit (Optuna commits once per trial and attribute), one
    # fsync of the whole file before it replaces the study.
    sqlalchemy.event.listen(out.engine, "connect", lambda conn, _: conn.execute("PRAGMA synchronous=OFF"))
    out.engine.dispose()
    try:
        optuna.copy_study(from_study_name=name, from_storage=mem, to_storage=out)
    finally:
        out.engine.dispose()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, db_path)
