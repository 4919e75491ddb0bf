"""`tunectl check` runs before every study: a flag the host's SGLang does not know stops the study before any
launch, with a did-you-mean; secrets in server.env never reach study.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunectl.profile import Profile, default_profile_path
from tunectl.runners.checks.readiness import ChecksFailed
from tunectl.runners.hosts.local import LocalRunner
from tunectl.wiring.study import preflight, run_search
from tunectl.wiring.virtual import VirtualEvaluator


def _profile(tmp_path: Path, **flags: object) -> Profile:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["flags"].update(flags)
    data["host"] = {"kind": "local", "workdir": str(tmp_path / "host")}
    return Profile.model_validate(data)


def test_a_misspelt_flag_stops_the_study_before_any_launch(tmp_path: Path) -> None:
    prof = _profile(tmp_path, **{"mem-fraction-statik": 0.8})
    with pytest.raises(ChecksFailed, match="mem-fraction-statik.*did you mean --mem-fraction-static") as e:
        run_search(prof, trials=2, root=tmp_path / "results", runner=LocalRunner())
    assert e.value.exit_code == 2                                           # the profile's mistake
    assert not (tmp_path / "results" / prof.name).exists()                 # no study, nothing launched


class CountingRunner(LocalRunner):
    """The real local runner; counts how often it is closed."""
    closed = 0

    def close(self) -> None:
        type(self).closed += 1
        super().close()


@pytest.mark.parametrize("stop", ["preflight", "ctrl-c"])
def test_the_runner_a_search_makes_is_closed_on_the_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            stop: str) -> None:
    monkeypatch.setattr("tunectl.wiring.study.make_runner", lambda prof: CountingRunner())
    monkeypatch.setattr(CountingRunner, "closed", 0)
    prof = _profile(tmp_path, **({"mem-fraction-statik": 0.8} if stop == "preflight" else {}))

    def on_event(kind: str, data: dict) -> None:
        if kind == "resume":                  # the study is open, the host lock held: Ctrl-C here
            raise KeyboardInterrupt

    with pytest.raises(ChecksFailed if stop == "preflight" else KeyboardInterrupt):
        run_search(prof, trials=2, root=tmp_path / "results", on_event=on_event)
    assert CountingRunner.closed == 1


def test_a_taken_port_says_whose_and_how_to_move(tmp_path: Path) -> None:
    import os
    import socket

    prof = _profile(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        prof.server.port = s.getsockname()[1]
        with pytest.raises(ChecksFailed) as e:
            run_search(prof, trials=2, root=tmp_path / "results", runner=LocalRunner())
    assert e.value.exit_code == 1
    assert f"port {prof.server.port} is taken by pid {os.getpid()}" in str(e.value)
    assert "(stop that server or set server.port)" in str(e.value)            # what a user does about it


def test_a_clean_profile_passes(tmp_path: Path) -> None:
    preflight(_profile(tmp_path), LocalRunner())


def test_study_json_has_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["env"] = {"SGLANG_API_KEY": "s3cret-value", "OTHER": "x"}
    prof = Profile.model_validate(data)
    run_search(prof, trials=2, root=tmp_path, evaluate=VirtualEvaluator(prof), seed=0)
    text = (tmp_path / prof.name / "study.json").read_text()
    assert "s3cret-value" not in text
    assert json.loads(text)["profile"]["server"]["env"] == {"SGLANG_API_KEY": "<redacted>", "OTHER": "x"}


@pytest.mark.parametrize("trials", ["0", "-3"])
def test_trials_must_be_positive(trials: str) -> None:
    from typer.testing import CliRunner

    from tunectl.cli import app

    res = CliRunner().invoke(app, ["search", "--trials", trials, "--json"])
    assert res.exit_code == 2 and f"--trials: {trials}: must be a positive number" in res.output
