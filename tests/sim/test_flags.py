"""The stand-in accepts and rejects the same argv as SGLang 0.5.9's parser (flag table from the real --help)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunectl.sglang.flags import bundled_flags, did_you_mean, parse_help
from tunectl.sim.args import build_parser, merge_config, parse

FLAGS_059 = bundled_flags("0.5.9")


def _exit_code(argv: list[str]) -> int:
    try:
        parse(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_help_table_has_the_real_flags() -> None:
    assert FLAGS_059["nsa-prefill-backend"].choices == ["flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3",
                                                        "tilelang", "aiter", "trtllm"]
    assert FLAGS_059["disable-cuda-graph"].takes_value is False
    assert FLAGS_059["tensor-parallel-size"].aliases == ["--tp-size"]
    assert FLAGS_059["cuda-graph-bs"].nargs == "+"
    # 0.5.23 dropped the NSA backend flags and split --cuda-graph-max-bs (reference README)
    newer = bundled_flags("0.5.23")
    assert "nsa-prefill-backend" not in newer and "cuda-graph-max-bs" not in newer


def test_parse_help_reads_inline_help_and_choices() -> None:
    text = "options:\n  -h, --help  show\n  --port PORT           The port.\n  --mode {a,b}\n" \
           "                        Pick one.\n  --flag                Turn on.\n"
    table = parse_help(text)
    assert table["port"].metavar == "PORT" and table["port"].help == "The port."
    assert table["mode"].choices == ["a", "b"] and table["mode"].help == "Pick one."
    assert table["flag"].takes_value is False


def test_did_you_mean() -> None:
    assert did_you_mean("--cuda-graph-maxbs", FLAGS_059) == "cuda-graph-max-bs"
    assert did_you_mean("zzzz", FLAGS_059) is None


@pytest.mark.parametrize("argv,code", [
    (["--nsa-prefill-backend", "tilelang"], 0),
    (["--cuda-graph-max-bs", "8"], 0),
    (["--tp-size", "8", "--disable-cuda-graph"], 0),
    (["--made-up-flag"], 2),
    (["--kv-cache-dtype", "fp9"], 2),
    (["--moe-runner-backend", "cutlass_fast"], 2),
    (["--max-running-requests", "many"], 2),
    (["--mem-fraction-static", "high"], 2),
    (["--disable-cuda-graph", "true"], 2),
])
def test_accept_reject_parity(argv: list[str], code: int) -> None:
    assert _exit_code(["--model-path", "m", *argv]) == code


def test_every_059_flag_is_accepted() -> None:
    parser = build_parser()
    for name, spec in FLAGS_059.items():
        value = [] if not spec.takes_value else [spec.choices[0] if spec.choices else "1"]
        parser.parse_args([f"--{name}", *value])


def test_config_file_like_sglang(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tp-size: 4\ndisable-cuda-graph: true\ndisable-radix-cache: false\n"
                   "cuda-graph-bs: [1, 2, 4]\nmax-running-requests: 64\n")
    ns = parse(["--config", str(cfg), "--max-running-requests", "128"])
    assert ns.tensor_parallel_size == 4 and ns.disable_cuda_graph and not ns.disable_radix_cache
    assert ns.cuda_graph_bs == [1, 2, 4] and ns.max_running_requests == 128   # command line wins
    bad = tmp_path / "c.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="must be YAML"):
        merge_config(["--config", str(bad)], build_parser())


def test_config_file_refuses_what_sglangs_merger_refuses(tmp_path: Path) -> None:
    """0.5.9's merger rejects options whose action is neither store nor store_true (exit 1, before any GPU work)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lora-paths: [a=/x]\n")
    with pytest.raises(ValueError, match="Unsupported config option 'lora_paths' with action 'LoRAPathAction'"):
        parse(["--config", str(cfg)])
    r = subprocess.run([sys.executable, "-m", "tunectl.sim.launch_server", "--model-path", "m", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "ValueError: Unsupported config option 'lora_paths'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "tunectl.sim.launch_server", "--help"],
                       capture_output=True, text=True, timeout=30)
    assert "--lora-paths" in r.stdout                                 # still fine on the command line


def test_launch_server_exits_2_on_unknown_flag() -> None:
    r = subprocess.run([sys.executable, "-m", "tunectl.sim.launch_server", "--model-path", "m", "--bogus"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


def test_cli_sim_serve_passes_argv_through() -> None:
    r = subprocess.run([sys.executable, "-c", "from tunectl.cli import app; app()", "sim", "serve", "--model-path", "m",
                        "--kv-cache-dtype", "fp9"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'fp9'" in r.stderr
