"""Study identity: what makes two trials' numbers comparable, and the refusal to mix what is not.

`fingerprint(prof, gpu)` is a plain dict of the SGLang version, the patches with their hashes, the model, the GPU
model and count, the engine, the workload (with the objective's metric), the bench ladder and clients,
the objective's mode and SLO, and the profile's base flags (`server.flags`: every trial launches with them). A
study keeps the fingerprint of its first run (an Optuna study attribute and study.json); a later run whose profile
gives another one is refused with one line naming what changed and the two ways on: a new study, or a new study
warm-started from this one.
`space_changes(old, new)` does the same for the search space (added or removed choices, knobs, ranges).
"""
from __future__ import annotations

from typing import Any

from tunectl import knobs
from tunectl.errors import UsageError
from tunectl.profile import ParamSpec, Profile

ATTR = "tunectl:identity"
LABELS = {"sglang_version": "SGLang", "patches": "patches", "model": "model", "gpu": "GPU", "gpu_count": "GPUs",
          "engine": "engine", "workload": "workload", "ladder": "bench", "objective": "objective",
          "flags": "base flags"}


def patch_ids(prof: Profile) -> list[str]:
    """Every patch a trial of this profile may apply: the base ones and the patch knobs'."""
    ids = list(prof.server.patches)
    for name, spec in prof.search.space.items():
        t = knobs.target(name, spec)
        if t.kind == "patch" and t.name not in ids:
            ids.append(t.name)
    return ids


def workload(prof: Profile) -> list[str]:
    keep = ("kind", "input_len", "output_len", "range_ratio", "shared_prefix_len", "client", "vocab_size")
    out = []
    for w in prof.bench.workloads:
        d = w.model_dump()
        if w.kind != "shared_prefix":
            d.pop("shared_prefix_len")
        line = " ".join(f"{k}={d[k]}" for k in keep if d.get(k) is not None)
        # what later versions added, only when set (an older study's fingerprint stays as it was)
        extra = {k: d[k] for k in ("name", "path", "multi_turn", "chat_template", "tokenizer", "scenarios")
                 if d.get(k)} | ({"turns": w.turns} if w.turns > 1 else {})
        out.append(" ".join([line, *(f"{k}={v}" for k, v in extra.items())]))
    obj = prof.objective
    goodput = [f"goodput by={obj.capacity.by} slo={dict(sorted(obj.slo.items()))} share={obj.slo_attainment}"] \
        if obj.mode == "goodput" else []                   # a throughput study's identity reads as before
    weights = f" weights={dict(obj.weights)}" if obj.weights else ""
    return [*out, f"metric={obj.metric}{weights}", *goodput]


def ladder(prof: Profile) -> str:
    """What a trial's levels are measured at and by: a trial peaking at 16 streams does not rank against one read up
    to 512, nor the built-in client's readings against bench_serving's. How long or how precisely a level runs is
    not part of it (more precision reads the same value, closer)."""
    b = prof.bench
    out = f"levels={b.levels} client={b.client} backend={b.backend}"
    if b.rates:
        out += f" rates={b.rates} burstiness={b.burstiness} max_concurrency={b.max_concurrency}"
    return out


def objective(prof: Profile) -> str:
    """What a trial's value means beyond its metric (the workload line has that): a throughput study resumed as a
    tokens-per-joule one, or under another SLO, would rank values computed two ways."""
    o = prof.objective
    return (f"mode={o.mode} slo={dict(sorted(o.slo.items()))} attainment={o.slo_attainment} "
            f"pareto={o.multi_objective}")


def fingerprint(prof: Profile, gpu: tuple[str, int], hashes: dict[str, str]) -> dict[str, Any]:
    """`gpu`: (model, count) as the host (or the stand-in's card) reports it; `hashes`: patch id -> sha256.
    `ladder`, `objective` and `flags` came later: a study recorded without them is not compared on them."""
    return {"sglang_version": prof.server.sglang_version,
            "patches": {i: hashes.get(i, "?")[:12] for i in sorted(patch_ids(prof))},
            "model": prof.model.path, "gpu": gpu[0], "gpu_count": gpu[1], "engine": prof.server.engine,
            "workload": workload(prof), "ladder": ladder(prof), "objective": objective(prof),
            "flags": {k: prof.server.flags[k] for k in sorted(prof.server.flags)}}


def _show(key: str, value: Any) -> str:
    if key == "patches":
        return ", ".join(f"{i}@{h[:8]}" for i, h in value.items()) or "none"
    if key == "workload":
        return "; ".join(value)
    if key == "flags":
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _changed_flags(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Only the base flags that differ, each side's value or '(unset)'."""
    keys = [k for k in sorted({*old, *new}) if old.get(k, ...) != new.get(k, ...)]
    return {k: old.get(k, "(unset)") for k in keys}, {k: new.get(k, "(unset)") for k in keys}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'SGLang 0.5.9 -> 0.5.17' for each field that differs (fields one side lacks are not compared)."""
    out = []
    for k in LABELS:
        if k in old and k in new and old[k] != new[k]:
            a, b = _changed_flags(old[k], new[k]) if k == "flags" else (old[k], new[k])
            out.append(f"{LABELS[k]} {_show(k, a)} -> {_show(k, b)}")
    return out


def ways_on(study: str, suffix: str) -> str:
    new = f"{study}-{suffix}".replace(" ", "")
    return (f"start a new study (--study {new}) or one that starts from what this one learned "
            f"(--study {new} --warm-start {study})")


def refuse_mix(study: str, old: dict[str, Any], new: dict[str, Any], trials: int) -> None:
    changed = differences(old, new)
    if not changed:
        return
    suffix = new["sglang_version"] if old.get("sglang_version") != new["sglang_version"] else "2"
    raise UsageError(f"study {study!r} holds {trials} trial(s) of another setup ({'; '.join(changed)}): their "
                     f"numbers do not mix with this profile's; {ways_on(study, suffix)}")


# ------------------------------------------------------------------------------------------ search space

def _choices(spec: dict[str, Any]) -> list[Any] | None:
    return spec.get("choices")


def _knob_change(name: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    if old.get("type") != new.get("type"):
        return [f"{name}: type {old.get('type')} -> {new.get('type')}"]
    out = []
    a, b = _choices(old), _choices(new)
    if a is not None and b is not None:
        added, removed = [v for v in b if v not in a], [v for v in a if v not in b]
        out += [f"{name}: choices added {', '.join(map(repr, added))}"] if added else []
        out += [f"{name}: choices removed {', '.join(map(repr, removed))}"] if removed else []
    elif a != b:
        out.append(f"{name}: choices {a} -> {b}")
    for key in ("low", "high", "log", "step", "flag", "patch", "env", "when"):
        if old.get(key) != new.get(key):
            out.append(f"{name}: {key} {old.get(key)!r} -> {new.get(key)!r}")
    return out


def space_changes(old: dict[str, dict[str, Any]], new: dict[str, ParamSpec]) -> list[str]:
    """What differs between a study's recorded space (study.json) and the profile's, knob by knob."""
    now = {k: v.model_dump(mode="json") for k, v in new.items()}
    out = [f"knob {k!r} removed" for k in old if k not in now]
    out += [f"new knob {k!r}" for k in now if k not in old]
    for k in old:
        if k in now:
            out += _knob_change(k, old[k], now[k])
    return out


def refuse_space_change(source: str, study: str, old: dict[str, dict[str, Any]], new: dict[str, ParamSpec],
                        trials: int) -> None:
    changed = space_changes(old, new)
    if changed:
        raise UsageError(f"{source}: search.space changed since study {study!r} began ({'; '.join(changed)}); its "
                         f"{trials} trial(s) ran on the old space: restore it to resume, or {ways_on(study, '2')}")


# ------------------------------------------------------------------------------------------ wiring

def host_gpu(prof: Profile, runner: Any) -> tuple[str, int]:
    """(GPU model, count): the stand-in's card for the stand-in, else the host's nvidia-smi ('unknown' when the
    host cannot say; the check before the study reports why)."""
    if prof.server.engine == "sim":
        from tunectl.sim.model import load_card

        gpu = load_card(prof.server.sim.card).gpu
        return gpu.name, gpu.count
    from tunectl.errors import TunectlError
    from tunectl.runners.checks.hostcheck import gpu_names

    if runner is None:                              # a virtual or injected evaluation: no host to ask
        return "unknown", len(prof.host.gpus or [])
    try:
        names = gpu_names(runner, prof.host.gpus)
    except TunectlError:
        return "unknown", len(prof.host.gpus or [])
    return (", ".join(sorted(set(names))) or "none"), len(names)


def patch_hashes() -> dict[str, str]:
    from tunectl.runners.checks.patches import load_manifest

    return {i: s.sha256 for i, s in load_manifest().items()}


def of_profile(prof: Profile, runner: Any) -> dict[str, Any]:
    return fingerprint(prof, host_gpu(prof, runner), patch_hashes())


def guard(study: Any, recorded: dict[str, Any], prof: Profile, fp: dict[str, Any], trials: int) -> bool:
    """Refuse a study whose trials came from another setup or another search space; True when the caller must
    fall back to comparing Optuna's distributions (no space recorded). `recorded`: the study's study.json."""
    old = study.user_attrs.get(ATTR)
    if trials and old:
        refuse_mix(study.study_name, old, fp, trials)
    space = (recorded.get("profile") or {}).get("search", {}).get("space")
    if trials and space is not None:
        refuse_space_change(prof.source or prof.name, study.study_name, space, prof.search.space, trials)
    if old != fp:
        study.set_user_attr(ATTR, fp)
    return space is None
