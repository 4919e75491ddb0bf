"""SGLang's flags across versions, derived from the bundled `launch_server --help` texts (tunectl/sglang/help/).

- `deprecations(version)`: each flag whose help says it is deprecated, with what replaces it: `--nsa-prefill-backend`
  "[Deprecated] Use --dsa-prefill-backend instead." (0.5.17) -> `dsa-prefill-backend`; `--disable-cuda-graph`
  "Use --cuda-graph-backend-{decode,prefill}=disabled" -> two flags, each with that value.
- `translate(name, value, src, dst)`: a flag of SGLang `src` as SGLang `dst` spells it, walking the bundled versions
  between them: a flag that still exists stays (a deprecated one is noted); one that is gone follows the
  deprecation the last version that had it printed (or, going back, the older name a newer version deprecated).
  A flag gone without a successor raises `FlagGone`, whose message is one line naming both versions.
- `spelled(name, version)`: the name a version knows a flag by (`tp-size` and `tensor-parallel-size` are one flag),
  used to compare a repair's flag with a knob's on any version.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from tunectl.sglang.flags import HELP_DIR, FlagSpec, bundled_flags, flag_index

_DEPRECATED = re.compile(r"deprecat", re.I)
_TARGET = re.compile(r"(?:alias for|use)\s+--([a-z0-9{},-]+?)(?:=([\w.{},-]+?))?(?=[\s.)]|$)", re.I)


@dataclass(frozen=True)
class Deprecation:
    name: str                                         # the deprecated flag
    version: str
    replaced_by: tuple[tuple[str, Any], ...] = ()     # (flag, value or None = the same value)
    note: str = ""

    def describe(self) -> str:
        if not self.replaced_by:
            return f"--{self.name} is deprecated in SGLang {self.version}"
        new = ", ".join(f"--{n}" + (f"={v}" if v is not None else "") for n, v in self.replaced_by)
        return f"--{self.name} is deprecated in SGLang {self.version}: use {new}"


@dataclass
class Moved:
    """One flag moved from one version to another: the flags it becomes and what happened on the way."""
    flags: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class FlagGone(ValueError):
    pass


ANY = "<any value>"       # translate a flag's name only (a knob's range is checked elsewhere)


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def bundled_versions() -> list[str]:
    return sorted((p.stem.removeprefix("launch_server-") for p in HELP_DIR.glob("launch_server-*.txt")), key=_vkey)


def _expand(name: str) -> list[str]:
    """`cuda-graph-backend-{decode,prefill}` -> both names."""
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [name]
    return [name[:m.start()] + part + name[m.end():] for part in m.group(1).split(",")]


def _replacements(spec: FlagSpec, known: dict[str, FlagSpec]) -> tuple[tuple[str, Any], ...]:
    m = _TARGET.search(spec.text)
    if m and m.group(1).rstrip("-") != spec.name:
        out = tuple((n, m.group(2)) for n in _expand(m.group(1).rstrip("-")) if n in known)
        if out:
            return out
    if spec.metavar and spec.metavar.isupper():               # `--cuda-graph-max-bs CUDA_GRAPH_MAX_BS_DECODE`
        dest = spec.metavar.lower().replace("_", "-")
        if dest != spec.name and dest in known:
            return ((dest, None),)
    return ()


@functools.cache
def deprecations(version: str) -> dict[str, Deprecation]:
    flags = bundled_flags(version)
    index = flag_index(flags)
    out = {}
    for spec in flags.values():
        if _DEPRECATED.search(spec.text[:80]):
            out[spec.name] = Deprecation(spec.name, version, _replacements(spec, index), spec.text)
    return out


@functools.cache
def _index(version: str) -> dict[str, FlagSpec]:
    return flag_index(bundled_flags(version))


def spelled(name: str, version: str) -> str:
    """The flag's first long name in `version` (its aliases and underscores resolved); unknown names unchanged."""
    bare = name.lstrip("-").replace("_", "-")
    spec = _index(version).get(bare)
    return spec.name if spec else bare


def _value(dep_value: Any, value: Any, switch: bool) -> Any:
    """The replacement's value: a deprecated switch set true gives the replacement's printed value."""
    if dep_value is None:
        return value
    if switch:
        return dep_value if value is True else None
    return dep_value


_MAPS = re.compile(r"'([\w.-]+)' maps to '([\w.-]+)'")


def _carry(dep: Deprecation, name: str, value: Any, have: str, nxt: str) -> dict[str, Any]:
    """The replacement flags' values, checked against what `nxt` accepts (a help's "'a' maps to 'b'" applied)."""
    switch = not _index(have)[name].takes_value
    out = {}
    for n, v in dep.replaced_by:
        new = _value(v, value, switch)
        new = dict(_MAPS.findall(dep.note)).get(str(new), new)
        if n not in _index(nxt):                      # the replacement is gone too: follow it on
            out.update(_step(n, new, have, nxt)[0] if new is not None else {})
            continue
        spec = _index(nxt)[n]
        if new == ANY:
            out[n] = new
            continue
        if switch and v is None and spec.takes_value:
            raise FlagGone(f"--{name} is gone in SGLang {nxt} ({dep.describe()}, which takes a value: set it by hand)")
        if new is not None and spec.choices and str(new) not in spec.choices:
            raise FlagGone(f"--{name}={new} is gone in SGLang {nxt} and --{n} does not take {new!r}; valid: "
                           f"{', '.join(spec.choices)}")
        out[n] = new
    return out


def _step(name: str, value: Any, have: str, nxt: str) -> tuple[dict[str, Any], str | None]:
    """One flag from version `have` (where it exists) to the neighbour version `nxt`."""
    if name in _index(nxt):
        dep = deprecations(nxt).get(spelled(name, nxt))
        return {name: value}, dep.describe() if dep else None
    if _vkey(nxt) > _vkey(have):
        dep = deprecations(have).get(spelled(name, have))
        if dep and dep.replaced_by:
            out = _carry(dep, name, value, have, nxt)
            moved = ", ".join(f"--{n}" for n in out)
            return ({k: v for k, v in out.items() if v is not None},
                    f"--{name} is gone in SGLang {nxt} ({have}: deprecated for {moved}): now {moved}")
    else:
        olds = [d.name for d in deprecations(have).values() if (spelled(name, have), None) in d.replaced_by
                and d.name in _index(nxt)]
        if olds:
            return {olds[0]: value}, f"--{name} does not exist in SGLang {nxt}: its older name --{olds[0]}"
    hint = f"; {deprecations(have)[spelled(name, have)].describe()}" if spelled(name, have) in deprecations(have) \
        else ""
    raise FlagGone(f"--{name} no longer exists in SGLang {nxt} (it was in {have}{hint}) and has no successor there")


def path(src: str, dst: str) -> list[str]:
    known = bundled_versions()
    for v in (src, dst):
        if v not in known:
            raise FlagGone(f"no bundled --help text for SGLang {v}; bundled: {', '.join(known)} "
                           "(tunectl versions add HOST reads one from a host)")
    a, b = known.index(src), known.index(dst)
    return known[a:b + 1] if a <= b else known[b:a + 1][::-1]


def translate(name: str, value: Any, src: str, dst: str) -> Moved:
    bare = name.lstrip("-").replace("_", "-")
    if bare not in _index(src):
        raise FlagGone(f"--{bare} is not a flag of SGLang {src}")
    cur, notes = {bare: value}, []
    steps = path(src, dst)
    for have, nxt in zip(steps, steps[1:]):
        nxt_flags: dict[str, Any] = {}
        for n, v in cur.items():
            try:
                out, note = _step(n, v, have, nxt)
            except FlagGone as e:
                if f"--{bare} " in f"{e} ":
                    raise
                raise FlagGone(f"--{bare} (via --{n}): {e}") from None
            nxt_flags.update(out)
            if note and (nxt == dst or "gone" in note or "older name" in note):
                notes.append(note)
        cur = nxt_flags
    return Moved(cur, notes)


def gone_hint(name: str, version: str) -> str | None:
    """Why `--name` is not a flag of `version` when another bundled version has it: '--cuda-graph-max-bs is a flag
    of SGLang 0.5.17, not 0.5.23; use --cuda-graph-max-bs-decode', or why it has no successor there."""
    bare = name.lstrip("-").replace("_", "-")
    if version not in bundled_versions() or bare in _index(version):
        return None
    others = [v for v in bundled_versions() if bare in _index(v)]
    if not others:
        return None
    src = min(others, key=lambda v: abs(_vkey(v)[-1] - _vkey(version)[-1]) + 100 * (_vkey(v)[:2] != _vkey(version)[:2]))
    try:
        moved = translate(bare, True if not _index(src)[bare].takes_value else ANY, src, version)
    except FlagGone as e:
        return str(e)
    new = ", ".join(f"--{n}" for n in moved.flags)
    return f"--{bare} is a flag of SGLang {src}, not {version}; use {new}" if new else None


def _as_spelled(name: str, value: Any, version: str) -> list[tuple[str, Any]]:
    """(flag, value) and the other spellings `version` accepts for it: a deprecated flag's replacements (with the
    value its help prints) and the deprecated names that stand for it."""
    out = [(name, value)]
    dep = deprecations(version).get(spelled(name, version))
    if dep:
        switch = not _index(version)[name].takes_value
        out += [(n, v) for n, v in ((n, _value(v, value, switch)) for n, v in dep.replaced_by) if v is not None]
    out += [(d.name, value) for d in deprecations(version).values() if (spelled(name, version), None) in d.replaced_by]
    return out


def resolve_repairs(repairs: Any, src: str, dst: str) -> list[tuple[str, Any]]:
    """The crash catalog's repairs (written with SGLang `src`'s flag names) as SGLang `dst` spells them: each flag
    under every name `dst` accepts for it; a flag `dst` no longer has is dropped. Env variables and patches stay."""
    out: list[tuple[str, Any]] = []
    for target, change in repairs:
        if target.startswith("patch:") or target.isupper() or src == dst and target not in _index(src):
            out.append((target, change))
            continue
        try:
            moved = translate(target, change, src, dst)
        except FlagGone:
            continue
        for name, value in moved.flags.items():
            out += [r for r in _as_spelled(name, value, dst) if r not in out]
    return out
