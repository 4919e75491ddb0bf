"""tunectl: unattended, crash-aware tuning of SGLang server flags."""
from __future__ import annotations

import os as _os

__version__ = "0.1.0"

# pyproject.toml maps the code folders search/ runners/ reports/ sim/ into this namespace for installs.
# In a source checkout they sit beside this package: make `tunectl.sim` & co. resolve there too.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "sim", "__init__.py")) and _os.path.isfile(
    _os.path.join(_root, "pyproject.toml")
):
    __path__.append(_root)  # type: ignore[name-defined]  # noqa: F821

REPO_ROOT = _root
