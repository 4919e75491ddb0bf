"""Study identity: a study refuses trials of another setup (SGLang version, patches, model, GPUs, engine,
workload, bench ladder and client, objective) or another search space with one line naming what changed and the two ways on, exit 2, and leaves no
trial RUNNING or WAITING behind."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from tests.search.conftest import SPACE, make_profile
from tunectl.cli import app
from tunectl.errors import UsageError
from tunectl.profile import Profile
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

FINALISTS = {"top_k": 1, "reruns": 1}


def _run(prof: Profile, root: Path, trials: int = 3, study: str | None = None) -> Any:
    return run_search(prof, trials=trials, root=root, evaluate=VirtualEvaluator(prof), seed=0, study_name=study)


def _nothing_left_running(root: Path, name: str) -> None:
    storage = f"sqlite:///{root / name / 'study.db'}"
    states = {t.state for t in optuna.load_study(study_name=name, storage=storage).trials}
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states


@pytest.mark.parametrize(("over", "said"), [
    ({"server__sglang_version": "0.5.17",
      "search__space": {k: v for k, v in SPACE.items() if k != "autotune-patch"}},
     r"SGLang 0.5.9 -> 0.5.17; patches 0001-flashinfer-cutlass-autotune@4bb28f79 -> none"),
    ({"model__path": "zai-org/GLM-5-FP8"}, r"model zai-org/GLM-5-NVFP4 -> zai-org/GLM-5-FP8"),
    ({"bench__workloads": [{"kind": "random", "input_len": 1024}]}, r"workload kind=random input_len=256 .*"
                                                                     r"-> kind=random input_len=1024"),
    ({"objective__metric": "total_throughput"}, r"metric=output_throughput -> .*metric=total_throughput"),
    ({"bench__levels": [1, 4, 16]}, r"bench levels=\[.*\] client=builtin .*-> levels=\[1, 4, 16\]"),
    ({"bench__client": "bench_serving"}, r"bench .*client=builtin .*-> .*client=bench_serving"),
    ({"objective__slo": {"p99_ttft_ms": 2000.0}}, r"objective mode=throughput slo=\{\} .*-> .*"
                                                   r"slo=\{'p99_ttft_ms': 2000.0\}"),
])
def test_another_setup_is_refused_with_what_changed_and_the_two_ways_on(tmp_path: Path, over: dict[str, Any],
                                                                       said: str) -> None:
    _run(make_profile(search__finalists=FINALISTS), tmp_path)
    moved = make_profile(search__finalists=FINALISTS, **over)
    with pytest.raises(UsageError, match=said) as e:
        _run(moved, tmp_path, trials=5)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert "--study search-test-" in str(e.value) and "--warm-start search-test" in str(e.value)
    _nothing_left_running(tmp_path, "search-test")


def test_a_study_recorded_before_the_ladder_and_objective_were_part_of_it_resumes(tmp_path: Path) -> None:
    """Fields a study's fingerprint lacks are not compared: a study from an earlier release extends as before."""
    prof = make_profile(search__finalists=FINALISTS)
    _run(prof, tmp_path)
    storage = f"sqlite:///{tmp_path / 'search-test' / 'study.db'}"
    study = optuna.load_study(study_name="search-test", storage=storage)
    old = {k: v for k, v in study.user_attrs["tunectl:identity"].items() if k not in ("ladder", "objective")}
    study.set_user_attr("tunectl:identity", old)
    assert _run(make_profile(search__finalists=FINALISTS, bench__levels=[1, 4, 16]), tmp_path, trials=4).trials == 4
    with pytest.raises(UsageError, match=r"bench levels=\[1, 4, 16\]"):     # now recorded: compared from here on
        _run(prof, tmp_path, trials=5)


def test_the_same_setup_resumes_and_a_new_name_starts_fresh(tmp_path: Path) -> None:
    prof = make_profile(search__finalists=FINALISTS)
    _run(prof, tmp_path)
    assert _run(prof, tmp_path, trials=4).trials == 4                     # same fingerprint: extends
    moved = make_profile(search__finalists=FINALISTS, server__sglang_version="0.5.17",
                         search__space={k: v for k, v in SPACE.items() if k != "autotune-patch"})
    assert _run(moved, tmp_path, study="search-test-0.5.17").trials == 3


@pytest.mark.parametrize(("space", "said"), [
    ({**SPACE, "max-running-requests": {**SPACE["max-running-requests"], "choices": [64, 128, 4096]}},
     r"max-running-requests: choices added 4096; max-running-requests: choices removed 256, 512, 1024, 2048"),
    ({**SPACE, "chunked-prefill-size": {"type": "int", "choices": [4096, 8192]}}, r"new knob 'chunked-prefill-size'"),
    ({k: v for k, v in SPACE.items() if k != "disable-radix-cache"}, r"knob 'disable-radix-cache' removed"),
    ({**SPACE, "mem-fraction-static": {**SPACE["mem-fraction-static"], "high": 0.96}},
     r"mem-fraction-static: high 0.94 -> 0.96"),
])
def test_a_changed_space_is_one_line_naming_each_change(tmp_path: Path, space: dict[str, Any], said: str) -> None:
    _run(make_profile(search__finalists=FINALISTS), tmp_path)
    with pytest.raises(UsageError, match=said) as e:
        _run(make_profile(search__finalists=FINALISTS, search__space=space), tmp_path, trials=5)
    assert "restore it to resume" in str(e.value) and "--warm-start search-test" in str(e.value)
    _nothing_left_running(tmp_path, "search-test")


def test_the_cli_says_it_in_one_line_with_exit_2(tmp_path: Path) -> None:
    import yaml

    from tunectl.profile import default_profile_path

    data = yaml.safe_load(default_profile_path().read_text())
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data))
    data["server"]["sglang_version"] = "0.5.17"
    del data["search"]["space"]["flashinfer-cutlass-autotune"]
    data["search"]["try_first"] = []
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(data))
    base = ["search", "--virtual", "--json", "--trials", "3", "--results", str(tmp_path / "r")]
    assert CliRunner().invoke(app, [*base, "-p", str(old)]).exit_code == 0
    res = CliRunner().invoke(app, [*base, "-p", str(new)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.strip().count("\n") == 0
    assert "study 'sim-glm5' holds" in res.output and "SGLang 0.5.9 -> 0.5.17" in res.output


def test_the_gpu_model_and_count_come_from_the_hosts_nvidia_smi(tmp_path: Path) -> None:
    from tunectl.runners.checks.hostcheck import gpu_names
    from tunectl.runners.hosts.local import LocalRunner

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, NVIDIA H200\\n1, NVIDIA H200\\n2, NVIDIA H100 80GB HBM3\\n'\n")
    smi.chmod(0o755)
    assert gpu_names(LocalRunner(), [0, 2], smi=str(smi)) == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert len(gpu_names(LocalRunner(), None, smi=str(smi))) == 3
