"""`tunectl check` and `tunectl hosts trust` end to end: the stand-in profile on this machine and through a real
sshd; a flag missing from the host's --help is caught before any launch; host names are data."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.runners.sshd import ALIAS, free_port, make_ssh_runner, ssh_home, ssh_host, sshd  # noqa: F401
from tests.runners.test_patches import install, pristine  # noqa: F401
from tunectl import REPO_ROOT
from tunectl.cli import app


def run_cli(*args: str, input: str | None = None):
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "240"}, input=input)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def row(output: str, name: str) -> str:
    m = re.search(rf"^│ {re.escape(name)}\s+│ (pass|FAIL)\s+│ (.*?)\s*│", output, re.MULTILINE)
    assert m, output
    return f"{m.group(1)} {m.group(2)}"


def write_profile(tmp_path: Path, host: dict | None = None, space: dict | None = None) -> str:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml").read_text())
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "work"), **(host or {})}
    data["server"]["port"] = free_port()
    data["search"]["space"].update(space or {})
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))     # --help cache and known_hosts stay per test
    monkeypatch.chdir(tmp_path)


def test_local_stand_in_profile(tmp_path):
    out = run_cli("check", "-p", write_profile(tmp_path)).output
    for name in ("host", "python", "sglang", "port", "disk", "flags", "patches"):
        assert row(out, name).startswith("pass"), out
    assert "flags valid in the host's --help" in row(out, "flags")
    assert row(out, "gpus").startswith("pass not needed by the stand-in")       # no nvidia-smi here


def test_a_server_reachable_from_other_machines_is_said_so(tmp_path):
    """A bind address other than loopback passes (serving teams use 0.0.0.0) but is named: the search's servers
    need no other address, their clients run beside them."""
    assert "listens on" not in row(run_cli("check", "-p", write_profile(tmp_path)).output, "port")
    path = Path(write_profile(tmp_path))
    data = yaml.safe_load(path.read_text())
    data["server"]["host"] = "0.0.0.0"
    path.write_text(yaml.safe_dump(data))
    assert row(run_cli("check", "-p", str(path)).output, "port").endswith(
        "free; the server listens on 0.0.0.0: other machines can reach it")


def test_backends_the_gpu_has_no_kernels_for_are_named_and_a_baseline_on_one_fails(tmp_path):
    # the stand-in's card plays RTX PRO 6000 Blackwell workstation GPUs (compute capability 12.0): TRT-LLM-gen MoE
    # kernels exist for 10.x only, so the search never runs that choice; as trial 0's runner it would crash
    out = run_cli("check", "-p", write_profile(tmp_path)).output
    assert row(out, "backends") == ("pass NVIDIA RTX PRO 6000 Blackwell Server Edition (compute capability 12.0): "
                                    "never runs moe-runner-backend flashinfer_trtllm (no kernels for this GPU)")
    spec = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml").read_text())["search"]["space"][
        "moe-runner-backend"]
    res = run_cli("check", "-p", write_profile(tmp_path, space={"moe-runner-backend": {
        **spec, "default": "flashinfer_trtllm"}}))
    assert res.exit_code == 1
    assert row(res.output, "backends").startswith(
        "FAIL NVIDIA RTX PRO 6000 Blackwell Server Edition (compute capability 12.0): the baseline (trial 0) would "
        "crash: --moe-runner-backend flashinfer_trtllm needs compute capability 10.x; this GPU is 12.0")


def test_flag_missing_from_host_help_fails_before_launch(tmp_path):
    prof = write_profile(tmp_path, space={"mem-fraction-statc": {"type": "float", "low": 0.8, "high": 0.9}})
    res = run_cli("check", "-p", prof)
    assert res.exit_code == 1
    flags = row(res.output, "flags")
    assert flags.startswith("FAIL") and "search.space.mem-fraction-statc" in flags
    assert "did you mean --mem-fraction-static?" in res.output
    assert not (tmp_path / "work").exists()                                   # nothing was launched


@pytest.mark.sshd
def test_ssh_unknown_key_then_trust_then_pass(tmp_path, ssh_home, sshd):
    known = ssh_home / ".ssh" / "known_hosts"
    known.write_text("")
    prof = write_profile(tmp_path, host={"kind": "ssh", "address": ALIAS, "connect_timeout_s": 5})
    res = run_cli("check", "-p", prof)
    assert res.exit_code == 1 and row(res.output, "host").startswith("FAIL host key of [127.0.0.1]:")
    assert f"tunectl hosts trust {ALIAS}" in res.output and "SHA256:" in res.output
    refused = run_cli("hosts", "trust", ALIAS, input="n\n")
    assert refused.exit_code == 1 and known.read_text() == ""
    offered = re.search(r"SHA256:\S+", refused.output).group(0)
    ok = run_cli("hosts", "trust", ALIAS, "--yes")
    assert ok.exit_code == 0 and offered in ok.output
    assert known.read_text().strip() == sshd.known_hosts_line
    assert "already trusted" in run_cli("hosts", "trust", ALIAS).output
    out = run_cli("check", "-p", prof).output
    assert row(out, "host") == "pass ssh:tunectl-test reachable, host key trusted"
    assert row(out, "flags").startswith("pass") and row(out, "sglang").startswith("pass")


@pytest.mark.sshd
def test_trust_refuses_a_changed_key(tmp_path, ssh_home, sshd):
    from tests.runners.sshd import keygen

    other = keygen(tmp_path / "impostor").split()
    (ssh_home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    res = run_cli("hosts", "trust", ALIAS, "--yes")
    assert res.exit_code == 3 and "ssh-keygen -R" in res.output
    assert len((ssh_home / ".ssh" / "known_hosts").read_text().splitlines()) == 1


@pytest.mark.parametrize("name", ["gpu;touch PWNED", "$(touch PWNED)", "`touch PWNED`", "-oProxyCommand=touch PWNED"])
def test_host_names_are_data(tmp_path, name):
    prof = write_profile(tmp_path, host={"kind": "ssh", "address": name, "connect_timeout_s": 1})
    res = run_cli("check", "-p", prof)
    assert res.exit_code == 1 and row(res.output, "host").startswith("FAIL")
    trust = run_cli("hosts", "trust", name, "--yes")
    assert trust.exit_code != 0 and "Traceback" not in trust.output
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def sglang_profile(tmp_path: Path, python: str, version: str):
    from tunectl.profile import load_profile

    prof = load_profile(write_profile(tmp_path), {"server.engine": "sglang", "server.python": python,
                                                  "server.sglang_version": version})
    return prof


def test_checks_on_real_sglang_059_source(tmp_path, install):
    """engine sglang: version found through the profile's python, patches dry-run on the real 0.5.9 source,
    flags validated against SGLang 0.5.9's own --help (seeded into the per-host cache: launching the real
    `--help` needs torch)."""
    from tunectl.sglang.flags import HELP_DIR
    from tunectl.runners.checks import flagcheck
    from tunectl.runners.checks.readiness import run_checks
    from tunectl.runners.hosts.local import LocalRunner

    python, pkg = install
    runner = LocalRunner()
    prof = sglang_profile(tmp_path, python, "0.5.9")
    cached = flagcheck.cache_path(runner, prof, "0.5.9")
    cached.parent.mkdir(parents=True)
    cached.write_text((HELP_DIR / "launch_server-0.5.9.txt").read_text())
    checks = {c.name: c for c in run_checks(prof, runner)}
    assert checks["sglang"].ok and checks["sglang"].detail == f"sglang 0.5.9 at {pkg}"
    assert checks["patches"].ok and checks["patches"].detail == "1 patch(es) apply to sglang 0.5.9"
    assert checks["flags"].ok, checks["flags"].detail
    assert not checks["gpus"].ok and "nvidia-smi is not on the host's PATH" in checks["gpus"].detail
    assert not (pkg / ".tunectl-patches" / "state.json").exists() or "applied\": []" in (
        pkg / ".tunectl-patches" / "state.json").read_text()                      # a dry run changes nothing

    wrong = {c.name: c for c in run_checks(sglang_profile(tmp_path, python, "0.5.17"), runner)}
    assert not wrong["sglang"].ok and "profile says 0.5.17, host has sglang 0.5.9" in wrong["sglang"].detail
    assert wrong["sglang"].fix == 'set server.sglang_version: "0.5.9" or install sglang==0.5.17'


@pytest.mark.sshd
def test_trust_through_proxyjump(tmp_path, ssh_home, sshd):
    from tests.runners.sshd import JUMP_ALIAS

    assert "already trusted" in run_cli("hosts", "trust", JUMP_ALIAS).output     # read through the jump host
    (ssh_home / ".ssh" / "known_hosts").write_text("")
    res = run_cli("hosts", "trust", JUMP_ALIAS, "--yes")                          # the jump host is unknown too
    assert res.exit_code == 3 and "tunectl hosts trust tunectl-test" in res.output
