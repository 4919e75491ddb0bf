"""Which options go on the command line instead of `--config`: derived from each version's parser source (the rule
of SGLang's ConfigArgumentMerger), never listed by hand."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.sglang.flags import HELP_DIR, bundled_flags, config_refused, flag_index
from tunectl.profile import Profile, default_profile_path
from tunectl.runners.server.plan import build_plan
from tunectl.sglang.source import refused

PARSER = '''
import argparse
from dataclasses import dataclass
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--config", type=str)
        parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, dest="tp_size")
        parser.add_argument("--disable-radix-cache", action="store_true")
        parser.add_argument("--nsa-prefill-backend", dest="dsa_prefill_backend", action=DeprecatedAliasStoreAction)
        parser.add_argument("--lora-paths", nargs="*", action=LoRAPathAction)
        parser.add_argument("--enable-thing", action=argparse.BooleanOptionalAction)
@dataclass
class Exec:
    fused: A[Optional[bool], Arg(help="x", action=argparse.BooleanOptionalAction)] = None
    plain: A[int, Arg(help="y")] = 1
'''


def test_refused_options_are_read_from_the_parser_by_destination() -> None:
    assert refused({"srt/server_args.py": PARSER}) == {
        "dsa_prefill_backend": "DeprecatedAliasStoreAction", "enable_thing": "BooleanOptionalAction",
        "fused": "BooleanOptionalAction", "lora_paths": "LoRAPathAction"}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.17", "0.5.23"])
def test_each_bundled_version_has_its_refusals_and_they_agree_with_its_help(version: str) -> None:
    data = json.loads((HELP_DIR / f"launch_server-{version}.config.json").read_text())
    assert data["sglang_version"] == version and data["refused"] == config_refused(version)
    text = (HELP_DIR / f"launch_server-{version}.txt").read_text()
    both = {m.replace("-", "_") for m in re.findall(r"^  --([a-z0-9-]+), --no-\1\b", text, re.M)}
    assert both <= set(data["refused"])                     # every --x/--no-x pair is a BooleanOptionalAction
    dests = {s.dest for s in bundled_flags(version).values()} | {a.lstrip("-").replace("-", "_")
                                                                 for s in bundled_flags(version).values()
                                                                 for a in s.aliases}
    assert set(data["refused"]) <= dests | {m.lower() for m in re.findall(r" ([A-Z_]{4,})\b", text)}


def test_the_real_0517_refusal_is_among_them() -> None:
    real = Path(__file__).parent / "fixtures" / "logs" / "h200-tunectl" / "config-option-unsupported.log"
    dest, action = re.search(r"Unsupported config option '(\w+)' with action '(\w+)'", real.read_text()).groups()
    assert config_refused("0.5.17")[dest] == action
    assert dest not in config_refused("0.5.9")


def test_refused_options_go_on_the_command_line_without_argv_flags() -> None:
    import yaml

    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["sglang_version"] = "0.5.17"
    data["server"]["flags"]["dsa-decode-backend"] = data["server"]["flags"].pop("nsa-decode-backend")
    prof = Profile.model_validate(data)
    plan = build_plan(prof, {"max-running-requests": 256}, "r", "/t")
    assert "dsa-decode-backend" not in plan.config and "--dsa-decode-backend" in plan.exec_argv
    assert plan.config["nsa-prefill-backend"] == "tilelang"        # the deprecated name is fine in the file
    assert plan.config["max-running-requests"] == 256


def test_versions_add_reads_an_unpacked_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "sglang"
    (src / "srt" / "arg_groups").mkdir(parents=True)
    (src / "srt" / "server_args.py").write_text(PARSER)
    monkeypatch.setattr("tunectl.sglang.flags.HELP_DIR", tmp_path)
    monkeypatch.setattr("tunectl.commands.versions.HELP_DIR", tmp_path)
    res = CliRunner().invoke(app, ["versions", "add", "--source", str(src), "--version", "9.9.9"])
    assert res.exit_code == 0, res.output
    assert config_refused("9.9.9")["dsa_prefill_backend"] == "DeprecatedAliasStoreAction"
    bad = CliRunner().invoke(app, ["versions", "add", "--source", str(tmp_path), "--version", "9.9.9"])
    assert bad.exit_code == 2 and "no srt/server_args.py there" in bad.output


def test_versions_diff_and_move_on_the_command_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["versions", "diff", "0.5.9", "0.5.23"])
    assert res.exit_code == 0
    assert "--cuda-graph-max-bs -> --cuda-graph-max-bs-decode" in res.output
    assert "--tensor-parallel-size ->" not in res.output                     # an alias is not a rename
    out = tmp_path / "moved.yaml"
    res = CliRunner().invoke(app, ["versions", "move", "--to", "0.5.23", "--out", str(out)])
    assert res.exit_code == 0, res.output
    from tunectl.profile import load_profile

    moved = load_profile(out)
    assert moved.server.sglang_version == "0.5.23" and "cuda-graph-max-bs-decode" in moved.search.space
    assert all(k in flag_index(bundled_flags("0.5.23")) for k in moved.server.flags)


def test_versions_add_reads_help_and_parser_from_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with a (tiny) SGLang installed: its --help is run there, its parser source read there (not imported)."""
    import os
    import sys

    import yaml

    site = tmp_path / "site"
    pkg = site / "sglang"
    (pkg / "srt" / "arg_groups").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "server_args.py").write_text("raise SystemExit('never imported')\n" + PARSER)
    help_text = (HELP_DIR / "launch_server-0.5.17.txt").read_text()
    (pkg / "launch_server.py").write_text(f"print({help_text!r})\n")
    dist = site / "sglang-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"name": "h", "model": {"path": "m"}, "server": {
        "engine": "sglang", "python": sys.executable, "sglang_version": "9.9.9"}}))
    monkeypatch.setattr("tunectl.sglang.flags.HELP_DIR", tmp_path)
    monkeypatch.setattr("tunectl.commands.versions.HELP_DIR", tmp_path)
    res = CliRunner().invoke(app, ["versions", "add", "-p", str(prof)])
    assert res.exit_code == 0, res.output
    assert "SGLang 9.9.9: 4 options the --config file refuses, 471 flags" in res.output
    assert (tmp_path / "launch_server-9.9.9.txt").read_text().strip() == help_text.strip()
    assert config_refused("9.9.9")["lora_paths"] == "LoRAPathAction"
