"""One rule for a study's name in every command (it names a folder), and a secret never taken from `--set`: each
refused with one line (exit 2) before anything is written."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BAD_NAMES = ["../../escaped", "a/b", "with space", "$(touch pwned)", ".hidden", "-dash", "x" * 300]


def tunectl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunectl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def in_process(cwd: Path, *args: str) -> tuple[int, str]:
    """The CLI in this process (one interpreter start for many refusals): exit code and stderr."""
    from typer.testing import CliRunner

    from tunectl.cli import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(here)
    return res.exit_code, res.stderr


@pytest.mark.parametrize("command", [["search", "--virtual", "--trials", "1", "--study"],
                                     ["search", "--virtual", "--trials", "1", "--warm-start"],
                                     ["sweep", "-c", "1", "--study"]])
def test_a_bad_study_name_is_one_line_in_every_command(tmp_path: Path, command: list[str]) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    for name in BAD_NAMES:
        code, err = in_process(work, *command, name)
        assert code == 2, (name, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "a study name is 1-100 letters" in lines[0], (name, err)
        assert len(lines[0]) < 400                                          # a 300-character name is cut
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]        # nothing made, inside or out


@pytest.mark.parametrize("flag", ["api-key", "api_key", "admin-api-key"])
def test_a_secret_flag_in_set_is_refused_and_never_printed(tmp_path: Path, flag: str) -> None:
    secret = "s3cr3t-do-not-store"
    for extra in (["--dry-run"], ["--study", "leak"]):
        res = tunectl(tmp_path, "sweep", "-c", "1", "--set", f"{flag}={secret}", *extra)
        assert res.returncode == 2, res.stderr[-2000:]
        assert "a secret is never given on the command line" in res.stderr and "export SGLANG_API_KEY" in res.stderr
        assert secret not in res.stdout + res.stderr
    assert not (tmp_path / "results").exists()
