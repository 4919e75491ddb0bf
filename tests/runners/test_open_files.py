"""A level of more streams than the soft limit of open files allows: the client raises its limit within the hard
one, as sglang.bench_serving does, and so does the stand-in, as SGLang's server does; a stock soft limit of 1,024 no
longer fails a level of 1,024 streams with "Too many open files"."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.profiles import fast_default

ROOT = Path(__file__).resolve().parents[2]
SOFT = 256


def _low_soft_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4 * SOFT, reason="the hard limit is too low")
def test_a_level_of_more_streams_than_the_soft_limit_runs_every_request(tmp_path: Path) -> None:
    profile, _ = fast_default(tmp_path, time_scale=None)
    res = subprocess.run([sys.executable, "-m", "tunectl", "sweep", "-p", str(profile), "-c", str(2 * SOFT),
                          "--study", "u", "--results", str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False, preexec_fn=_low_soft_limit)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    [lv] = json.loads((tmp_path / "r" / "u" / "trials" / "0" / "trial.json").read_text())["levels"]
    assert lv["status"] == "ok", lv
    assert lv["completed"] > 2 * SOFT and lv["failed_requests"] == 0, lv
