"""Measured landscapes as data: a design (configs x concurrency levels) and what tunectl measured for it, in one
versioned file, `landscape.json` (docs/landscapes.md).

`convert(folder)` reads `folder/design.yaml` and `folder/results/` (tunectl's own results layout, one study per
launch named `<name>-<id>`, relaunches `<name>-<id>-r2`, ...) or, without a design, any results folder (every
trial a launch, configs grouped by their params: a search's finalist reruns become relaunches). A partial
landscape converts: configs without a launch are listed as unmeasured. `load(path)` reads one back, refusing
another format or version in one line. Metric names are the producer's (`output_throughput`, `p99_ttft_ms`, ...).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from pydantic import Field

from tunectl.errors import UsageError
from tunectl.models import LevelResult, TrialResult
from tunectl.yamlmodel import Strict, load_model

FORMAT, VERSION = "tunectl-landscape", 1
LEVEL_KEYS = ("output_throughput", "steady_output_throughput", "p99_ttft_ms", "median_ttft_ms", "median_tpot_ms")


class DesignConfig(Strict):
    id: str
    set: dict[str, Any] = Field(default_factory=dict)


class Design(Strict):
    name: str
    model: str | dict[str, Any] = ""
    gpu: str = ""
    sglang: str = ""
    profile: str = ""
    levels: list[int]
    requests_per_level: float | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    clients: list[str] = Field(default_factory=list)
    knobs: dict[str, list[Any]] = Field(default_factory=dict)
    configs: list[DesignConfig]
    baseline: str | None = None           # the config id of SGLang's defaults (default: the first config)
    notes: str = ""


def key_of(params: dict[str, Any]) -> str:
    """A config's identity: its flags and values, order-free (what a replay looks a proposed config up by)."""
    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True, default=str)


def _str(params: dict[str, Any]) -> dict[str, str]:
    """Params compared as `--set` writes them: a flag typed 64 by the design and "64" by a recorder is one value."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}


def convert(folder: Path | str) -> dict[str, Any]:
    folder = Path(folder)
    if (folder / "design.yaml").exists():
        return from_design(folder)
    return from_results(folder)


def from_design(folder: Path) -> dict[str, Any]:
    design = load_model(folder / "design.yaml", Design, "landscape design")
    studies = _studies(folder / "results")
    configs, used = [], set()
    for c in design.configs:
        mine = [s for s in studies if re.fullmatch(re.escape(f"{design.name}-{c.id}") + r"(-r\d+)?", s.name)]
        used.update(s.name for s in mine)
        launches = [launch for s in mine for launch in _launches(s)]
        configs.append(_config(c.id, dict(c.set), launches))
    head = {"name": design.name, "model": design.model, "gpu": design.gpu, "sglang": design.sglang,
            "profile": design.profile, "levels": design.levels, "requests_per_level": design.requests_per_level,
            "workload": design.workload,
            "knobs": design.knobs or _knobs(configs), "baseline": design.baseline or design.configs[0].id}
    out = _assemble(head, configs, studies, sorted(s.name for s in studies if s.name not in used))
    out["mismatched"] = [{"config": c["id"], "study": launch["study"], "params": launch["params"]} for c in configs
                         for launch in c["launches"] if _str(launch["params"]) != _str(c["set"])]
    return out


def from_results(folder: Path, name: str | None = None) -> dict[str, Any]:
    """Every trial of every study under `folder` (or `folder` itself when it is one study) a launch."""
    studies = [folder] if (folder / "trials").is_dir() else _studies(folder)
    if not studies:
        raise UsageError(f"{folder}: no design.yaml and no tunectl studies (results/<study>/trials/) to convert")
    groups: dict[str, list[dict[str, Any]]] = {}
    params_of: dict[str, dict[str, Any]] = {}
    for s in studies:
        for launch in _launches(s):
            k = key_of(launch["params"])
            groups.setdefault(k, []).append(launch)
            params_of.setdefault(k, launch["params"])
    configs = [_config(f"c{i:02d}", params_of[k], ls) for i, (k, ls) in enumerate(groups.items())]
    prof = _study_profile(studies)
    head = {"name": name or (folder.name if len(studies) > 1 else studies[0].name),
            "model": (prof.get("model") or {}).get("path", ""), "gpu": "",
            "sglang": (prof.get("server") or {}).get("sglang_version", ""), "profile": prof.get("name", ""),
            "levels": sorted({int(lv) for c in configs for launch in c["launches"] for by in launch["levels"].values()
                              for lv in by}), "requests_per_level": None,
            "knobs": _knobs(configs), "baseline": next((c["id"] for c in configs if any(
                launch["role"] == "baseline" for launch in c["launches"])), configs[0]["id"] if configs else None)}
    return _assemble(head, configs, studies, [])


def _assemble(head: dict[str, Any], configs: list[dict[str, Any]], studies: list[Path],
              unknown: list[str]) -> dict[str, Any]:
    out = {"format": FORMAT, "version": VERSION, **head, "clients": sorted({c for cfg in configs
                                                                            for c in cfg["levels"]}),
           "study_profile": _study_profile(studies), "configs": configs,
           "unmeasured": [c["id"] for c in configs if c["outcome"] == "unmeasured"],
           "unknown_studies": unknown, "mismatched": []}
    out["counts"] = counts(out)
    out["spread"] = pooled_spread(configs)
    return out


def _studies(results: Path) -> list[Path]:
    if not results.is_dir():
        return []
    return sorted(p for p in results.iterdir() if (p / "trials").is_dir())


def _study_profile(studies: list[Path]) -> dict[str, Any]:
    for s in studies:
        if (s / "study.json").exists():
            prof = json.loads((s / "study.json").read_text()).get("profile")
            if prof:
                return dict(prof)
    return {}


def _client_of(study: Path) -> str:
    prof = _study_profile([study])
    return str((prof.get("bench") or {}).get("client") or "builtin")


def _launches(study: Path) -> list[dict[str, Any]]:
    default_client = _client_of(study)
    out = []
    trials = sorted(study.glob("trials/*/trial.json"), key=lambda p: int(p.parent.name)
                    if p.parent.name.isdigit() else 0)
    for path in trials:
        t = TrialResult.from_dict(json.loads(path.read_text()))
        out.append(launch_record(t, study.name, default_client))
    return out


def launch_record(t: TrialResult, study: str, default_client: str = "builtin") -> dict[str, Any]:
    """One launch: its outcome (ok / crash with class and signature / infra / pruned), ready time, the machine it ran
    on (the trial's `machine`; "" where the version that ran it did not record one), and per client and level the
    producer's figures."""
    crash = t.crash
    infra = t.status in ("infra", "interrupted", "running") or (crash is not None and crash.cls == "infra")
    outcome = "infra" if infra else "crash" if t.status == "crashed" or crash else t.status
    levels: dict[str, dict[str, Any]] = {}
    for lv in t.levels:
        client = lv.workload.split("@", 1)[1] if "@" in lv.workload else default_client
        levels.setdefault(client, {})[str(lv.concurrency)] = level_record(lv)
    return {"study": study, "trial": t.trial, "role": t.role, "params": dict(t.params), "outcome": outcome,
            "crash": None if crash is None else {k: getattr(crash, k) for k in
                                                 ("cls", "signature", "phase", "level", "exception_line")},
            "ready_s": t.ready_s, "machine": t.machine or "", "levels": levels}


def level_record(lv: LevelResult) -> dict[str, Any]:
    rec: dict[str, Any] = {"status": lv.status, "value": round(lv.output_throughput, 2) if lv.status == "ok" else None,
                           "completed": lv.completed, "failed_requests": lv.failed_requests,
                           "duration_s": lv.duration_s, "capped": lv.capped, "client_bound": lv.client_bound,
                           "output_throughput_ci95": lv.output_throughput_ci95}
    rec.update({k: lv.metrics[k] for k in LEVEL_KEYS if k in lv.metrics})
    return rec


def _config(cid: str, params: dict[str, Any], launches: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [launch for launch in launches if launch["outcome"] != "infra"]
    crashes = [launch for launch in judged if launch["outcome"] == "crash"]
    if not judged:
        outcome = "unmeasured"
    elif crashes and len(crashes) < len(judged):
        outcome = "flaky"
    else:
        outcome = "crash" if crashes else "ok"
    cfg = {"id": cid, "set": params, "outcome": outcome, "launches": launches,
           "crash": crashes[0]["crash"] if crashes else None, "levels": summary(launches)}
    cfg["value"] = max((lv["mean"] for by in cfg["levels"].values() for lv in by.values()), default=None) \
        if outcome in ("ok", "flaky") else None
    return cfg


def summary(launches: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per client and level over the launches that served it (an infra launch's levels before its fault too):
    n, mean, min, max, sd, relative spread (cv)."""
    vals: dict[str, dict[str, list[float]]] = {}
    for launch in launches:
        for client, by in launch["levels"].items():
            for level, rec in by.items():
                if rec["value"] is not None:
                    vals.setdefault(client, {}).setdefault(level, []).append(rec["value"])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for client, by in vals.items():
        for level, xs in sorted(by.items(), key=lambda kv: int(kv[0])):
            mean = statistics.fmean(xs)
            sd = statistics.stdev(xs) if len(xs) > 1 else None
            out.setdefault(client, {})[level] = {
                "n": len(xs), "mean": round(mean, 2), "min": min(xs), "max": max(xs),
                "sd": None if sd is None else round(sd, 2),
                "cv": None if sd is None or mean <= 0 else round(sd / mean, 4), "values": xs}
    return out


def _knobs(configs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for c in configs:
        for k, v in c["set"].items():
            if v not in out.setdefault(k, []):
                out[k].append(v)
    return {k: sorted(vs, key=lambda v: (str(type(v)), v)) for k, vs in out.items()}


def pooled_spread(configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Launch-to-launch spread per client and level: the median relative sd over configs relaunched (n >= 2)."""
    cvs: dict[str, dict[str, list[float]]] = {}
    for c in configs:
        for client, by in c["levels"].items():
            for level, s in by.items():
                if s["cv"] is not None:
                    cvs.setdefault(client, {}).setdefault(level, []).append(s["cv"])
    return {client: {level: {"configs": len(xs), "median_cv": round(statistics.median(xs), 4)}
                     for level, xs in by.items()} for client, by in cvs.items()}


def counts(land: dict[str, Any]) -> dict[str, int]:
    cfgs = land["configs"]
    launches = [launch for c in cfgs for launch in c["launches"]]
    out = {"configs": len(cfgs), "measured": sum(c["outcome"] != "unmeasured" for c in cfgs),
           "unmeasured": sum(c["outcome"] == "unmeasured" for c in cfgs),
           "relaunched": sum(sum(launch["outcome"] != "infra" for launch in c["launches"]) > 1 for c in cfgs),
           "launches": len(launches)}
    for o in ("ok", "crash", "flaky"):
        out[f"configs_{o}"] = sum(c["outcome"] == o for c in cfgs)
    for o in ("ok", "crash", "infra", "pruned"):
        out[f"launches_{o}"] = sum(launch["outcome"] == o for launch in launches)
    return out


def write(land: dict[str, Any], path: Path | str) -> None:
    Path(path).write_text(json.dumps(land, indent=1, default=str) + "\n")


def load(path: Path | str) -> dict[str, Any]:
    p = Path(path)
    try:
        land = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{p}: not a readable landscape.json ({type(e).__name__}: {e})") from None
    if not isinstance(land, dict) or land.get("format") != FORMAT:
        raise UsageError(f"{p}: format: {land.get('format') if isinstance(land, dict) else None!r}: not a "
                         f"landscape (expected {FORMAT!r}; write one with bench/landscape.py)")
    if land.get("version") != VERSION:
        raise UsageError(f"{p}: version: {land.get('version')!r}: this tunectl reads version {VERSION}")
    return land
