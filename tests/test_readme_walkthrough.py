"""The README's commands as a new user runs them, where they once did other than the README says: a dry run held
to the one study-name rule, a confirm's `--name` named as such, and `--client bench_serving` without SGLang
installed saying why its levels fail."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_names_and_secrets import in_process


@pytest.mark.parametrize("name", ["a/b", "../escaped", "with space"])
def test_sweep_dry_run_refuses_a_bad_study_name_as_the_real_sweep_does(tmp_path: Path, name: str) -> None:
    outcomes = []
    for extra in (["--dry-run"], ["-c", "1"]):
        code, err = in_process(tmp_path, "sweep", *extra, "--study", name)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "a study name is 1-100 letters" in lines[0], (extra, err[-2000:])
        outcomes.append((code, lines[0]))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == 2          # the dry run says what the run would
    assert list(tmp_path.iterdir()) == []                                # nothing written


def test_confirm_names_the_option_that_holds_a_bad_name(tmp_path: Path) -> None:
    code, err = in_process(tmp_path, "confirm", "--set", "max-running-requests=1024", "--dry-run", "--name", "x/y")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("error: --name: 'x/y'") and "a study name is" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []


def test_bench_serving_without_sglang_says_the_client_is_missing() -> None:
    """What an interpreter without SGLang prints for `-m sglang.bench_serving` (site-packages off, so the same on
    a host with SGLang installed) is read as a missing client, not a bare 'exit 1, no result'."""
    from tunectl.runners.clients.bench_serving import interpret

    res = subprocess.run([sys.executable, "-I", "-S", "-m", "sglang.bench_serving", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "No module named" in res.stderr, res.stderr
    got = interpret(res.returncode, res.stdout + res.stderr, None, num_prompts=16)
    assert got.status == "error" and got.metrics == {}
    assert "no SGLang client" in got.message and "server.python" in got.message, got.message
    assert "--client builtin" in got.message
