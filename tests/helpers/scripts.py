"""Load a script of the repository that is not a package module (bench/gpu/*.py) by its path."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relpath: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(relpath).stem, ROOT / relpath)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
