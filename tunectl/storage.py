"""The Optuna storage URL a user gives (`--storage`): made openable, its errors one line, its password hidden."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tunectl import redact
from tunectl.errors import InfraError, UsageError


def storage_url_for(url: str) -> str:
    """A --storage URL as the README writes it, made openable: `postgresql://` (or `postgres://`) gets the
    PostgreSQL driver that is installed (psycopg2 from tunectl[postgres], else psycopg 3), whatever SQLAlchemy's
    own default is. A URL SQLAlchemy cannot parse is the user's mistake: one line."""
    from importlib.util import find_spec

    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    if url.startswith("memory:"):              # an in-process storage (search/study.py: virtual benchmarks)
        return url
    shown = redact.url(url)
    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise UsageError(f"--storage {shown!r}: not a database URL; e.g. sqlite:///results/s/study.db or "
                         "postgresql://user:password@host:5432/db") from None
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
    except (sqlalchemy.exc.NoSuchModuleError, ModuleNotFoundError) as e:
        raise UsageError(f"--storage {shown}: cannot open this kind of database here ({e}); supported: sqlite:///"
                         "PATH, postgresql://... (pip install 'tunectl[postgres]')") from None
    except sqlalchemy.exc.OperationalError as e:
        why = str(getattr(e, "orig", e)).strip().splitlines()[0]
        raise InfraError(f"--storage {shown}: cannot connect: {why}") from None
