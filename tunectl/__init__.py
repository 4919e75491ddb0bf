"""tunectl: unattended, crash-aware tuning of SGLang server flags."""
from __future__ import annotations

import os as _os

from tunectl._rooms import install as _install_rooms

__version__ = "0.1.0"

# pyproject.toml maps the code folders search/ runners/ reports/ sim/ sglang_patches/ into this namespace for
# installs. In a source checkout they sit beside this package: map exactly those five names there (nothing else of
# the checkout becomes part of the package).
REPO_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
_install_rooms(REPO_ROOT)
