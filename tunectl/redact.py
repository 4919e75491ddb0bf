"""Secrets out of everything tunectl writes or shows: one home for what counts as a secret and how it is hidden.

- `env(mapping, refs)`, `launch(d)`: values of variables whose name says secret (`*API_KEY*`, `*TOKEN*`, `*SECRET*`,
  `*PASSWORD*`) hidden; those read from the caller's environment (a launch's `env_refs`) shown as the profile
  wrote them.
- `text(text)`: the API keys SGLang prints in clear (`server_args=...api_key='...'`, `--api-key X` in a command).
- `url(url)`: the password of a storage URL (`postgresql://user:secret@host/db` -> `user:***@host/db`), also as a
  query parameter (`?password=secret` -> `?password=***`).
- `profile(prof)`: the profile as stored in results, its `server.env` redacted.
- `SECRET_FLAGS`, `secret_flag(name)`: SGLang flags that carry a secret (a profile must not set them, as a base flag
  or a knob, however spelled: `--api-key`, `api_key`; the environment does).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunectl.profile import Profile

MARK = "<redacted>"
SECRET_FLAGS = ("api-key", "api_key", "admin-api-key")
_SECRET_KEYS = re.compile(r"(api[_-]?key|token|secret|password|passwd)", re.I)
_LOG_SECRET = re.compile(r"((?:api_key|admin_api_key)\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,)]+)")
_ARGV_SECRET = re.compile(r"(--(?:admin-)?api-key[= ])(\S+)")
ENV_REF = re.compile(r"\$\{(\w+)\}")     # `${NAME}` in a profile's server.env: read from the caller's environment
_URL_QUERY_SECRET = re.compile(r"([?&][^=&]*(?:password|passwd|secret|token)[^=&]*=)[^&]*", re.I)


def secret_flag(name: str) -> bool:
    return name.lstrip("-").replace("_", "-") in {f.replace("_", "-") for f in SECRET_FLAGS}


def secret_name(name: str) -> bool:
    """An environment variable whose name says it holds a secret."""
    return bool(_SECRET_KEYS.search(name))


def env(mapping: dict[str, str], refs: Mapping[str, str] | None = None) -> dict[str, str]:
    """`refs` (a launch's `env_refs`): values read from the caller's environment, shown as the profile wrote them
    (`${NAME}`), never as what they expanded to, whatever their name."""
    refs = refs or {}
    return {k: refs[k] if k in refs else MARK if _SECRET_KEYS.search(k) else v for k, v in mapping.items()}


def launch(d: dict[str, Any]) -> dict[str, Any]:
    """A stored launch (launch.json, or a trial record's `launch`) with its environment redacted, in place."""
    refs = d.get("env_refs")
    d["env"] = env(d.get("env") or {}, refs if isinstance(refs, dict) else None)
    return d


def text(s: str) -> str:
    return _ARGV_SECRET.sub(rf"\1{MARK}", _LOG_SECRET.sub(rf"\1'{MARK}'", s))


def url(u: str) -> str:
    head, sep, tail = u.partition("://")
    tail = _URL_QUERY_SECRET.sub(r"\1***", tail)        # libpq's ?password=... (and sslpassword) in the query
    if "@" not in tail or ":" not in tail.split("@", 1)[0]:
        return f"{head}{sep}{tail}"
    cred, rest = tail.split("@", 1)
    return f"{head}{sep}{cred.split(':', 1)[0]}:***@{rest}"


def profile(prof: Profile) -> dict[str, Any]:
    dumped = prof.model_dump(mode="json")
    dumped["server"]["env"] = env(dumped["server"].get("env", {}))
    return dumped
