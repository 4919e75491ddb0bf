"""Every flag a profile uses must exist in the host's own `launch_server --help` with valid choices.

The help text is read from the host (its SGLang, or the stand-in), cached per host, python and version under
~/.cache/tunectl/help, and parsed with tunectl.sglang.flags. A 40-trial study must not find a renamed flag at trial 17.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tunectl import knobs
from tunectl.sglang import versions
from tunectl.engines import engine
from tunectl.errors import RunnerError
from tunectl.sglang.flags import FlagSpec, did_you_mean, flag_index, parse_help, type_problem
from tunectl.profile import Profile
from tunectl.runners.hosts.base import Runner


def cache_dir() -> Path:
    return Path(os.path.expanduser("~/.cache/tunectl/help"))


def entrypoint(prof: Profile) -> str:
    return engine(prof).module


def help_argv(prof: Profile) -> list[str]:
    return [prof.server.python, "-m", entrypoint(prof), *engine(prof).version_args(prof), "--help"]


def cache_path(runner: Runner, prof: Profile, version: str) -> Path:
    key = hashlib.sha256("\0".join([runner.name, *help_argv(prof), version]).encode()).hexdigest()[:24]
    return cache_dir() / f"{key}.txt"


def help_text(runner: Runner, prof: Profile, version: str, refresh: bool = False) -> str:
    argv, path = help_argv(prof), cache_path(runner, prof, version)
    if path.is_file() and not refresh:
        return path.read_text()
    res = runner.run(argv, timeout=300)
    if not res.ok or "--" not in res.stdout:
        raise RunnerError(f"{runner.name}: `{' '.join(argv)}` failed", argv, res.exit_code, res.tail)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(res.stdout)
    tmp.replace(path)
    return res.stdout


def used_flags(prof: Profile) -> list[tuple[str, str, Any]]:
    """(profile field, SGLang flag name, values to check) for base flags and flag knobs of the search space."""
    out: list[tuple[str, str, Any]] = [(f"server.flags.{k}", k, [v]) for k, v in prof.server.flags.items()]
    for name, spec in prof.search.space.items():
        t = knobs.target(name, spec)
        if t.kind == "flag":
            values = spec.choices if spec.type == "categorical" else [True] if spec.type == "bool" else []
            values = [v for v in values if knobs.UNSET.get(t.name) != v]     # the flag left out: nothing to check
            out.append((f"search.space.{name}", t.name, values))
    return out


def _value_problem(flag: FlagSpec, values: list[Any]) -> str | None:
    if not flag.takes_value:
        bad = [v for v in values if not isinstance(v, bool)]
        return f"--{flag.name} is a switch (true/false), got {bad[0]!r}" if bad else None
    typed = next((why for why in (type_problem(flag, v) for v in values) if why), None)
    if typed:
        return typed
    if flag.choices:
        bad = [v for v in values if not isinstance(v, bool) and str(v) not in flag.choices]
        if bad:
            return f"{bad[0]!r} is not a valid choice for --{flag.name}; valid: {', '.join(flag.choices)}"
    return None


def problems(prof: Profile, flags: dict[str, FlagSpec], where: str) -> list[str]:
    """One line per bad flag or value: file, field, value, what is valid."""
    out = []
    index = flag_index(flags)
    for field, raw, values in used_flags(prof):
        name = raw.lstrip("-").replace("_", "-")
        flag = index.get(name)
        if flag is None:
            gone = versions.gone_hint(name, prof.server.sglang_version)
            hint = did_you_mean(name, index)
            out.append(f"{prof.source}: {field}: --{name} is not a flag of {where}"
                       + (f"; {gone}" if gone else f"; did you mean --{hint}?" if hint else ""))
            continue
        why = _value_problem(flag, values)
        if why:
            out.append(f"{prof.source}: {field}: {why}")
    return out


def check_flags(runner: Runner, prof: Profile, version: str) -> list[str]:
    flags = parse_help(help_text(runner, prof, version))
    where = f"{entrypoint(prof)} {version} on {runner.name}"
    return problems(prof, flags, where)
