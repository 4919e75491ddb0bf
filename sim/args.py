"""The stand-in's command line: SGLang's flags (built from the bundled --help table of 0.5.9, or of 0.5.17 or
0.5.23 with `--sim-sglang-version`) plus --sim-* flags.

`--config FILE.yaml` is merged exactly like SGLang's ConfigArgumentMerger: config options first, then the
command line (so the command line wins); store_true flags appear only when true; other booleans become
`--key true|false`; lists become repeated values; empty lists are dropped; an option whose destination belongs to
an action other than store / store_true is refused (the set differs by version, below).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from tunectl.sglang.flags import TYPES, FlagSpec, bundled_flags, config_refused, config_to_argv

SGLANG_VERSION = "0.5.9"
VERSIONS = ("0.5.9", "0.5.17", "0.5.23")
# Options SGLang's --config parser refuses: their destination belongs to an argparse action that is neither store
# nor store_true (server_args_config_parser.py, `unsupported_actions`, keyed by dest), derived from each version's
# parser source (tunectl/sglang/source.py). 0.5.17 refuses the NEW names of options a deprecated alias shares
# (real: "Unsupported config option 'cuda_graph_backend_prefill' with action 'DeprecatedStoreConstAction'"): tunectl
# puts them on the command line (runners/server/plan.py).
CONFIG_UNSUPPORTED: dict[str, dict[str, str]] = {v: config_refused(v) for v in VERSIONS}
DEFAULTS: dict[str, Any] = {"host": "127.0.0.1", "port": 30000, "tensor-parallel-size": 1, "stream-interval": 1,
                            "watchdog-timeout": 300.0, "log-level": "info"}


def version_of(argv: list[str]) -> str:
    """The SGLang version the stand-in plays (`--sim-sglang-version`, read before the parser is built)."""
    for i, a in enumerate(argv):
        if a == "--sim-sglang-version" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--sim-sglang-version="):
            return a.split("=", 1)[1]
    return SGLANG_VERSION


def build_parser(version: str = SGLANG_VERSION) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tunectl.sim.launch_server")
    for spec in bundled_flags(version).values():
        _add(parser, spec)
    sim = parser.add_argument_group("stand-in (not SGLang)")
    sim.add_argument("--sim-card", default="glm5-nvfp4-8x-rtx-pro-6000", help="sim card name or YAML path")
    sim.add_argument("--sim-time-scale", type=float, default=0.01, help="wall seconds per modeled second")
    sim.add_argument("--sim-seed", type=int, default=0, help="seed of the load-dependent crash draws and the noise")
    sim.add_argument("--sim-noise", type=float, default=1.0,
                     help="the card's launch-to-launch and drift noise x this (0: the noise-free model)")
    sim.add_argument("--sim-workload", default="random",
                     help="the workload kind the speculative draft's acceptance is read for (the card's "
                          "speculative accept table; tunectl passes its profile's first workload)")
    sim.add_argument("--sim-sglang-version", default=SGLANG_VERSION, choices=VERSIONS,
                     help="the SGLang version whose flags, config parser and log lines the stand-in plays")
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


def merge_config(argv: list[str], parser: argparse.ArgumentParser, version: str = SGLANG_VERSION) -> list[str]:
    """SGLang's `--config` handling (server_args_config_parser.ConfigArgumentMerger)."""
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
    return _config_args(data, store_true, CONFIG_UNSUPPORTED.get(version, {})) + argv[:i] + argv[i + 2:]


def _config_args(data: dict[str, Any], store_true: set[str], unsupported: dict[str, str]) -> list[str]:
    for key in data:
        norm = key.replace("-", "_")
        if norm in unsupported:
            raise ValueError(f"Unsupported config option '{norm}' with action '{unsupported[norm]}'")
    return config_to_argv(data, store_true)


def parse(argv: list[str]) -> argparse.Namespace:
    version = version_of(argv)
    parser = build_parser(version)
    return parser.parse_args(merge_config(list(argv), parser, version))


def model_config(ns: argparse.Namespace) -> dict[str, Any]:
    """The namespace as the model's config dict (underscored names, unset values dropped; `sim/setup.py`
    `normalize` reads later versions' names of the model's knobs as their 0.5.9 names)."""
    return {k: v for k, v in vars(ns).items() if v is not None and v is not False and not k.startswith("sim_")}
