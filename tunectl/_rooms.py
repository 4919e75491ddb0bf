"""In a source checkout, `tunectl.search` & co. resolve to the top-level folders beside this package.

An install maps them with setuptools `package-dir` (pyproject.toml). A checkout run with `PYTHONPATH=<checkout>`
gets the same names from a meta-path finder that knows exactly the folders in `ROOMS`: `tunectl.tests` or
`tunectl.tunectl` stay unimportable, and submodules (`tunectl.runners.hosts.ssh`) resolve the ordinary way
through the room's `__path__`.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

ROOMS = ("search", "runners", "reports", "sim", "sglang_patches")


class RoomFinder(importlib.abc.MetaPathFinder):
    """Finds `tunectl.<room>` for the rooms that exist as packages under `root`."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.rooms = {f"tunectl.{r}": os.path.join(root, r) for r in ROOMS
                      if os.path.isfile(os.path.join(root, r, "__init__.py"))}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        folder = self.rooms.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])


def install(root: str) -> None:
    """Put a RoomFinder for `root` first on `sys.meta_path`, once, if `root` is a checkout (has pyproject.toml)."""
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return                                     # installed: package-dir already placed the rooms
    if any(isinstance(f, RoomFinder) and f.root == root for f in sys.meta_path):
        return
    finder = RoomFinder(root)
    if finder.rooms:
        sys.meta_path.insert(0, finder)
