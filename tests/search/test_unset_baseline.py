"""A baseline that leaves knobs to SGLang (no `default:`, no base flag): the values SGLang chose are read from its
own log (real SGLang 0.5.17 logs here), and the local steps walk from them one knob at a time instead of leaving
those knobs for the sampler to draw."""
from __future__ import annotations

import datetime
from pathlib import Path

import optuna
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.profile import load_profile
from tunectl.search.effective import chosen, effective, effective_params, nearest
from tunectl.search.space import UNSET_ATTR, distribution, unset_in_baseline
from tunectl.sglang import memory
from tunectl.sglang.crashes.classifier import LogWatcher

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs" / "llama8b-h100"
E2E0 = ROOT / "docs" / "real-gpu" / "e2e" / "llama8b-h100" / "results" / "e2e-llama8b" / "trials" / "0"
PROF = load_profile(ROOT / "profiles" / "fit-llama8b-h100.yaml")


def facts(path: Path) -> dict[str, float]:
    return LogWatcher.read(path.read_bytes()).facts


def test_the_values_sglang_ran_with_are_read_from_its_log() -> None:
    # flags passed (the end-to-end search's trial 0 passed graphs to 64, max-running 138, chunk 8,192): given back
    assert memory.resolved(facts(E2E0 / "server.log")) == {
        "max-running-requests": 138, "chunked-prefill-size": 8192, "cuda-graph-max-bs": 64}
    # a flag left out: the KV-pressure launch left the decode graphs' max batch to SGLang (its server_args say
    # None) and SGLang captured up to 256
    text = (LOGS / "kv-pressure.log").read_text()
    assert "cuda_graph_max_bs_decode=None" in text
    assert memory.resolved(facts(LOGS / "kv-pressure.log"))["cuda-graph-max-bs"] == 256
    # graphs off: no graph size to read, the others still are
    assert set(memory.resolved(facts(LOGS / "eager-queue-at-cap.log"))) == {"max-running-requests",
                                                                          "chunked-prefill-size"}


def _baseline(unset: list[str], facts: dict[str, float]) -> optuna.trial.FrozenTrial:
    params = {"cuda-graph-backend-decode": "full", "kv-cache-dtype": "auto"}
    return create_trial(params=params, distributions={k: distribution(PROF.search.space[k]) for k in params},
                        value=7000.0, state=TrialState.COMPLETE,
                        user_attrs={"role": "baseline", UNSET_ATTR: unset, "server_facts": facts})


def test_a_baseline_left_to_sglang_is_walked_from_at_the_values_sglang_chose() -> None:
    unset = unset_in_baseline(PROF)
    assert unset == ["cuda-graph-max-bs-decode", "max-running-requests", "chunked-prefill-size"]
    t = _baseline(unset, facts(LOGS / "kv-pressure.log"))             # SGLang: 256, 512, 8192
    assert effective_params(PROF.search, t) == {"cuda-graph-backend-decode": "full", "kv-cache-dtype": "auto",
                                                "cuda-graph-max-bs-decode": 256, "max-running-requests": 512,
                                                "chunked-prefill-size": 8192}
    [c] = effective(PROF.search, [t])
    assert c is not t and t.params == {"cuda-graph-backend-decode": "full", "kv-cache-dtype": "auto"}
    assert set(c.distributions) == set(c.params)
    assert chosen(PROF.search, unset, facts(LOGS / "kv-pressure.log")) == {
        "cuda-graph-max-bs-decode": (256, 256), "max-running-requests": (512, 512), "chunked-prefill-size": (8192, 8192)}
    # a value the space cannot take moves to the nearest it can: SGLang's 2,048 requests to the range's 1,024
    spec = PROF.search.space["max-running-requests"]
    assert nearest(spec, 2048) == spec.high == 1024
    assert nearest(PROF.search.space["cuda-graph-max-bs-decode"], 160) == 128
    # a trial that left nothing out is read as it is
    plain = _baseline([], {})
    assert effective(PROF.search, [plain])[0] is plain


def test_the_steps_from_a_baseline_left_to_sglang_move_one_knob(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["search", "--virtual", "--trials", "6", "--profile",
                                   str(ROOT / "profiles" / "fit-llama8b-h100.yaml"), "--study", "s",
                                   "--results", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    # the user is told what SGLang picked, and where the space cannot follow it (the stand-in's cap of 2,048
    # against the profile's 32-1,024)
    said = " ".join(res.output.split())
    assert "baseline: SGLang chose cuda-graph-max-bs-decode=256, max-running-requests=2,048 (not in the search " \
        "space: the steps start from 1,024), chunked-prefill-size=8,192" in said
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    base = study.trials[0]
    assert base.user_attrs["role"] == "baseline" and set(base.user_attrs[UNSET_ATTR]) <= set(PROF.search.space)
    assert not set(base.user_attrs[UNSET_ATTR]) & set(base.params)        # no flag passed for them
    start = effective_params(PROF.search, base)
    assert set(start) == set(PROF.search.space)                            # the stand-in logged what it chose
    local = [t for t in study.trials if t.user_attrs.get("proposed_by") == "local"
             and datetime.datetime.min < t.datetime_start and t.state == TrialState.COMPLETE]
    from_base = [t for t in local if sum(t.params.get(k) != v for k, v in start.items()) == 1]
    assert from_base, [t.params for t in local]
    # no proposal after the baseline drew the knobs it left to SGLang all at once, as a step from an incomplete
    # config would
    assert all(sum(t.params.get(k) != start[k] for k in base.user_attrs[UNSET_ATTR]) < 3 for t in local)
