"""Nothing recorded is lost or written over (tunectl/wiring/recovery.py): a result written but never told to the study
is told at resume; an empty or corrupt study.db is refused while trial records exist, and the study is rebuilt
from its trial files; a trial record turned to garbage is named, not skipped."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.search.conftest import make_profile
from tunectl.errors import InfraError
from tunectl.store import StudyStore
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator, recorded

ROOT = Path(__file__).resolve().parents[1]
FINALISTS = {"top_k": 1, "reruns": 1}

# A search whose evaluator SIGKILLs its own process right after trial KILL_AT's final trial.json is written:
# the moment between the record and telling Optuna (teardown, the log copy and the study's writes run there).
KILLED_AFTER_RECORD = """
import os, signal, sys
from tests.search.conftest import make_profile
from tunectl.store import StudyStore
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator, recorded
root, kill_at = sys.argv[1], int(sys.argv[2])
prof = make_profile(search__finalists={"top_k": 1, "reruns": 1})
inner = recorded(VirtualEvaluator(prof, 0), prof, StudyStore(prof.name, root))
def evaluate(n, params, role, prune=None):
    result = inner(n, params, role, prune)
    if n == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
run_search(prof, trials=6, root=root, evaluate=evaluate, seed=0)
"""


def _study(root: Path, name: str = "search-test") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / name / 'study.db'}")


def _search(root: Path, trials: int, calls: list[int] | None = None, **kw: object) -> object:
    prof = make_profile(search__finalists=FINALISTS)
    inner = recorded(VirtualEvaluator(prof, 0), prof, StudyStore(prof.name, root))

    def evaluate(n: int, params: dict, role: str, prune: object = None) -> object:
        if calls is not None:
            calls.append(n)
        return inner(n, params, role, prune)

    return run_search(prof, trials=trials, root=root, evaluate=evaluate, seed=0, **kw)


def _hashes(store: StudyStore) -> dict[str, str]:
    return {str(p.relative_to(store.dir)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted((store.dir / "trials").rglob("*")) if p.is_file()}


def test_a_result_recorded_but_never_told_is_told_at_resume(tmp_path: Path) -> None:
    """kill -9 after trial 2's final trial.json, before Optuna heard of it: the rerun tells the study the
    recorded result (it once marked it FAIL and ran the config again: two records of one config)."""
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_RECORD, str(tmp_path), "2"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = StudyStore("search-test", tmp_path)
    record = store.read_trial(2)
    assert record.status in ("ok", "crashed", "pruned") and _study(tmp_path).trials[2].state == TrialState.RUNNING

    said: list[dict] = []
    calls: list[int] = []
    _search(tmp_path, 6, calls, on_event=lambda kind, d: said.append(d) if kind == "resume" else None)
    t2 = _study(tmp_path).trials[2]
    assert t2.state != TrialState.FAIL and t2.state != TrialState.RUNNING
    if t2.state == TrialState.COMPLETE:
        assert t2.values[0] == pytest.approx(record.best_output_throughput, rel=0.05)
    assert said[0]["requeued"] == [] and 2 not in calls                      # not run again
    assert not [t for t in _study(tmp_path).trials if t.user_attrs.get("retry_of") == 2]
    assert store.read_trial(2).started_at == record.started_at              # the record kept as it was


def test_an_empty_study_db_is_refused_and_nothing_written_over_then_rebuilt(tmp_path: Path) -> None:
    _search(tmp_path, 4)
    store = StudyStore("search-test", tmp_path)
    before = {t.number: (t.state, t.values, t.params) for t in _study(tmp_path).trials}
    files = _hashes(store)
    (store.dir / "study.db").write_bytes(b"")                              # a full disk, a bad copy
    with pytest.raises(InfraError, match=r"study.db: empty \(0 bytes\), while \d+ trial records .*nothing was run "
                                         r"or written over.*--rebuild"):
        _search(tmp_path, 6)
    assert _hashes(store) == files

    from tunectl.wiring.recovery import rebuild_study

    added, aside = rebuild_study(make_profile(search__finalists=FINALISTS), "search-test", tmp_path)
    assert added == len(before) and aside is not None and aside.exists()
    after = {t.number: (t.state, t.values, t.params) for t in _study(tmp_path).trials}
    told = {n: v for n, v in before.items() if v[0] in (TrialState.COMPLETE, TrialState.PRUNED)}
    assert {n: after[n] for n in told} == told                              # same numbers, values and params
    calls: list[int] = []
    _search(tmp_path, 6, calls)                                            # resumes: only new trial numbers run
    assert calls and min(calls) >= len(before)
    assert {k: v for k, v in _hashes(store).items() if k in files} == files


def _profile_file(tmp_path: Path) -> Path:
    import yaml

    from tests.search.conftest import BASE

    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({**BASE, "search": {**BASE["search"], "finalists": FINALISTS}}))
    return prof


def test_a_corrupt_study_db_is_one_line_at_the_command_line(tmp_path: Path) -> None:
    _search(tmp_path, 3)
    db = tmp_path / "search-test" / "study.db"
    db.write_bytes(b"not a database, a bad copy\n" * 100)
    res = subprocess.run([sys.executable, "-m", "tunectl", "search", "-p", str(_profile_file(tmp_path)), "--virtual",
                          "--trials", "5", "--results", str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "study.db: not a database" in res.stderr and "--rebuild" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_garbage_trial_record_is_named_by_every_reader(tmp_path: Path) -> None:
    _search(tmp_path, 3)
    bad = tmp_path / "search-test" / "trials" / "1" / "trial.json"
    bad.write_text("\x00\x17garbage")
    (tmp_path / "search-test" / "trials" / "2" / "trial.json").write_text(json.dumps({"levels": []}))
    resume = ["search", "-p", str(_profile_file(tmp_path)), "--virtual", "--trials", "4", "--json"]
    for cmd in (["trials"], ["best"], ["export", "--out", str(tmp_path / "out")],
                ["report", "--out", str(tmp_path / "r.html")], resume):
        res = subprocess.run([sys.executable, "-m", "tunectl", *cmd, "--study", "search-test", "--results",
                              str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert "Traceback" not in res.stderr, res.stderr
        assert f"{bad}: not a trial record" in res.stderr, (cmd, res.stderr)
        assert "trials/2/trial.json: not a trial record (TypeError" in res.stderr, (cmd, res.stderr)
