"""The refusals of the file system and of a study's storage, as one line for the CLI.

A results folder that is a file or read-only, a name too long for the file system, a full disk, a damaged
SQLite file: not bugs in tunectl, so the user gets the path and the reason, never a traceback. Anything else is
left to propagate (a bug keeps its traceback)."""
from __future__ import annotations

import errno
import os
import re

_WHY = {
    errno.EACCES: "permission denied (a read-only folder? run where you may write, or make it writable)",
    errno.EPERM: "operation not permitted (a read-only folder? run where you may write, or make it writable)",
    errno.EROFS: "read-only file system (run where you may write)",
    errno.ENOTDIR: "a part of this path is a file, not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.EEXIST: "exists and is not a folder",
    errno.ENOSPC: "no space left on the device (free some, then rerun the same command: results so far are kept)",
    errno.EDQUOT: "disk quota exceeded (free some, then rerun the same command: results so far are kept)",
}
_TEMP = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{6,}(\.tmp)?$")     # atomic_write's `.<name>.<random>` beside the file


def _shown(path: str) -> str:
    """The path as the user knows it: a temp file written beside its target named by the target, a folder name
    too long to read cut to its start and its length."""
    head, name = os.path.split(path)
    m = _TEMP.match(name)
    if m:
        path = os.path.join(head, m.group(1))
    parts = [p if len(p) <= 60 else f"{p[:40]}...({len(p)} characters)" for p in path.split(os.sep)]
    return os.sep.join(parts)


def _os_line(e: OSError) -> str:
    path = e.filename if isinstance(e.filename, str) else None
    if e.errno == errno.ENAMETOOLONG:
        longest = max((p for p in (path or "").split(os.sep)), key=len, default="")
        return (f"{_shown(path or '?')}: name too long for the file system ({len(longest.encode())} bytes; "
                "a name takes at most 255): use a shorter --study")
    why = _WHY.get(e.errno or -1) or (e.strerror or str(e)).strip()
    return f"{_shown(path)}: {why}" if path else why


def _database_line(e: Exception) -> str:
    why = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
    return (f"the study's storage is not a readable database ({why}): a damaged or truncated study.db? "
            "Nothing was changed; its trial records under trials/ are kept")


def one_line(e: BaseException) -> str | None:
    """One line saying what the file system or the storage refused, or None when `e` is not such a refusal."""
    if isinstance(e, OSError):
        return _os_line(e)
    mods = [c.__module__ + "." + c.__name__ for c in type(e).__mro__]
    if "sqlalchemy.exc.DatabaseError" not in mods and "sqlite3.DatabaseError" not in mods:
        return None
    cause = e.__cause__ or e.__context__
    while cause is not None and not isinstance(cause, OSError):     # a refused write behind the storage's error
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return _os_line(cause)
    if "unable to open database file" in str(e):
        return ("cannot open or create the study's SQLite file: its folder is not writable, or a part of its path "
                "is a file (run where you may write)")
    return _database_line(e)
