"""The stand-in runs with the interpreter that runs tunectl, never the `python3` a login shell finds first; an
engine that cannot start (no interpreter, module missing) is one line before the first launch, exit 1."""
from __future__ import annotations

import json
import os
import site
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port
from tunectl.profile import Profile, default_profile_path

pytestmark = pytest.mark.slow


def _profile(tmp_path: Path, **server: object) -> Path:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"].update({"port": free_port(), **server})
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "host")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _wrong_python(tmp_path: Path, flags: str = "-I -S", env: str = "") -> Path:
    """A `python3` as a login shell might find it: runs, but without tunectl (no site-packages, isolated)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    py = bindir / "python3"
    py.write_text(f'#!/bin/sh\n{env}exec "{sys.executable}" {flags} "$@"\n')
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return py


def _cli(tmp_path: Path, *args: str, path_first: Path | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-c", "from tunectl.cli import app; app()", *args,
                           "--results", str(tmp_path / "results")], capture_output=True, text=True,
                          timeout=240, env=env, check=False, cwd=cwd)


def test_the_default_interpreter_is_the_one_running_tunectl() -> None:
    prof = Profile.model_validate({"name": "x", "model": {"path": "m"}})
    assert prof.server.python == sys.executable
    ssh_sglang = Profile.model_validate({"name": "x", "model": {"path": "m"}, "server": {"engine": "sglang"},
                                         "host": {"kind": "ssh", "address": "gpu1"}})
    assert ssh_sglang.server.python == "python3"          # a remote SGLang: the host's own interpreter


def test_a_wrong_python3_first_on_path_does_not_matter(tmp_path: Path) -> None:
    wrong = _wrong_python(tmp_path)
    res = _cli(tmp_path, "sweep", "-p", str(_profile(tmp_path)), "-c", "1", "--json", "--study", "s",
               path_first=wrong.parent)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok", doc.get("crash")
    assert doc["launch"]["exec_argv"][0] == sys.executable


@pytest.mark.parametrize("command", [["sweep", "-c", "1", "--study", "s"], ["search", "--trials", "2"]])
def test_an_engine_that_cannot_start_is_one_line_before_any_launch(tmp_path: Path, command: list[str]) -> None:
    prof = _profile(tmp_path, python=str(_wrong_python(tmp_path)))
    res = _cli(tmp_path, command[0], "-p", str(prof), *command[1:])
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "the engine cannot start" in lines[0] and "tunectl.sim" in lines[0]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_tunectl_importable_only_from_the_current_directory_is_caught_before_any_launch(tmp_path: Path) -> None:
    # a checkout run without installing it: its interpreter imports tunectl from the current directory (`-c`),
    # the server's `python -m` in its working directory does not; that is one line before the study, not a
    # study whose every trial crashes
    root = Path(__file__).resolve().parents[1]
    # the dependencies on the path, the site's .pth files (an editable install's finder) not read
    deps = os.pathsep.join(site.getsitepackages())
    py = _wrong_python(tmp_path, "-S", f'PYTHONPATH="{deps}" ')
    prof = _profile(tmp_path, python=str(py))

    def imports(cwd: Path) -> bool:
        return subprocess.run([str(py), "-c", "import tunectl.sim"], cwd=cwd, capture_output=True).returncode == 0

    if imports(tmp_path):
        pytest.skip("tunectl is installed as a plain package here: importable from anywhere")
    assert imports(root)                                                   # the check used to pass on this
    res = _cli(tmp_path, "search", "-p", str(prof), "--trials", "2", cwd=root)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "the engine cannot start" in res.stderr and "No module named" in res.stderr, res.stderr
    assert not (tmp_path / "host").exists() or not any((tmp_path / "host").rglob("server.log"))


def test_a_missing_interpreter_is_named(tmp_path: Path) -> None:
    prof = _profile(tmp_path, python=str(tmp_path / "no-such-python"))
    res = _cli(tmp_path, "sweep", "-p", str(prof), "-c", "1")
    assert res.returncode == 1
    assert "the engine cannot start" in res.stderr and "no-such-python" in res.stderr
