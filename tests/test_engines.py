"""The Engine object answers what differs between the stand-in and real SGLang; the launch plan, the deadlines
and the flag check read it."""
from __future__ import annotations

import typing

from tunectl.engines import ENGINES, engine
from tunectl.profile import Profile, ServerSpec
from tunectl.runners.checks.flagcheck import help_argv
from tunectl.runners.server.lifecycle import PHASE_SLACK_S, scaled
from tunectl.runners.server.plan import build_plan


def profile(name: str) -> Profile:
    return Profile.model_validate({"name": "e", "model": {"path": "m"},
                                   "server": {"engine": name, "patches": ["0001-flashinfer-cutlass-autotune"],
                                              "sim": {"time_scale": 0.25}}})


def test_every_profile_engine_has_an_engine() -> None:
    assert set(typing.get_args(ServerSpec.model_fields["engine"].annotation)) == set(ENGINES)


def test_the_stand_in_launches_itself_with_its_card_and_patches_by_env() -> None:
    prof = profile("sim")
    plan = build_plan(prof, {}, "r", "/t")
    assert plan.exec_argv[1:3] == ["-m", "tunectl.sim.launch_server"] and "--sim-card" in plan.exec_argv
    assert plan.env["TUNECTL_SIM_PATCHES"] == "0001-flashinfer-cutlass-autotune"
    assert scaled(prof, 100.0) == 100.0 * 0.25 + PHASE_SLACK_S
    assert help_argv(prof)[1:] == ["-m", "tunectl.sim.launch_server", "--help"]
    assert not engine(prof).uses_gpus and engine(prof).has_model


def test_sglang_launches_sglang_on_real_time_with_patches_on_the_host() -> None:
    prof = profile("sglang")
    plan = build_plan(prof, {}, "r", "/t")
    assert plan.exec_argv[1:3] == ["-m", "sglang.launch_server"]
    assert not any(a.startswith("--sim-") for a in plan.argv) and "TUNECTL_SIM_PATCHES" not in plan.env
    assert plan.patches == ["0001-flashinfer-cutlass-autotune"]
    assert scaled(prof, 100.0) == 100.0
    assert engine(prof).uses_gpus and engine(prof).patches_on_host and not engine(prof).has_model
