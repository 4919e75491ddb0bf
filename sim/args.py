"""The stand-in's command line: SGLang 0.5.9's flags (built from the bundled --help table) plus --sim-* flags.

`--config FILE.yaml` is merged exactly like SGLang 0.5.9's ConfigArgumentMerger: config options first, then the
command line (so the command line wins); store_true flags appear only when true; other booleans become
`--key true|false`; lists become repeated values; empty lists are dropped.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from tunectl.flags import FlagSpec, bundled_flags, config_to_argv

SGLANG_VERSION = "0.5.9"
# Flags the model reads get SGLang's real types, so a bad value exits 2 like the real parser.
TYPES: dict[str, Any] = {
    "tensor-parallel-size": int, "port": int, "max-running-requests": int, "cuda-graph-max-bs": int,
    "chunked-prefill-size": int, "stream-interval": int, "random-seed": int, "max-prefill-tokens": int,
    "max-total-tokens": int, "mem-fraction-static": float, "watchdog-timeout": float, "cuda-graph-bs": int,
    "data-parallel-size": int, "pipeline-parallel-size": int, "expert-parallel-size": int,
}
# Options SGLang 0.5.9's --config parser refuses: their argparse action is neither store nor store_true
# (server_args.py: DeprecatedAction, LoRAPathAction). Real 0.5.17 refuses more (cuda_graph_backend_prefill & co.,
# whose destination a deprecated alias shares): tunectl's server.argv_flags puts such options on the command line.
CONFIG_UNSUPPORTED = {"hybrid_kvcache_ratio": "DeprecatedAction", "prefill_round_robin_balance": "DeprecatedAction",
                      "lora_paths": "LoRAPathAction"}
DEFAULTS: dict[str, Any] = {"host": "127.0.0.1", "port": 30000, "tensor-parallel-size": 1, "stream-interval": 1,
                            "watchdog-timeout": 300.0, "log-level": "info"}


def build_parser(version: str = SGLANG_VERSION) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tunectl.sim.launch_server")
    for spec in bundled_flags(version).values():
        _add(parser, spec)
    sim = parser.add_argument_group("stand-in (not SGLang)")
    sim.add_argument("--sim-card", default="glm5-nvfp4-8x-rtx-pro-6000", help="sim card name or YAML path")
    sim.add_argument("--sim-time-scale", type=float, default=0.01, help="wall seconds per modeled second")
    sim.add_argument("--sim-seed", type=int, default=0, help="seed of the load-dependent crash draws")
    return parser


def _add(parser: argparse.ArgumentParser, spec: FlagSpec) -> None:
    names = [f"--{spec.name}", *spec.aliases]
    if not spec.takes_value:
        parser.add_argument(*names, action="store_true", help=spec.help)
        return
    kw: dict[str, Any] = {"help": spec.help, "default": DEFAULTS.get(spec.name)}
    if spec.choices:
        kw["choices"] = spec.choices
    if spec.nargs:
        kw["nargs"] = spec.nargs
    if spec.name in TYPES:
        kw["type"] = TYPES[spec.name]
    parser.add_argument(*names, **kw)


def merge_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """SGLang 0.5.9's `--config` handling (server_args_config_parser.ConfigArgumentMerger)."""
    idx = [i for i, a in enumerate(argv) if a == "--config"]
    if not idx:
        return argv
    if len(idx) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    i = idx[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[i + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {argv[i + 1]}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    return _config_args(data, store_true) + argv[:i] + argv[i + 2:]


def _config_args(data: dict[str, Any], store_true: set[str]) -> list[str]:
    for key in data:
        norm = key.replace("-", "_")
        if norm in CONFIG_UNSUPPORTED:
            raise ValueError(f"Unsupported config option '{norm}' with action '{CONFIG_UNSUPPORTED[norm]}'")
    return config_to_argv(data, store_true)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    return parser.parse_args(merge_config(list(argv), parser))


def model_config(ns: argparse.Namespace) -> dict[str, Any]:
    """The namespace as the model's config dict (underscored names, unset values dropped)."""
    return {k: v for k, v in vars(ns).items() if v is not None and v is not False and not k.startswith("sim_")}
