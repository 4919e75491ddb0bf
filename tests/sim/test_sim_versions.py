"""The stand-in plays the SGLang version the profile names: 0.5.9, 0.5.17 or 0.5.23 (their bundled --help flag
sets, their --config refusals), and its model reads each version's names of one setting alike."""
from __future__ import annotations

from pathlib import Path

import pytest

from tunectl.sim import args as sim_args


def test_0523_finds_the_removed_cuda_graph_max_bs_ambiguous_like_the_real_parser(capsys: pytest.CaptureFixture[str]
                                                                                 ) -> None:
    sim_args.parse(["--cuda-graph-max-bs", "32", "--sim-sglang-version", "0.5.17"])       # an alias on 0.5.17
    with pytest.raises(SystemExit) as e:
        sim_args.parse(["--cuda-graph-max-bs", "32", "--sim-sglang-version", "0.5.23"])
    assert e.value.code == 2 and "ambiguous option: --cuda-graph-max-bs" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_each_versions_names_reach_the_model_as_one_setting(version: str) -> None:
    """Live (the parsed command line) and virtual (a profile's flags, tunectl/wiring/virtual.py): the model reads
    0.5.17's and 0.5.23's names as 0.5.9's."""
    from tunectl.sim.setup import normalize

    old = normalize(sim_args.model_config(sim_args.parse(["--cuda-graph-max-bs", "64", "--nsa-prefill-backend",
                                                          "tilelang"])))
    new = normalize(sim_args.model_config(sim_args.parse(["--cuda-graph-max-bs-decode", "64", "--dsa-prefill-backend",
                                                          "tilelang", "--sim-sglang-version", version])))
    virtual = normalize({"cuda-graph-max-bs-decode": 64, "dsa-prefill-backend": "tilelang"})
    keys = ("cuda_graph_max_bs", "nsa_prefill_backend")
    assert {k: old[k] for k in keys} == {k: new[k] for k in keys} == {k: virtual[k] for k in keys} == {
        "cuda_graph_max_bs": 64, "nsa_prefill_backend": "tilelang"}


def test_0523_refuses_in_a_config_file_what_its_parser_refuses(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("enable-dp-attention: true\n")
    with pytest.raises(ValueError, match="Unsupported config option 'enable_dp_attention' with action "
                                         "'DeprecatedStoreTrueAction'"):
        sim_args.parse(["--config", str(cfg), "--sim-sglang-version", "0.5.23"])
    sim_args.parse(["--config", str(cfg)])                                   # 0.5.9 takes it
