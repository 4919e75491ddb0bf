"""A profile, or a study's configs, moved to another SGLang version (tunectl/sglang/versions.py does the flag names).

- `move_profile(data, dst)`: a profile's YAML data as SGLang `dst` spells it: base flags, `argv_flags`, flag knobs
  (renamed knobs keep their meaning; `when:` and `try_first` follow), patch knobs and patches whose manifest does not
  list `dst` dropped. Returns the new data and one note per change; a flag `dst` lacks raises `versions.FlagGone`.
- `ParamMap(old, new)`: an old study's params as the new profile's knobs: each knob's target flag translated from the
  old version to the new one, then matched with the new knob driving that flag (or an env variable / patch of the
  same name). `changed_meaning` lists the knobs whose flag changed name or value on the way.
"""
from __future__ import annotations

import copy
from typing import Any

from tunectl import knobs
from tunectl.sglang import versions
from tunectl.profile import Profile


def _patch_versions() -> dict[str, list[str]]:
    from tunectl.runners.checks.patches import load_manifest

    return {i: list(s.versions) for i, s in load_manifest().items()}


def _move_flags(flags: dict[str, Any], src: str, dst: str, where: str, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in flags.items():
        try:
            moved = versions.translate(name, value, src, dst)
        except versions.FlagGone as e:
            raise versions.FlagGone(f"{where}.{name}: {e}") from None
        out.update(moved.flags)
        notes += [f"{where}.{name}: {n}" for n in moved.notes]
    return out


def _rename_knobs(space: dict[str, Any], src: str, dst: str, notes: list[str]) -> dict[str, str]:
    renames = {}
    for name, spec in list(space.items()):
        if spec.get("patch") or spec.get("env"):
            continue
        flag = (spec.get("flag") or name).lstrip("-")
        moved = _move_flags({flag: True if spec["type"] == "bool" else versions.ANY}, src, dst, f"search.space.{name}",
                            notes)
        if len(moved) != 1 or (spec["type"] == "bool") != isinstance(next(iter(moved.values())), bool):
            raise versions.FlagGone(f"search.space.{name}: --{flag} becomes {', '.join(moved)} in SGLang {dst}: "
                                    "not one knob; rewrite the knob by hand")
        new = next(iter(moved))
        if new != flag:
            if spec.get("flag"):
                spec["flag"] = new
            else:
                renames[name] = new
    return renames


def move_profile(data: dict[str, Any], dst: str) -> tuple[dict[str, Any], list[str]]:
    data = copy.deepcopy(data)
    server, search = data.setdefault("server", {}), data.setdefault("search", {})
    src = str(server.get("sglang_version", "0.5.9"))
    notes: list[str] = []
    server["flags"] = _move_flags(server.get("flags") or {}, src, dst, "server.flags", notes)
    server["argv_flags"] = list(_move_flags({f: versions.ANY for f in server.get("argv_flags") or []}, src, dst,
                                            "server.argv_flags", []))
    space = search.get("space") or {}
    pv = _patch_versions()
    gone = [n for n, s in space.items() if s.get("patch") and dst not in pv.get(s["patch"], [dst])]
    gone_patches = [p for p in server.get("patches") or [] if dst not in pv.get(p, [dst])]
    notes += [f"search.space.{n}: patch {space[n]['patch']} is not for SGLang {dst}: knob dropped" for n in gone]
    notes += [f"server.patches: {p} is not for SGLang {dst}: dropped" for p in gone_patches]
    server["patches"] = [p for p in server.get("patches") or [] if p not in gone_patches]
    for n in gone:
        del space[n]
    renames = _rename_knobs(space, src, dst, notes)
    search["space"] = {renames.get(k, k): v for k, v in space.items()}
    for spec in search["space"].values():
        spec["when"] = {renames.get(k, k): v for k, v in (spec.get("when") or {}).items() if k not in gone}
    search["try_first"] = [{renames.get(k, k): v for k, v in cfg.items() if k not in gone}
                           for cfg in search.get("try_first") or []]
    notes += [f"search.space.{a}: renamed {b} (the flag's name in SGLang {dst})" for a, b in renames.items()]
    server["sglang_version"] = dst
    return data, notes


class ParamMap:
    """Old knob -> new knob, through the flag each drives."""

    def __init__(self, old: Profile, new: Profile):
        src, dst = old.server.sglang_version, new.server.sglang_version
        by_target = {knobs.target(n, s).key.replace("_", "-"): n for n, s in new.search.space.items()}
        self.map: dict[str, str] = {}
        self.changed_meaning: list[str] = []
        for name, spec in old.search.space.items():
            t = knobs.target(name, spec)
            key = t.key.replace("_", "-")
            if t.kind == "flag" and src != dst:
                try:
                    moved = versions.translate(t.name, True if spec.type == "bool" else versions.ANY, src, dst)
                except versions.FlagGone as e:
                    self.changed_meaning.append(f"{name}: {e}")
                    continue
                self.changed_meaning += [f"{name}: {n}" for n in moved.notes]
                key = next(iter(moved.flags)) if len(moved.flags) == 1 else key
            target = by_target.get(key) or next((n for k, n in by_target.items()
                                                 if versions.spelled(k, dst) == versions.spelled(key, dst)), None)
            if target is not None:
                self.map[name] = target
            else:
                self.changed_meaning.append(f"{name}: no knob of the new profile drives {t.key}: left out")

    def params(self, old_params: dict[str, Any], new: Profile) -> dict[str, Any] | None:
        """The old config in the new space (knobs it has no value for left out), or None when a value is not in
        the new knob's range or choices."""
        from tunectl.search.space import distribution

        out = {}
        for name, value in old_params.items():
            target = self.map.get(name)
            if target is None:
                continue
            dist = distribution(new.search.space[target])
            try:
                ok = dist._contains(dist.to_internal_repr(value))
            except (ValueError, TypeError):
                ok = False
            if not ok:
                return None
            out[target] = value
        return out
