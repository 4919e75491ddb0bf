"""One knob -> target mapping (tunectl.knobs): the live launch plan and the virtual trial run a trial with the same
flags, environment and patches, for every kind of knob."""
from __future__ import annotations

from typing import Any

import pytest

from tunectl import knobs
from tunectl.profile import Profile
from tunectl.runners.checks.flagcheck import used_flags
from tunectl.runners.checks.readiness import patch_ids
from tunectl.runners.server.plan import build_plan
from tunectl.search.repair import drives
from tunectl.search.space import baseline_params

PATCH = "0001-flashinfer-cutlass-autotune"
OTHER_PATCH = "0002-page-table-1-flattened"


def profile(base_patches: list[str], defaults: bool = True) -> Profile:
    prof = Profile.model_validate({
        "name": "knobs", "model": {"path": "m"},
        "server": {"engine": "sim", "flags": {"--tp-size": 8, "kv-cache-dtype": "fp8_e4m3", "stream-interval": 4},
                   "env": {"SGLANG_BASE": "1", "SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD": "8192"},
                   "patches": base_patches},
        "search": {"space": {
            "max-running-requests": {"type": "categorical", "choices": [64, 256], "default": 64},
            "mem": {"type": "float", "flag": "--mem-fraction-static", "low": 0.8, "high": 0.9, "default": 0.85},
            "tp": {"type": "int", "flag": "tp-size", "choices": [4, 8], "default": 8},
            "disable-radix-cache": {"type": "bool", "default": False},
            "autotune": {"type": "bool", "patch": PATCH, "default": False},
            "pt1": {"type": "bool", "patch": OTHER_PATCH, "default": False},
            "threshold": {"type": "int", "env": "SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD", "choices": [0, 8192],
                          "default": 8192},
            "fast-path": {"type": "bool", "env": "SGLANG_FAST_PATH", "default": False}}}})
    for spec in prof.search.space.values():
        spec.default = spec.default if defaults else None
    return prof


def live(prof: Profile, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    plan = build_plan(prof, params, "run-1", "/tmp/trial")
    return plan.config, plan.env, plan.patches


CASES = [
    ([], {"max-running-requests": 256, "mem": 0.88, "tp": 4, "disable-radix-cache": True, "autotune": True,
          "pt1": False, "threshold": 0, "fast-path": True}),
    ([PATCH, OTHER_PATCH], {"autotune": False, "pt1": True, "fast-path": False, "disable-radix-cache": False}),
    ([PATCH], {"max-running-requests": None, "stream-interval": 16, "--watchdog-timeout": 30}),   # not knobs
]


@pytest.mark.parametrize(("base_patches", "params"), CASES)
def test_the_live_plan_and_the_virtual_trial_agree(base_patches: list[str], params: dict[str, Any]) -> None:
    prof = profile(base_patches)
    flags, env, patches = knobs.merge(prof, params)
    config, live_env, live_patches = live(prof, params)
    assert {k: config[k] for k in flags} == flags
    assert set(config) - set(flags) <= {"model-path", "host", "port"}
    assert {k: live_env[k] for k in env} == env
    assert live_patches == patches


def test_each_kind_of_knob_lands_on_its_target() -> None:
    prof = profile([PATCH])
    flags, env, patches = knobs.merge(prof, CASES[0][1])
    assert flags["tp-size"] == 4 and "--tp-size" not in flags and flags["mem-fraction-static"] == 0.88
    assert flags["disable-radix-cache"] is True and "autotune" not in flags and "threshold" not in flags
    assert env["SGLANG_FAST_PATH"] == "true" and env["SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD"] == "0"
    assert env["SGLANG_BASE"] == "1"
    assert patches == [PATCH]                      # on, once; pt1=False leaves it off
    _, _, off = knobs.merge(prof, {"autotune": False})
    assert off == []                               # a patch knob set to false removes the base's patch
    flags, _, _ = knobs.merge(prof, {"max-running-requests": None})
    assert "max-running-requests" not in flags     # None sets nothing


def test_search_checks_and_repairs_read_the_same_targets() -> None:
    prof = profile([])
    space = prof.search.space
    assert drives("tp", space["tp"], "tp_size") and drives("mem", space["mem"], "mem-fraction-static")
    assert drives("autotune", space["autotune"], f"patch:{PATCH}") and not drives("autotune", space["autotune"],
                                                                                  "autotune")
    assert drives("threshold", space["threshold"], "SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD")
    checked = {flag for _, flag, _ in used_flags(prof)}
    assert {"tp-size", "mem-fraction-static", "max-running-requests", "disable-radix-cache"} <= checked
    assert not checked & {"autotune", "pt1", "threshold", "fast-path", "SGLANG_FAST_PATH"}
    assert patch_ids(profile([OTHER_PATCH])) == [OTHER_PATCH, PATCH]
    base = baseline_params(profile([PATCH], defaults=False))       # the base flags, env and patches
    assert (base["tp"], base.get("mem"), base["autotune"], base["pt1"], base["threshold"]) == (8, None, True, False,
                                                                                           8192)
