"""A user's bad input and a hostile file system give one line and exit 1 or 2, never a traceback: a study holding
an `interrupted` trial, --results pointing at a file, a read-only results folder (sweep, search resume, report),
a 300-character study name, a --set value that is not YAML, a half-truncated study.db. bench/probe_inputs.py
runs the longer list."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.reports.fixtures import build_search_study, make_trial, write_trial
from tunectl.cli import app
from tunectl.store import StudyStore
from tunectl.wiring.study import close_interrupted

LONG = "a" * 300


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def assert_one_line(res, codes=(1, 2)) -> str:
    assert res.exit_code in codes, (res.exit_code, res.output)
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip() and not ln.startswith("study: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


def test_trials_prints_a_study_holding_an_interrupted_trial(tmp_path: Path) -> None:
    store = build_search_study(tmp_path)
    t = make_trial(11, "search", "running", {"max-running-requests": 512, "cuda-graph-bs": "[1,2]"}, 900.0,
                   None, None)
    write_trial(store, t)
    close_interrupted(store, 11)                       # what resume does with a trial a dead worker left running
    assert store.read_trial(11).status == "interrupted"
    res = invoke("trials", "--results", str(tmp_path))
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("│ 11 │"))
    assert "interrupted" in row and "cuda-graph-bs=[1,2]" in row        # a value's brackets print as written


def test_results_pointing_at_a_file_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    line = assert_one_line(invoke("search", "--virtual", "--trials", "2", "--results", str(f)))
    assert str(f) in line and "not a folder" in line
    assert_one_line(invoke("sweep", "-c", "1", "--results", str(f), "--study", "s"))
    assert_one_line(invoke("report", "--results", str(f)))
    assert f.read_text() == "x"


def test_a_300_character_study_name_is_one_line(tmp_path: Path) -> None:
    for cmd in (["search", "--virtual", "--trials", "2"], ["sweep", "-c", "1"], ["report"], ["trials"]):
        assert_one_line(invoke(*cmd, "--study", LONG, "--results", str(tmp_path)))


@pytest.mark.parametrize("value", ["context-length=[1,", "tp-size=: :", "served-model-name=!!python/object x",
                                   "json-model-override-args={a"])
def test_a_set_value_that_is_not_yaml_is_one_line(value: str) -> None:
    line = assert_one_line(invoke("sweep", "--dry-run", "--set", value), codes=(2,))
    assert line.startswith(f"error: --set {value.split('=')[0]}: ") and "not a valid value" in line


def test_a_quoted_set_value_is_taken_as_a_string() -> None:
    res = invoke("sweep", "--dry-run", "--set", 'served-model-name="!!x"')
    assert res.exit_code == 0 and "--served-model-name '!!x'" in res.stdout


def test_a_half_truncated_study_db_is_one_line_and_nothing_changes(tmp_path: Path) -> None:
    res = invoke("search", "--virtual", "--trials", "2", "--study", "s", "--results", str(tmp_path))
    assert res.exit_code == 0, res.output
    db = tmp_path / "s" / "study.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    before = {p: p.read_bytes() for p in (tmp_path / "s" / "trials").rglob("*.json")}
    for virtual in (["--virtual"], []):
        line = assert_one_line(invoke("search", *virtual, "--trials", "3", "--study", "s", "--results",
                                      str(tmp_path)), codes=(1,))
        assert str(db) in line and "database" in line
    assert {p: p.read_bytes() for p in (tmp_path / "s" / "trials").rglob("*.json")} == before


def _unprivileged() -> list[str] | None:
    """A prefix that runs a command without root's power to write into read-only folders, or None."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_a_read_only_results_folder_is_one_line(tmp_path: Path) -> None:
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("root without setpriv: a read-only folder is writable")
    res = invoke("search", "--virtual", "--trials", "2", "--study", "s", "--results", str(tmp_path))
    assert res.exit_code == 0, res.output
    for p in [tmp_path, *tmp_path.rglob("*")]:
        if p.is_dir():
            p.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        for cmd in (["search", "--virtual", "--trials", "3", "--study", "s"], ["report", "--study", "s"],
                    ["sweep", "-c", "1", "--study", "sw"]):
            proc = subprocess.run([*prefix, sys.executable, "-m", "tunectl", *cmd, "--results", str(tmp_path)],
                                  capture_output=True, text=True, timeout=120, check=False)
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("study: ")]
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, (cmd, proc.stderr)
            assert len(lines) == 1 and "permission denied" in lines[0], (cmd, proc.stderr)
    finally:
        for p in [tmp_path, *tmp_path.rglob("*")]:
            if p.is_dir():
                p.chmod(stat.S_IRWXU)


def test_an_unknown_sim_card_is_a_profile_mistake_not_a_crash(tmp_path: Path) -> None:
    """It was recorded as the config's startup crash (exit 0); it is the profile's mistake, found on loading."""
    import yaml

    from tunectl.profile import default_profile_path

    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["sim"]["card"] = "no-such-card"
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    line = assert_one_line(invoke("sweep", "-c", "1", "-p", str(p), "--results", str(tmp_path / "r")), codes=(2,))
    assert "server.sim.card: 'no-such-card': no such sim card; known cards: " in line
    assert "glm5-nvfp4-8x-rtx-pro-6000" in line and not (tmp_path / "r").exists()


def test_an_empty_study_name_is_refused_not_the_default(tmp_path: Path) -> None:
    line = assert_one_line(invoke("search", "--virtual", "--trials", "2", "--study", "", "--results",
                                  str(tmp_path)), codes=(2,))
    assert line.startswith("error: --study: '': ") and not any(tmp_path.iterdir())


def _profile_with(tmp_path: Path, edit) -> Path:
    import yaml

    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "profiles" / "sim-glm5.yaml").read_text())
    edit(data)
    out = tmp_path / "p.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _knob(name: str, **values):
    return lambda d: d["search"]["space"][name].update(values)


@pytest.mark.parametrize("edit, says", [
    (_knob("max-running-requests", default=99999), "default: 99999 is not one of the choices"),
    (_knob("disable-radix-cache", default="yes"), "default: 'yes' is not true or false"),
    (_knob("mem-fraction-static", step=-0.01), "step must be > 0"),
    (_knob("max-running-requests", choices=[64, 64, 128], default=64), "choices name 64 twice"),
    (lambda d: d["search"]["space"].update(bs={"type": "int", "flag": "cuda-graph-max-bs", "low": 1.5,
                                                "high": 9.7}), "type 'int' needs whole low and high"),
    (lambda d: d["search"]["space"].update(bs={"type": "int", "flag": "cuda-graph-max-bs", "low": 8, "high": 64,
                                                "default": 128}), "default: 128 is outside low..high"),
    (lambda d: d["search"].update(try_first=[{"max-running-requests": "lots"}]),
     "search.try_first[0].max-running-requests: 'lots' is not one of the choices"),
    (lambda d: d["search"].update(seed=-1), "search.seed"),
    (lambda d: d["bench"].update(workloads=[]), "bench.workloads"),
    # a knob with no default starts trial 0 at its base flag: one its choices or range must hold
    (lambda d: (d["server"]["flags"].update({"max-running-requests": 64}), d["search"]["space"].update(
        {"max-running-requests": {"type": "categorical", "choices": [128, 256]}})),
     "search.space.max-running-requests: the baseline takes server.flags.max-running-requests = 64, which is not "
     "one of the choices [128, 256]"),
    (lambda d: (d["server"]["flags"].update({"max-running-requests": "lots"}), d["search"]["space"].update(
        {"max-running-requests": {"type": "int", "low": 64, "high": 512}})), "= 'lots', which is not a whole number"),
])
def test_a_knob_value_the_space_cannot_take_is_one_line_before_anything_runs(tmp_path: Path, edit, says) -> None:
    """Each of these passed the profile's check and then ended in an Optuna traceback at the first trial that
    asked for the knob (after a whole baseline had run, for try_first), or ran a search that measured nothing."""
    prof = _profile_with(tmp_path, edit)
    res = invoke("search", "--virtual", "--trials", "1", "-p", str(prof), "--results", str(tmp_path / "r"))
    line = assert_one_line(res, codes=(2,))
    assert str(prof) in line and says in line, line
    assert not (tmp_path / "r").exists()                     # nothing started, nothing half-made


def test_a_seed_outside_the_samplers_range_is_one_line(tmp_path: Path) -> None:
    for seed in ("-1", str(2**32)):
        line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "--seed", seed,
                                      "--results", str(tmp_path / "r")), codes=(2,))
        assert line.startswith(f"error: --seed: {seed}: must be 0 .."), line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("url, says", [
    ("sqlite://relative.db", "an SQLite URL names a file"),
    ("sqlite:///", "an SQLite URL names a file"),
    ("sqlite:///:memory:", "an in-memory database keeps nothing"),
    ("mysql://u:secret@127.0.0.1:1/db", "cannot open this kind of database here"),
    ("", "empty; leave --storage out"),                   # an unset variable in a script: never the default
    ("sqlite:///no/such/folder/s.db", "the folder no/such/folder does not exist"),
])
def test_a_storage_url_that_cannot_hold_a_study_is_one_line(tmp_path: Path, url: str, says: str) -> None:
    line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "--storage", url,
                                  "--results", str(tmp_path / "r"), "--study", "s"), codes=(2,))
    assert says in line and "secret" not in line, line
    folder = assert_one_line(invoke("search", "--virtual", "--trials", "1", "--storage", f"sqlite:///{tmp_path}",
                                    "--results", str(tmp_path / "r"), "--study", "s"), codes=(2,))
    assert "is a folder; name the database file in it" in folder, folder


@pytest.mark.parametrize("content", [bytes(range(128, 256)) * 8, "name: x\n".encode("utf-16"),
                                     b"\x00name: x\n"])
def test_a_profile_that_is_not_utf8_yaml_text_is_one_line(tmp_path: Path, content: bytes) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_bytes(content)
    line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "-p", str(prof),
                                  "--results", str(tmp_path / "r")), codes=(2,))
    assert line.startswith(f"error: {prof}"), line


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["search"]["space"].update({"no-such-flag": {"type": "bool"}}),
     "search.space.no-such-flag: --no-such-flag is not a flag of SGLang 0.5.9"),
    (lambda d: d["search"]["space"]["moe-runner-backend"].update(choices=["bogus", "triton"], default="triton"),
     "'bogus' is not a valid choice for --moe-runner-backend"),
    (lambda d: d["server"]["flags"].update({"tp-size": "eight"}),
     "server.flags.tp-size: 'eight' is not a whole number"),
])
def test_the_virtual_model_refuses_the_flags_a_real_server_would(tmp_path: Path, edit, says) -> None:
    """`--virtual` runs no server to refuse a flag, and named a winner with `--no-such-flag` in it; it now checks
    the profile against the bundled --help of its SGLang version, as `tunectl check` does against the host's."""
    prof = _profile_with(tmp_path, edit)
    line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "-p", str(prof),
                                  "--results", str(tmp_path / "r")), codes=(2,))
    assert says in line and str(prof) in line, line


def test_a_number_flag_given_a_word_is_refused_before_launch(tmp_path: Path) -> None:
    """`tp-size: eight` passed `check` ("23 flags valid") and crashed every trial at launch (exit 0, "no stable
    configuration"); SGLang's argparse types are now checked by `check` and `--set`."""
    from tunectl.profile import load_profile
    from tunectl.runners.checks.flagcheck import problems
    from tunectl.sglang.flags import bundled_flags

    prof = load_profile(_profile_with(tmp_path, lambda d: d["server"]["flags"].update({"tp-size": "eight"})))
    bad = problems(prof, bundled_flags("0.5.9"), "SGLang 0.5.9")
    assert len(bad) == 1 and "server.flags.tp-size: 'eight' is not a whole number" in bad[0], bad
    assert problems(load_profile(_profile_with(tmp_path, lambda d: None)), bundled_flags("0.5.9"), "x") == []
    for flag, word in (("tp-size", "eight"), ("context-length", "abc"), ("watchdog-timeout", "long")):
        line = assert_one_line(invoke("sweep", "--dry-run", "-c", "1", "--set", f"{flag}={word}",
                                      "--results", str(tmp_path / "r")), codes=(2,))
        assert line.startswith(f"error: --set {flag}: {word!r} is not a"), line


@pytest.mark.parametrize("flag, value, says", [
    ("tp-size", "0", "0 is out of range: --tensor-parallel-size takes a number >= 1"),
    ("port", "70000", "70000 is out of range: --port takes a number >= 1 and <= 65535"),
    ("watchdog-timeout", "0", "0 is out of range: --watchdog-timeout takes a number > 0"),
    ("watchdog-timeout", "nan", "nan is not a finite number"),
    ("stream-interval", "-1", "-1 is out of range: --stream-interval takes a number >= 1"),
])
def test_a_number_flag_sglang_cannot_run_with_is_refused_before_launch(tmp_path: Path, flag: str, value: str,
                                                                       says: str) -> None:
    """`--set tp-size=0` (or nan, or a port past 65,535) passed argparse's type and went to a launch that could
    only crash at startup; the same check refuses it in a profile, in `--set` and in `check`."""
    from tunectl.profile import load_profile
    from tunectl.runners.checks.flagcheck import problems
    from tunectl.sglang.flags import bundled_flags

    line = assert_one_line(invoke("sweep", "--dry-run", "-c", "1", "--set", f"{flag}={value}",
                                  "--results", str(tmp_path / "r")), codes=(2,))
    assert line.startswith(f"error: --set {flag}: ") and says in line, line
    prof = load_profile(_profile_with(tmp_path, lambda d: d["server"]["flags"].update({flag: value})))
    bad = problems(prof, bundled_flags("0.5.9"), "SGLang 0.5.9")
    assert len(bad) == 1 and f"server.flags.{flag}: " in bad[0] and says in bad[0], bad


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.setdefault("objective", {}).update(slo={"p99_ttft_ms": -5}), "objective.slo:"),
    (lambda d: d["bench"].update(levels=[True, 4]), "bench.levels.0"),
    (lambda d: d["bench"].update(min_level_s=200, max_level_s=100), "bench.min_level_s: 200.0: must be at most"),
])
def test_a_bench_or_objective_value_that_cannot_mean_anything_is_one_line(tmp_path: Path, edit, says) -> None:
    prof = _profile_with(tmp_path, edit)
    line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "-p", str(prof),
                                  "--results", str(tmp_path / "r")), codes=(2,))
    assert says in line, line


def test_a_key_given_twice_is_one_line_naming_the_second(tmp_path: Path) -> None:
    """YAML lets the second of two equal keys win in silence: a profile that sets `levels` twice ran the second."""
    text = (Path(__file__).resolve().parents[1] / "profiles" / "sim-glm5.yaml").read_text()
    assert "\n  levels:" in text
    prof = tmp_path / "p.yaml"
    prof.write_text(text.replace("\n  levels:", "\n  levels: [1]\n  levels:", 1))
    line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "-p", str(prof),
                                  "--results", str(tmp_path / "r")), codes=(2,))
    second = 1 + prof.read_text().splitlines().index(next(ln for ln in prof.read_text().splitlines()
                                                          if ln.startswith("  levels: [1, ")))
    assert line.startswith(f"error: {prof}:{second}: bench.levels: given twice"), line


def test_sweep_refuses_levels_and_rates_together_and_negative_launches_even_dry() -> None:
    """`-c 4 -r 2` ran the rate alone (rates replace the levels) in silence; `--dry-run --launches -1` passed."""
    line = assert_one_line(invoke("sweep", "--dry-run", "-c", "4", "-r", "2"), codes=(2,))
    assert "a sweep runs closed-loop levels or open-loop rates" in line, line
    line = assert_one_line(invoke("sweep", "--dry-run", "--launches", "-1"), codes=(2,))
    assert line == "error: --launches: -1: expected 1 or more fresh launches", line


def test_the_virtual_model_refuses_an_sglang_version_the_stand_in_does_not_play(tmp_path: Path) -> None:
    prof = _profile_with(tmp_path, lambda d: d["server"].update(sglang_version="9.9.9"))
    line = assert_one_line(invoke("search", "--virtual", "--trials", "1", "-p", str(prof),
                                  "--results", str(tmp_path / "r")), codes=(2,))
    assert "server.sglang_version: '9.9.9'" in line and "0.5.9" in line and "0.5.17" in line, line


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["host"].update(workdir="relative/dir"), "host.workdir: 'relative/dir': an absolute folder"),
    (lambda d: d["host"].update(workdir=""), "host.workdir: '': an absolute folder"),
    (lambda d: d["host"].update(port=70000), "host.port: 70000"),
    (lambda d: d["host"].update(connect_timeout_s=-1), "host.connect_timeout_s: -1"),
    (lambda d: d["host"].update(min_free_disk_gb=float("nan")), "host.min_free_disk_gb: nan"),
    (lambda d: d["host"].update(gpus=[0, 0]), "host.gpus: [0, 0]: GPU ids are distinct integers >= 0"),
    (lambda d: d["host"].update(gpus=[-1]), "host.gpus: [-1]"),
    (lambda d: d["server"]["flags"].update(config="/tmp/other.yaml"), "server.flags.config: tunectl writes"),
])
def test_a_host_field_that_cannot_work_is_one_line_before_check_touches_the_host(tmp_path: Path, edit,
                                                                               says) -> None:
    """A relative workdir sent `tunectl check` into an endless loop (the disk probe walked "relative" up to itself);
    an empty one put trial folders under /; the others passed to fail later, or never (a negative timeout, a
    free-disk minimum of nan, GPU -1 as CUDA_VISIBLE_DEVICES); `config` put a second --config into the config."""
    prof = _profile_with(tmp_path, edit)
    res = subprocess.run([sys.executable, "-m", "tunectl", "check", "-p", str(prof)], capture_output=True,
                         text=True, timeout=120, check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and says in lines[0], res.stderr + res.stdout


def test_free_disk_is_read_for_a_relative_path_too() -> None:
    """The probe that hung: it walks up to a folder that exists, and a relative path ends at the current one."""
    import threading

    from tunectl.runners.checks.hostcheck import free_disk_gb
    from tunectl.runners.hosts.local import LocalRunner

    got: list[float] = []
    t = threading.Thread(target=lambda: got.append(free_disk_gb(LocalRunner(), "no/such/dir")),
                         daemon=True)
    t.start()
    t.join(30)
    assert got and got[0] > 0


def test_versions_move_of_a_file_that_is_no_profile_is_one_line(tmp_path: Path) -> None:
    """`versions move -p /etc/passwd` (or a YAML list) was an AttributeError traceback; `--to 9.9` blamed the
    profile's server.flags.tp-size for a version that does not exist."""
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "text.yaml").write_text("root:x:0:0:root:/root:/bin/bash\n")
    for name in ("list.yaml", "text.yaml"):
        line = assert_one_line(invoke("versions", "move", "--to", "0.5.23", "-p", str(tmp_path / name)),
                               codes=(2,))
        assert str(tmp_path / name) in line and "a profile is a YAML mapping" in line, line
    line = assert_one_line(invoke("versions", "move", "--to", "9.9"), codes=(2,))
    assert line.startswith("error: --to 9.9: no bundled --help text") and "0.5.23" in line, line


def test_versions_add_never_writes_the_stand_ins_help_over_a_bundled_version(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`tunectl versions add` on the embedded default (the stand-in) wrote the stand-in's --help, under the version
    of whatever sglang package the interpreter had, over the bundled real launch_server-0.5.9.txt."""
    monkeypatch.setattr("tunectl.sglang.flags.HELP_DIR", tmp_path)
    monkeypatch.setattr("tunectl.commands.versions.HELP_DIR", tmp_path)
    line = assert_one_line(invoke("versions", "add"), codes=(2,))
    assert "server.engine: sim" in line and "--source" in line, line
    (tmp_path / "src" / "srt").mkdir(parents=True)
    (tmp_path / "src" / "srt" / "server_args.py").write_text("")
    line = assert_one_line(invoke("versions", "add", "--source", str(tmp_path / "src"), "--version", "../x"),
                           codes=(2,))
    assert "--version '../x'" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]              # nothing written
