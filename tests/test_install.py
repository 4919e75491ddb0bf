"""A non-editable install (a wheel, as `pip install .` builds it) carries everything tunectl reads at run time: the
embedded default profile, the stand-in's cards, the bundled SGLang --help texts and patches. The wheel is built
from a copy of this checkout, installed into a folder of its own and run from a directory outside any checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "results", "build", "dist", "*.egg-info", "__pycache__",
                                  ".pytest_cache", ".cache", ".whl", ".gpu")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, work / "src", ignore=LEFT_OUT)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(work / "dist"), str(work / "src")],
                           capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((work / "dist").glob("tunectl-*.whl"))
    got = subprocess.run([*pip, "install", "--no-deps", "--target", str(work / "site"), str(wheel)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert got.returncode == 0, got.stderr[-3000:]
    return work / "site"


def tunectl(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "tunectl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_installed_package_is_the_one_that_runs(site: Path, tmp_path: Path) -> None:
    res = tunectl(site, tmp_path, "--version")
    assert res.returncode == 0, res.stderr
    where = subprocess.run([sys.executable, "-c", "import tunectl; print(tunectl.__file__)"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)


def test_the_default_profile_card_and_patches_come_from_the_install(site: Path, tmp_path: Path) -> None:
    res = tunectl(site, tmp_path, "sweep", "--dry-run", "--json", "--set", "flashinfer-cutlass-autotune=true")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert "--sim-card" in plan["argv"] and "0001-flashinfer-cutlass-autotune" in json.dumps(plan["patches"])
    res = tunectl(site, tmp_path, "search", "--virtual", "--trials", "2", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["trials"] == 2 and out["best"] is not None
    assert (tmp_path / out["results_dir"] / "study.db").is_file()         # under the directory it ran in


def test_a_real_launch_runs_from_the_install(site: Path, tmp_path: Path) -> None:
    data = yaml.safe_load((site / "tunectl" / "profiles" / "sim-glm5.yaml").read_text())
    data["server"]["port"] = free_port()
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "host")}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    res = tunectl(site, tmp_path, "sweep", "-p", "p.yaml", "-c", "1", "--json",
                  "--set", "flashinfer-cutlass-autotune=true")          # a bundled patch applied to the stand-in
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and [lv["status"] for lv in doc["levels"]] == ["ok"], doc


def test_sample_traces_ship_with_their_profile(site: Path, tmp_path: Path) -> None:
    prof = site / "tunectl" / "profiles" / "sim-glm5-trace.yaml"
    assert (site / "tunectl" / "profiles" / "traces" / "mooncake-sample.jsonl").is_file()
    assert (site / "tunectl" / "profiles" / "traces" / "azure-sample.csv").is_file()
    res = tunectl(site, tmp_path, "sweep", "-p", str(prof), "--dry-run", "--json")   # the trace read and checked
    assert res.returncode == 0, res.stderr


def test_the_sample_datasets_come_with_the_install(site: Path, tmp_path: Path) -> None:
    data = site / "tunectl" / "profiles" / "data"
    assert {p.name for p in data.iterdir()} >= {"sharegpt-sample.json", "chat-sample.jsonl", "prompts-sample.jsonl"}
    res = tunectl(site, tmp_path, "search", "--virtual", "--trials", "2", "--json", "-p",
                  str(site / "tunectl" / "profiles" / "sim-glm5-chat.yaml"))
    assert res.returncode == 0, res.stderr
    levels = json.loads(res.stdout)["best"]["ladder"]
    assert {lv["workload"] for lv in levels} == {"chat", "sharegpt", "random"}
