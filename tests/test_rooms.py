"""The top-level code folders are `tunectl.<room>` in a checkout, and nothing else of the checkout is."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

from tunectl._rooms import ROOMS

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True,
                          timeout=60)


def test_rooms_resolve_to_the_top_level_folders() -> None:
    code = ("import importlib\n"
            f"for r in {ROOMS!r}:\n"
            "    print(importlib.import_module('tunectl.' + r).__path__[0])\n"
            "import tunectl.runners.hosts.ssh as s; print(s.__file__)")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(ROOT / room) for room in ROOMS] + [str(ROOT / "runners/hosts/ssh.py")]


def test_the_rest_of_the_checkout_is_not_part_of_the_package() -> None:
    code = ("import importlib, tunectl\n"
            "for name in ('tunectl.tunectl', 'tunectl.tests', 'tunectl.bench', 'tunectl.profiles', 'tunectl.docs'):\n"
            "    try:\n        importlib.import_module(name)\n    except ImportError:\n        continue\n"
            "    print(name)\n"
            "print(list(tunectl.__path__))")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == [repr([str(ROOT / "tunectl")])]


def test_install_mapping_names_the_same_rooms() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {k: v for k, v in setup["package-dir"].items() if k != "tunectl"}
    data_only = {"tunectl.profiles": "profiles"}      # YAML read at run time (the default profile), never imported
    assert mapped == {**{f"tunectl.{r}": r for r in ROOMS}, **data_only}
    assert not [p for d in data_only.values() for p in (ROOT / d).rglob("*.py")]
    on_disk = {str(p.parent.relative_to(ROOT)).replace("/", ".") for room in ROOMS
               for p in (ROOT / room).rglob("__init__.py")}
    assert {"tunectl." + d for d in on_disk} <= set(setup["packages"])


def test_launch_server_runs_as_a_module_from_a_checkout() -> None:
    r = subprocess.run([sys.executable, "-m", "tunectl.sim.launch_server", "--help"], cwd="/", capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.returncode == 0 and "--model-path" in r.stdout


def test_every_package_folder_ships_in_the_wheel() -> None:
    # pyproject's `packages` lists each package by name: one left out installs without its modules (a checkout
    # still runs, so only an installed tunectl would fail)
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            dotted = ".".join((name, *rel.parts)) if rel.parts else name
            if not any(part in ("__pycache__", "tests") for part in rel.parts):
                found.add(dotted)
    assert found - listed == set()
    assert {"tunectl.search.rules", "tunectl.wiring", "tunectl.sglang.crashes"} <= found
