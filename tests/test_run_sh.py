"""tests/run.sh, the README's test command, on a copy of the checkout with a stand-in interpreter: it uses the
`.venv` the README's first command made (not a writable system Python), and pip's "requires X, which is not
installed" notes (sglang goes in without its GPU stack on purpose) are one line, not 40 that read like failures.
The README and .ci/run name the same command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTE = "sglang 0.5.9 requires aiohttp, which is not installed."
FAKE_PY = """#!/usr/bin/env bash
echo "$0 $*" >> "{log}"
if [ "$1 $2" = "-m pip" ]; then
  echo "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed."
  for i in 1 2 3 4 5; do echo "{note}" >&2; done
  [ -n "${{FAIL_PIP:-}}" ] && {{ echo "ERROR: No matching distribution found for nothing" >&2; exit 1; }}
fi
exit 0
"""


def _checkout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A checkout holding tests/run.sh and a `.venv` whose python records its calls; a PATH without apt-get or
    sudo (nothing is installed on this machine) whose python3 is the real one, writable site-packages and all."""
    work, log = tmp_path / "repo", tmp_path / "calls.log"
    (work / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "run.sh", work / "tests" / "run.sh")
    venv_py = work / ".venv" / "bin" / "python"
    venv_py.parent.mkdir(parents=True)
    venv_py.write_text(FAKE_PY.format(log=log, note=NOTE))
    venv_py.chmod(0o755)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "id", "dirname", "grep", "mktemp", "cat", "rm", "ls", "env"):
        found = shutil.which(tool)
        if found:
            (bin_ / tool).symlink_to(found)
    (bin_ / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "TUNECTL_VENV", "TUNECTL_TEST_WORKERS")}
    return work, log, {**env, "PATH": str(bin_)}


def test_run_sh_uses_the_venv_the_first_command_made(tmp_path: Path) -> None:
    work, log, env = _checkout(tmp_path)
    proc = subprocess.run(["bash", "tests/run.sh", "-k", "nothing"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    assert calls and all(c.startswith(".venv/bin/python ") for c in calls), calls
    assert calls[-1].endswith("-m pytest -q -n 0 --dist loadgroup -k nothing")
    out = proc.stdout + proc.stderr
    assert "which is not installed" not in out and "dependency resolver" not in out, out
    assert out.count("(5 notes that a package's own dependencies are missing") == 3      # one line per install


def test_a_failing_pip_shows_everything(tmp_path: Path) -> None:
    work, _, env = _checkout(tmp_path)
    proc = subprocess.run(["bash", "tests/run.sh"], cwd=work, env={**env, "FAIL_PIP": "1"}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "No matching distribution found" in proc.stdout and NOTE in proc.stdout


def test_the_readme_and_ci_name_the_same_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("The test command:"):]
    block = after[after.index("```bash\n") + 8:]
    assert block[:block.index("```")].strip() == "bash tests/run.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [ln for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "echo", "set ", "cd "))]
    assert steps[0] == "bash tests/run.sh"                             # the first thing CI runs, as written there
    first = readme[readme.index("```bash\n") + 8:]
    first = first[:first.index("```")].strip()                      # the README's first command, the main job
    assert steps[1] == first                                           # then the main job, as written there
    assert ".venv" in readme[readme.index("It uses the active virtual environment"):][:300]
