"""The stand-in playing SGLang 0.5.17 (`server.sglang_version: "0.5.17"`), as the real 0.5.17 behaved on the H200
(docs/real-gpu.md): its flag names, its --config parser's refusals, its startup warning, bundled patch 0003's log
line. Real logs: tests/fixtures/logs/h200-ssh/ and docs/real-gpu/ssh-moe/."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port
from tunectl.profile import default_profile_path
from tunectl.sim import args as sim_args

REAL = Path(__file__).resolve().parents[2] / "docs" / "real-gpu" / "ssh-moe" / "results"


def profile(tmp_path: Path, argv_flags: list[str], **flags) -> Path:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"].update(sglang_version="0.5.17", port=free_port(), argv_flags=argv_flags,
                          patches=["0003-log-moe-runner"])
    base = {k: v for k, v in data["server"]["flags"].items() if k != "cuda-graph-max-bs"}
    data["server"]["flags"] = {**base, "cuda-graph-max-bs-decode": 64, **flags}
    data["server"]["sim"]["time_scale"] = 0.05
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "host")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep(tmp_path: Path, prof: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", "from tunectl.cli import app; app()", "sweep", "-p", str(prof),
                          "-c", "1,8", "--json", "--study", "s", "--results", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=240, check=False)
    return json.loads(res.stdout[res.stdout.index("{"):])


def test_new_option_names_refused_in_a_config_file_like_real_0517() -> None:
    """0.5.17 refuses an option in --config when a deprecated alias shares its destination: the new names."""
    real = "Unsupported config option 'cuda_graph_backend_prefill' with action 'DeprecatedStoreConstAction'"
    assert real in (Path(__file__).parents[1] / "fixtures" / "logs" / "h200-tunectl" /
                    "config-option-unsupported.log").read_text()
    refused = sim_args.CONFIG_UNSUPPORTED["0.5.17"]
    assert refused["cuda_graph_backend_prefill"] == "DeprecatedStoreConstAction"
    for new in ("cuda_graph_max_bs_decode", "dsa_prefill_backend", "dsa_decode_backend", "disable_cuda_graph"):
        assert new in refused and new not in sim_args.CONFIG_UNSUPPORTED["0.5.9"]
    assert "nsa_prefill_backend" not in refused                        # the old name is accepted (deprecated)


def test_0517_flags_on_the_command_line_serve_with_the_patch_line(tmp_path: Path) -> None:
    doc = sweep(tmp_path, profile(tmp_path, ["cuda-graph-max-bs-decode"]))
    assert doc["status"] == "ok", doc.get("crash")
    log = (Path(doc["results_dir"]) / "server.log").read_text()
    line = next(ln for ln in log.splitlines() if "tunectl patch 0003:" in ln)
    real = next(ln for ln in (REAL / "ssh-sweep" / "trials" / "0" / "server.log").read_text().splitlines()
                if "tunectl patch 0003:" in ln)
    assert line.split("] ", 1)[1].split(": ")[0] == real.split("] ", 1)[1].split(": ")[0]
    assert "moe_runner_backend=flashinfer_cutlass, moe_a2a_backend=none, flashinfer_autotune=on" in line
    assert "'sglang serve' is the recommended entrypoint" in log
    assert "cuda_graph_max_bs_decode=64" in log                        # the 0.5.17 name reached the server


def test_a_0517_option_its_config_merger_refuses_goes_on_the_command_line_unasked(tmp_path: Path) -> None:
    """No server.argv_flags: which options go on the command line is derived from 0.5.17's parser."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cuda-graph-max-bs-decode: 64\n")
    with pytest.raises(ValueError, match="Unsupported config option 'cuda_graph_max_bs_decode' with action "
                                         "'DeprecatedAliasStoreAction'"):
        sim_args.parse(["--config", str(cfg), "--sim-sglang-version", "0.5.17"])     # as real 0.5.17 refuses it
    doc = sweep(tmp_path, profile(tmp_path, []))
    assert doc["status"] == "ok", doc.get("crash")
    assert "cuda_graph_max_bs_decode=64" in (Path(doc["results_dir"]) / "server.log").read_text()
