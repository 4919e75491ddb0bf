"""The launch plan: profile + trial params -> SGLang `--config` dict, argv, environment, patches.

User values never become shell text: they go into the config YAML (SGLang reads `--config file.yaml`) and the
0600 env file; `argv` is the full command-line equivalent (a list, for people reproducing a launch by hand) and
`exec_argv` is what actually runs: `<python> -m <module> --config <trial_dir>/config.yaml [--sim-* ...]`.

Which params are flags, env variables or patches: `tunectl.knobs` (the same mapping the virtual trial uses).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any

import yaml

from tunectl import knobs, redact
from tunectl.engines import engine
from tunectl.sglang.flags import bundled_flags, config_refused, config_to_argv
from tunectl.models import LaunchPlan
from tunectl.profile import Profile
from tunectl.runners.hosts.base import LOOPBACK



@functools.lru_cache(maxsize=8)
def _store_true_flags(version: str) -> frozenset[str]:
    """Parsed once per version (every trial's plan asks)."""
    try:
        return frozenset(name for name, spec in bundled_flags(version).items() if not spec.takes_value)
    except FileNotFoundError:
        return frozenset()


def on_command_line(prof: Profile, config: dict[str, Any]) -> list[str]:
    """The options that go on the command line, not into --config: the ones the version's config merger refuses
    (derived from its parser: tunectl.sglang.flags.config_refused) and the profile's `server.argv_flags`."""
    refused = config_refused(prof.server.sglang_version)
    return [k for k in config if k in prof.server.argv_flags or k.replace("-", "_") in refused]


def server_config(prof: Profile, flags: dict[str, Any]) -> dict[str, Any]:
    """The --config content: model, address, base flags, then the trial's flags (later wins)."""
    cfg: dict[str, Any] = {"model-path": prof.model.path}
    if prof.model.served_name:
        cfg["served-model-name"] = prof.model.served_name
    if prof.model.tokenizer:
        cfg["tokenizer-path"] = prof.model.tokenizer
    cfg.update({"host": prof.server.host, "port": prof.server.port})
    cfg.update({k.lstrip("-"): v for k, v in prof.server.flags.items()})
    cfg.update(flags)
    return cfg


def flag_args(config: dict[str, Any], store_true: set[str]) -> list[str]:
    """The command-line equivalent of a --config dict (SGLang's ConfigArgumentMerger rules)."""
    return config_to_argv(config, store_true or None)


def expand_env(value: str) -> str:
    """`${NAME}` in a profile's server.env reads the caller's environment (secrets stay out of profiles)."""
    return redact.ENV_REF.sub(lambda m: os.environ.get(m.group(1), ""), value)


def env_refs(env: dict[str, Any]) -> dict[str, str]:
    """The profile's env values that read the caller's environment (`${NAME}`), as the profile wrote them: what is
    stored and shown in place of what they expanded to (maybe a secret). A secret-named one with literal text
    beside its references (a secret written into the profile) as a reference to its own name only."""
    out = {}
    for k, v in env.items():
        if redact.ENV_REF.search(str(v)):
            out[k] = str(v) if not redact.secret_name(k) or not redact.ENV_REF.sub("", str(v)) else f"${{{k}}}"
    return out


def server_env(prof: Profile, run_id: str, trial_dir: str, patches: list[str],
               knob_env: dict[str, str]) -> dict[str, str]:
    env = {k: expand_env(str(v)) for k, v in prof.server.env.items()}
    env.update({"no_proxy": LOOPBACK, "NO_PROXY": LOOPBACK, "SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION": "1",
                "TMPDIR": f"{trial_dir}/tmp", "TUNECTL_RUN_ID": run_id})
    if prof.host.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in prof.host.gpus)
        env.update(engine(prof).gpu_env(prof))
    env.update(engine(prof).patch_env(patches))
    env.update(knob_env)
    return env


def build_plan(prof: Profile, params: dict[str, Any], run_id: str, trial_dir: str) -> LaunchPlan:
    part = knobs.split(prof, params)
    patches = knobs.patches(prof, part)
    config = server_config(prof, part.flags)
    eng = engine(prof)
    head = [prof.server.python, "-m", eng.module]
    switches = _store_true_flags(prof.server.sglang_version)
    argv = [*head, *flag_args(config, switches), *eng.launch_args(prof)]
    on_cli = {k: config.pop(k) for k in on_command_line(prof, config)}
    exec_argv = [*head, "--config", f"{trial_dir}/config.yaml", *flag_args(on_cli, switches), *eng.launch_args(prof)]
    return LaunchPlan(argv=argv, config=config, env=server_env(prof, run_id, trial_dir, patches, part.env),
                      exec_argv=exec_argv, patches=patches, port=int(config.get("port", prof.server.port)),
                      host=str(config.get("host", prof.server.host)), run_id=run_id, trial_dir=trial_dir,
                      params=dict(params),
                      env_refs=env_refs(prof.server.env))


def config_yaml(plan: LaunchPlan) -> str:
    return yaml.safe_dump(plan.config, sort_keys=False, default_flow_style=False)


def make_run_id(study: str, n: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study)[:40] or "study"
    return f"{safe}-t{n}-{os.urandom(4).hex()}"
