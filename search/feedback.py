"""What a trial's result tells the sampler.

A crashed config is told as COMPLETE with a positive `crash` constraint graded by how far up the ladder it got
(Optuna's samplers ignore FAIL, so a FAIL would teach them nothing), its value the best stable throughput below the
crash. Infra faults are never the config's failure: the trial is told FAIL (ignored by the samplers) and the same
params are queued again, up to `search.infra_retries`. A flaky crash gets the same treatment once
(`search.flaky_retries`) before it counts. SLO limits are constraints too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optuna.trial import TrialState

from tunectl.sglang.crashes.classifier import LOG_FACTS
from tunectl.models import LadderStep, TrialResult
from tunectl.objective import Score, score
from tunectl.profile import Profile

PENALTY_LATENCY_MS = 1e9          # p99 TTFT told for a config that never served (multi-objective)


@dataclass
class Verdict:
    state: TrialState                              # COMPLETE, PRUNED or FAIL
    values: list[float] | None = None
    constraints: dict[str, float] = field(default_factory=dict)
    user_attrs: dict[str, Any] = field(default_factory=dict)
    retry: bool = False                            # queue the same params again (infra / first flaky crash)
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.state == TrialState.COMPLETE and all(v <= 0 for v in self.constraints.values())


def planned_levels(prof: Profile) -> int:
    return max(1, len(prof.bench.levels) * len(prof.bench.workloads))


def crash_constraint(result: TrialResult, prof: Profile) -> float:
    """1.0 for a config that never served; down to 1/planned for one that crashed at the last level."""
    planned = planned_levels(prof)
    stable = len(result.stable_levels)
    return max(1.0 / planned, (planned - stable) / planned)


def _values(sc: Score, prof: Profile) -> list[float]:
    thr, lv = sc.value, sc.level
    if not prof.objective.multi_objective:
        return [thr]
    ttft = float(lv.metrics.get("p99_ttft_ms", PENALTY_LATENCY_MS)) if lv else PENALTY_LATENCY_MS
    return [thr, ttft]


def ladder_attr(result: TrialResult) -> list[dict[str, Any]]:
    """One LadderStep per level: compact, for the study DB (read back with `tunectl.models.ladder_steps`)."""
    return [LadderStep.of(lv).to_dict() for lv in result.levels]


def ladder_ci_attr(result: TrialResult) -> list[list[Any]]:
    """[workload, concurrency, low, high, samples] per level with a measured 95% interval."""
    return [[lv.workload, lv.concurrency, *lv.output_throughput_ci95, lv.samples]
            for lv in result.levels if lv.output_throughput_ci95]


def evidence_attrs(result: TrialResult) -> dict[str, Any]:
    attrs: dict[str, Any] = {"status": result.status, "ladder": ladder_attr(result),
                             "ladder_ci": ladder_ci_attr(result),
                             "max_stable_concurrency": result.max_stable_concurrency,
                             "wall_s": round(result.wall_s, 3), "attempt": result.attempt}
    if result.server_facts:
        attrs["server_facts"] = {k: v for k, v in result.server_facts.items() if k in LOG_FACTS}
    if result.crash:
        c = result.crash
        attrs.update({"crash_class": c.cls, "crash_signature": c.signature, "crash_phase": c.phase,
                      "crash_level": c.level, "crash_exception": c.exception_line[:500],
                      "crash_message": c.message[:500], "crash_exit_code": c.exit_code})
    return attrs


def is_infra(result: TrialResult) -> bool:
    """The host or runner failed, not the config (told FAIL and retried, never a result)."""
    return result.status == "infra" or bool(result.crash and result.crash.cls == "infra")


def judge(result: TrialResult, prof: Profile, infra_tries: int = 0, flaky_tries: int = 0) -> Verdict:
    """`infra_tries` / `flaky_tries`: how many retries this config already had for that reason."""
    attrs = evidence_attrs(result)
    if is_infra(result):
        retry = infra_tries < prof.search.infra_retries
        return Verdict(TrialState.FAIL, user_attrs={**attrs, "infra_fault": True}, retry=retry,
                       reason="infra fault: retried" if retry else "infra fault: retries exhausted")
    if result.crash and result.crash.cls == "flaky" and flaky_tries < prof.search.flaky_retries:
        return Verdict(TrialState.FAIL, user_attrs={**attrs, "flaky_retry": True}, retry=True,
                       reason="flaky crash: one more try on a clean host")
    sc = score(result, prof)
    lv, slo_c = sc.level, sc.slo
    if result.status == "pruned":
        attrs["saved_s"] = round(result.saved_s, 3)
        return Verdict(TrialState.PRUNED, user_attrs=attrs, reason="pruned on the ladder")
    constraints = {"crash": 0.0, "slo": slo_c}
    if result.crash or result.status == "crashed":
        constraints["crash"] = crash_constraint(result, prof)
        reason = f"crashed ({result.crash.cls if result.crash else 'unknown'})"
    elif lv is None or sc.value <= 0:
        constraints["crash"] = 1.0
        attrs["degenerate"] = True
        reason = "no stable level with output: infeasible"
    else:
        reason = "ok" if slo_c <= 0 else "SLO not met"
    if lv is not None:
        attrs["best_concurrency"] = lv.concurrency
    if sc.ci95:
        attrs["objective_ci95"] = sc.ci95
    if sc.per_workload:
        attrs["objective_per_workload"] = {k: round(v, 2) for k, v in sc.per_workload.items()}
    return Verdict(TrialState.COMPLETE, _values(sc, prof), constraints, attrs, reason=reason)
