"""Where a trial's params go: the one mapping from a knob to its target (SGLang flag, environment variable or
bundled patch), used by the live launch plan, the virtual trial, the search space, the repairs and the checks.

- `target(name, spec)`: a knob's `KnobTarget`. A param that is not a knob of the space is an SGLang flag of its name.
  Flag names lose leading dashes (`--tp-size` and `tp-size` are one flag).
- `split(prof, params)`: the trial's own part: flags, env, patches switched on and off. A None value sets nothing,
  nor does a flag's `UNSET` choice (`speculative-algorithm: none`).
- `merge(prof, params)`: the base (server.flags, server.env, server.patches) with the trial's part on top: a bool
  patch knob set to false removes the patch even when the base names it.
- `env_value(value)`: how a value is written to the environment (bools as `true`/`false`, SGLang's spelling).
- `base_value(name, spec, prof)`: a knob's value where the profile leaves it (the baseline's); `drawn(prof, params)`:
  the baseline's knobs that have none, which the sampler draws.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:                        # profile.py imports this module (through scopes)
    from tunectl.profile import ParamSpec, Profile

PATCH_PREFIX = "patch:"
# a flag's choice that means "leave the flag out" (SGLang's default): `speculative-algorithm: none` is no
# speculative decoding, which 0.5.9's --speculative-algorithm has no choice for
UNSET: dict[str, str] = {"speculative-algorithm": "none"}


@dataclass(frozen=True)
class KnobTarget:
    kind: Literal["flag", "env", "patch"]
    name: str                       # flag name without dashes, environment variable, or patch id

    @property
    def key(self) -> str:
        """The crash catalog's spelling of the target: `patch:<id>`, an env name, or a flag name."""
        return PATCH_PREFIX + self.name if self.kind == "patch" else self.name


def target(name: str, spec: ParamSpec | None) -> KnobTarget:
    if spec is not None and spec.patch is not None:
        return KnobTarget("patch", spec.patch)
    if spec is not None and spec.env is not None:
        return KnobTarget("env", spec.env)
    return KnobTarget("flag", ((spec.flag if spec is not None else None) or name).lstrip("-"))


def env_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class Split:
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    patches_on: list[str] = field(default_factory=list)
    patches_off: list[str] = field(default_factory=list)


def split(prof: Profile, params: dict[str, Any]) -> Split:
    out = Split()
    for name, value in params.items():
        if value is None:
            continue
        t = target(name, prof.search.space.get(name))
        if t.kind == "patch":
            (out.patches_on if value else out.patches_off).append(t.name)
        elif t.kind == "env":
            out.env[t.name] = env_value(value)
        elif UNSET.get(t.name) != value:
            out.flags[t.name] = value
    return out


def patches(prof: Profile, part: Split) -> list[str]:
    """The base patches plus the ones switched on, less the ones switched off (in that order, once each)."""
    return [p for p in dict.fromkeys([*prof.server.patches, *part.patches_on]) if p not in part.patches_off]


def merge(prof: Profile, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(flags, env, patches) a trial runs with: the base, then each param on its target."""
    part = split(prof, params)
    flags = {k.lstrip("-"): v for k, v in prof.server.flags.items()} | part.flags
    env = {k: str(v) for k, v in prof.server.env.items()} | part.env
    return flags, env, patches(prof, part)


def base_value(name: str, spec: ParamSpec, prof: Profile) -> Any:
    """A knob's value where the profile leaves it: its `default`, else the base flag, patch or env; None when
    unknown (a bool flag absent: False)."""
    if spec.default is not None:
        return spec.default
    t = target(name, spec)
    if t.kind == "patch":
        return t.name in prof.server.patches
    src = base_source(name, spec, prof)
    if src is not None:
        return coerce(spec, src[1])
    return False if spec.type == "bool" and t.kind == "flag" else None


def base_source(name: str, spec: ParamSpec, prof: Profile) -> tuple[str, Any] | None:
    """Where a flag or env knob's base value is written in the profile, and as what: (`server.flags.NAME` or
    `server.env.NAME`, the raw value); None where the profile sets neither (a patch knob: None)."""
    t = target(name, spec)
    if t.kind == "env":
        return (f"server.env.{t.name}", prof.server.env[t.name]) if t.name in prof.server.env else None
    if t.kind != "flag":
        return None
    for key, raw in prof.server.flags.items():
        if key.lstrip("-") in (t.name, t.name.replace("-", "_"), t.name.replace("_", "-")):
            return f"server.flags.{key}", raw
    return None


def coerce(spec: ParamSpec, raw: Any) -> Any:
    if spec.type == "bool" and isinstance(raw, str):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if spec.choices is not None:       # an env value is text: the choice it spells
        return next((c for c in spec.choices if str(c) == str(raw)), raw)
    if spec.type == "int":
        return int(raw)
    if spec.type == "float":
        return float(raw)
    return raw


def drawn(prof: Profile, params: dict[str, Any]) -> list[str]:
    """The knobs of a baseline's `params` that have no base value (`base_value` None): the sampler drew them for
    trial 0, so the baseline is not the server's own default for them and a gain over it is a gain over that
    draw. Empty when the profile gives every knob a base value."""
    space = prof.search.space
    return [n for n in params if n in space and base_value(n, space[n], prof) is None]
