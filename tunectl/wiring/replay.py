"""A measured landscape served as a virtual one: the search run against real data, no model in between.

`Replay(landscape)` looks a config up in the table (`tunectl/wiring/landscape.py`) and draws one reading of it: a config
launched several times returns one of its measured launches, whole (seeded); a config launched once returns its
measured levels, each moved by the landscape's launch-to-launch spread (the median relative sd of the relaunched
configs at that level and client, normal, clipped at 2 sd); `noise="none"` returns each level's mean. A crashed
launch returns its class, signature and the levels it served before it. A config the table lacks raises
`Unmeasured`. `replay_profile(landscape)` is the profile whose search space is the table's knobs and values;
`ReplayEvaluator` has the trial engine's call shape, as `tunectl.wiring.virtual.VirtualEvaluator` does.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunectl.wiring import landscape as land_mod
from tunectl.errors import UsageError
from tunectl.models import CrashInfo, LevelResult, TrialResult
from tunectl.objective import score
from tunectl.profile import Profile, load_profile

NOISE = ("launches", "none")
LATENCIES = ("p99_ttft_ms", "median_ttft_ms", "median_tpot_ms")      # what a landscape's levels record


class Unmeasured(UsageError):
    """A config the landscape has no measurement of."""


class Replay:
    def __init__(self, land: dict[str, Any], client: str | None = None, noise: str = "launches"):
        if noise not in NOISE:
            raise UsageError(f"noise: {noise!r}: valid: {', '.join(NOISE)}")
        clients = land.get("clients") or []
        if client is not None and client not in clients:
            raise UsageError(f"landscape {land['name']}: client {client!r} has no levels; valid: "
                             f"{', '.join(clients) or 'none'}")
        self.land, self.noise = land, noise
        self.client = client or ("builtin" if "builtin" in clients else (clients or ["builtin"])[0])
        self.levels = [int(x) for x in land["levels"]]
        self.by_key = {land_mod.key_of(c["set"]): c for c in land["configs"] if c["outcome"] != "unmeasured"}

    def lookup(self, params: dict[str, Any]) -> dict[str, Any]:
        cfg = self.by_key.get(land_mod.key_of({k: v for k, v in params.items() if v is not None}))
        if cfg is None:
            raise Unmeasured(f"landscape {self.land['name']}: config {params} was not measured "
                             f"({len(self.by_key)} of {len(self.land['configs'])} configs are){self._nearest(params)}")
        return cfg

    def _nearest(self, params: dict[str, Any]) -> str:
        def diff(cfg: dict[str, Any]) -> list[str]:
            keys = set(cfg["set"]) | set(params)
            return [f"{k}={cfg['set'].get(k)}" for k in sorted(keys) if cfg["set"].get(k) != params.get(k)]
        if not self.by_key:
            return ""
        best = min(self.by_key.values(), key=lambda c: len(diff(c)))
        return f"; nearest measured: {best['id']} ({', '.join(diff(best))})"

    def true_value(self, params: dict[str, Any], prof: Profile | None = None) -> float:
        """The table's value of a config: its best level's mean over launches for this client (0 for a crash); with
        a profile whose objective has an SLO, the best level whose latencies (their means over the launches) meet
        it, scored as the search scores a trial (0 where no level does)."""
        cfg = self.lookup(params)
        if cfg["outcome"] == "crash":
            return 0.0
        if prof is None or not prof.objective.slo:
            return max((s["mean"] for s in cfg["levels"].get(self.client, {}).values()), default=0.0)
        got = score(TrialResult(trial=0, status="ok", levels=self.mean_levels(cfg, prof)), prof)
        return got.value if got.slo <= 0 else 0.0

    def mean_levels(self, cfg: dict[str, Any], prof: Profile) -> list[LevelResult]:
        """A config's levels as their means over its launches: the throughput and every latency the table holds."""
        label, out = prof.bench.workloads[0].label, []
        for level, summary in sorted(cfg["levels"].get(self.client, {}).items(), key=lambda kv: int(kv[0])):
            recs = [launch["levels"].get(self.client, {}).get(level) or {} for launch in self.candidates(cfg)]
            metrics = {"output_throughput": float(summary["mean"])}
            for key in LATENCIES:
                seen = [float(r[key]) for r in recs if r.get(key) is not None]
                if seen:
                    metrics[key] = sum(seen) / len(seen)
            out.append(LevelResult(int(level), "ok", label, metrics=metrics))
        return out

    def check_slo(self, slo: dict[str, float]) -> None:
        """An SLO on a latency the table did not record could never hold: one line naming the ones it has."""
        missing = [k for k in slo if k not in LATENCIES]
        if missing:
            raise UsageError(f"landscape {self.land['name']}: its levels record {', '.join(LATENCIES)}, not "
                             f"{', '.join(missing)}: an SLO on them cannot be judged")

    def best(self, prof: Profile | None = None) -> tuple[float, dict[str, Any]]:
        ok = [c for c in self.by_key.values() if c["outcome"] == "ok"]
        if not ok:
            return 0.0, {}
        top = max(ok, key=lambda c: self.true_value(c["set"], prof))
        return self.true_value(top["set"], prof), top["set"]

    def candidates(self, cfg: dict[str, Any]) -> list[dict[str, Any]]:
        """The launches a reading is drawn from: judged ones, and an infra launch that served every level."""
        full = [str(x) for x in self.levels]
        return [launch for launch in cfg["launches"] if launch["outcome"] != "infra" or all(
            (launch["levels"].get(self.client, {}).get(lv) or {}).get("value") is not None for lv in full)]

    def reading(self, params: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One draw: (the launch it came from, per level its record with `value` as read this time)."""
        cfg = self.lookup(params)
        pool = self.candidates(cfg)
        launch = pool[rng.randrange(len(pool))]
        recs = []
        for level in self.levels:
            rec = launch["levels"].get(self.client, {}).get(str(level))
            if rec is None:
                continue
            rec = {**rec, "concurrency": level}
            if rec["value"] is not None:
                rec["value"] = self._value(cfg, level, rec["value"], len(pool), rng)
            recs.append(rec)
        return launch, recs

    def _value(self, cfg: dict[str, Any], level: int, measured: float, launches: int, rng: random.Random) -> float:
        if self.noise == "none":
            return float(cfg["levels"][self.client][str(level)]["mean"])
        if launches > 1:
            return float(measured)
        cv = self.cv(level)
        return float(measured) * (1.0 + cv * max(-2.0, min(2.0, rng.gauss(0.0, 1.0))))

    def cv(self, level: int) -> float:
        spread = self.land.get("spread", {}).get(self.client, {})
        if str(level) in spread:
            return float(spread[str(level)]["median_cv"])
        every = sorted(float(s["median_cv"]) for s in spread.values())
        return every[len(every) // 2] if every else 0.0


class ReplayEvaluator:
    """(n, params, role, should_prune) -> TrialResult from the table. `unmeasured="pruned"`: a config the table
    lacks comes back pruned with no levels (the search goes on; `self.unmeasured` counts them); `"error"` raises."""

    def __init__(self, prof: Profile, replay: Replay, seed: int = 0, unmeasured: str = "pruned"):
        self.prof, self.replay, self.seed, self.on_unmeasured = prof, replay, seed, unmeasured
        self.calls, self.unmeasured = 0, 0
        self.label = prof.bench.workloads[0].label

    def __call__(self, n: int, params: dict[str, Any], role: str,
                 should_prune: Callable[[LevelResult], bool] | None = None) -> TrialResult:
        self.calls += 1
        res = TrialResult(trial=n, status="ok", params=dict(params), role=role, host="replay")
        try:
            launch, recs = self.replay.reading(params, random.Random(self.seed * 100003 + n))
        except Unmeasured:
            if self.on_unmeasured == "error":
                raise
            self.unmeasured += 1
            res.status = "pruned"
            return res
        res.ready_s = launch.get("ready_s") or 0.0
        crash = _crash(launch) if launch["outcome"] == "crash" else None
        for rec in recs:
            if rec["status"] == "crashed":
                break
            lv = _level(rec, self.label)
            res.levels.append(lv)
            if lv.status == "ok" and should_prune is not None and should_prune(lv):
                res.status, crash = "pruned", None
                break
        if crash is not None:
            res.status, res.crash = "crashed", crash
            if crash.level is not None:
                res.levels.append(LevelResult(int(crash.level), "crashed", self.label, crash=crash))
        res.wall_s = float(res.ready_s or 0.0) + sum(lv.duration_s for lv in res.levels)
        return res


def _level(rec: dict[str, Any], label: str) -> LevelResult:
    metrics = {k: float(rec[k]) for k in LATENCIES if rec.get(k) is not None}
    if rec["value"] is not None:
        metrics["output_throughput"] = float(rec["value"])
    return LevelResult(int(rec["concurrency"]), rec["status"] if rec["status"] in ("ok", "crashed") else "failed",
                       label, metrics=metrics, completed=int(rec.get("completed") or 0),
                       failed_requests=int(rec.get("failed_requests") or 0),
                       duration_s=float(rec.get("duration_s") or 0.0))


def _crash(launch: dict[str, Any]) -> CrashInfo:
    c = launch.get("crash") or {}
    return CrashInfo(cls=c.get("cls") or "unknown", signature=c.get("signature") or "unknown",
                     phase=c.get("phase") or "startup", level=c.get("level"),
                     exception_line=c.get("exception_line") or "", exit_code=137)


def replay_profile(land: dict[str, Any], profile: str | Path | None = None) -> Profile:
    """The profile the landscape was measured with (`profile`, else the one its studies recorded), its search space
    replaced by the table's knobs and values (each knob's default: the profile's own where the table has that
    value, else the baseline config's), its levels the table's. A knob some configs leave out is active only where its controlling knob has the values of the
    configs that set it."""
    if profile is not None:
        prof = load_profile(profile)
    elif land.get("study_profile"):
        prof = Profile.model_validate(land["study_profile"])
    else:
        raise UsageError(f"landscape {land['name']}: no profile recorded; name one (--profile FILE)")
    measured = [c for c in land["configs"] if c["outcome"] != "unmeasured"]
    if not measured:
        raise UsageError(f"landscape {land['name']}: no config measured yet; nothing to replay")
    base = next((c for c in measured if c["id"] == land.get("baseline")), measured[0])
    space = {}
    for knob, values in land["knobs"].items():
        when = _when(knob, measured, land["knobs"])
        own = prof.search.space[knob].default if knob in prof.search.space else None
        default = own if own in values else base["set"].get(knob, values[0])
        space[knob] = {"type": "categorical", "choices": list(values), "when": when, "default": default}
    data = prof.model_dump(mode="json", exclude_unset=False)
    data["search"]["space"] = space
    data["search"]["try_first"] = []
    data["bench"]["levels"] = [int(x) for x in land["levels"]]
    data["bench"]["workloads"] = data["bench"]["workloads"][:1]
    data["host"]["kind"], data["name"] = "local", f"replay-{land['name']}"
    return Profile.model_validate(data)


def _when(knob: str, configs: list[dict[str, Any]], knobs: dict[str, list[Any]]) -> dict[str, Any]:
    without = [c for c in configs if knob not in c["set"]]
    if not without:
        return {}
    with_ = [c for c in configs if knob in c["set"]]
    for other in knobs:
        if other == knob or any(other not in c["set"] for c in configs):
            continue
        on = {_h(c["set"][other]) for c in with_}
        if on.isdisjoint({_h(c["set"][other]) for c in without}):
            vals = [v for v in knobs[other] if _h(v) in on]
            return {other: vals[0] if len(vals) == 1 else vals}
    raise UsageError(f"landscape: knob {knob!r} is set by some configs and not others, and no knob tells them "
                     "apart; set it in every config of the design")


def _h(v: Any) -> str:
    return repr(v)
