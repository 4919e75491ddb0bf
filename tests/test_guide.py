"""docs/guide.md, run as written: every `tunectl` line of its shell blocks, in order, against the stand-in behind a
real OpenSSH server on loopback that the alias `gpu-box` points at, with the guide's own profile changed only as its
"Rehearse without a GPU" section says (and shortened). Each step is checked for what it leaves behind."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port
from tests.runners.sshd import Sshd, sshd  # noqa: F401  (fixture)

pytestmark = [pytest.mark.sshd, pytest.mark.slow]
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
SECRET = "hf_guide_secret_value_0042"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", GUIDE.read_text(), re.S | re.M)


def guide_commands() -> list[str]:
    return [line.strip() for b in blocks("bash") for line in b.splitlines() if line.startswith("tunectl ")]


def guide_profile() -> dict:
    return yaml.safe_load(next(b for b in blocks("yaml") if b.startswith("name:")))


def rehearsal(prof: dict, workdir: Path) -> dict:
    """The guide's three changes for the stand-in, plus a short search on a free port and a private workdir."""
    prof["server"].update(engine="sim", port=free_port(), sim={"card": "llama31-8b-h200", "time_scale": 0.005})
    del prof["server"]["python"]
    prof["host"]["workdir"] = str(workdir)
    prof["search"].update(trials=2, finalists={"top_k": 0})
    prof["bench"]["levels"] = [1, 16]
    prof["bench"]["workloads"][0].update(prompts_per_level=1, min_prompts=2)
    return prof


def _home(tmp: Path, server: Sshd) -> Path:
    """The user's HOME: the guide's alias pointing at the test sshd, and no known host key yet."""
    ssh = tmp / "home" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    (ssh / "config").write_text(f"Host gpu-box\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
                                f"  IdentityFile {server.user_key}\n")
    return ssh.parent


def _tunectl_on_path(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "tunectl").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tunectl \"$@\"\n")
    (bin_dir / "tunectl").chmod(0o755)
    return bin_dir


def test_the_guide_names_every_step_in_order(tmp_path):
    from tunectl.sglang.flags import bundled_flags
    from tunectl.profile import load_profile

    subcommands = [" ".join(c.split()[1:3]) if c.split()[1] == "hosts" else c.split()[1] for c in guide_commands()]
    assert subcommands == ["hosts trust", "check", "sweep", "sweep", "search", "trials", "report", "best", "best",
                           "diff", "export"]
    (tmp_path / "gpu-box.yaml").write_text(yaml.safe_dump(guide_profile()))
    prof = load_profile(tmp_path / "gpu-box.yaml")          # the real-host profile as printed is valid
    assert prof.host.kind == "ssh" and prof.server.engine == "sglang" and prof.server.python.startswith("/opt/")
    known = bundled_flags(prof.server.sglang_version)        # and every knob and base flag is a flag of its version
    names = {k.replace("_", "-") for k in known}
    assert set(prof.search.space) | set(prof.server.flags) <= names, (set(prof.search.space) - names)


def test_the_guides_commands_run_as_written_on_the_stand_in_over_ssh(tmp_path, sshd):  # noqa: F811
    home, work = _home(tmp_path, sshd), tmp_path / "work"
    work.mkdir()
    (work / "gpu-box.yaml").write_text(yaml.safe_dump(rehearsal(guide_profile(), tmp_path / "remote")))
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(HOME=str(home), PATH=f"{_tunectl_on_path(tmp_path)}:{env['PATH']}", COLUMNS="200",
               HF_TOKEN=SECRET)
    out = {}
    for command in guide_commands():
        res = subprocess.run(["bash", "-c", command], cwd=work, env=env, input="y\n", capture_output=True,
                             text=True, timeout=400, check=False)
        assert res.returncode == 0, (command, res.stdout[-3000:], res.stderr[-3000:])
        assert "Traceback" not in res.stderr and SECRET not in res.stdout + res.stderr, command
        out[command] = res.stdout
    results = work / "results"
    assert sshd.host_pub.split()[1] in (home / ".ssh" / "known_hosts").read_text()
    assert re.search(r"all \d+ checks passed", out["tunectl check -p gpu-box.yaml"])
    assert (results / "defaults" / "trials" / "0" / "trial.json").is_file()
    assert (results / "llama8b" / "best.json").is_file() and (results / "llama8b" / "report.html").is_file()
    assert "llama8b: " in out["tunectl trials"]
    paste = out["tunectl best"].strip().splitlines()[-1]
    assert paste.startswith('HF_TOKEN="${HF_TOKEN}" CUDA_VISIBLE_DEVICES=0 python3 -m sglang.launch_server ')
    assert "--sim-" not in paste and sys.executable not in paste and str(tmp_path) not in paste
    winner = yaml.safe_load((work / "winner.yaml").read_text())
    assert winner["model-path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "defaults:0" in out["tunectl diff defaults llama8b"]
    assert (results / "llama8b" / "llama8b-trials.csv").is_file()
    leaked = [p for p in results.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == []
