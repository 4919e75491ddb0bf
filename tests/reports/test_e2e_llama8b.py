"""The end-to-end real search docs/real-gpu/e2e/llama8b-h100/ (docs/real-gpu.md, "The end-to-end real search"): the
study tunectl wrote on the GPU is read back by tunectl as any study is, its first lease's 12 trials measured at every
level of the profile, the trial the deadline stopped recorded as interrupted and the resume on a later lease after it,
the winner with its tie and gain, and the machine findings the page states: the landscape's c02, measured again here,
agrees below the power limit and not at it; the resume's H100 read the same configs lower."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.models import TrialResult
from tunectl.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "docs" / "real-gpu" / "e2e" / "llama8b-h100"
STUDY = E2E / "results" / "e2e-llama8b"
LAND = ROOT / "docs" / "real-gpu" / "landscapes" / "llama8b-h100"
PROFILE = load_profile(ROOT / "profiles" / "real-llama8b-h100.yaml")


def trials() -> dict[int, TrialResult]:
    return {int(d.name): TrialResult.from_dict(json.loads((d / "trial.json").read_text()))
            for d in (STUDY / "trials").iterdir()}


def steady(t: TrialResult) -> dict[int, float]:
    return {lv.concurrency: lv.metrics["steady_output_throughput"] for lv in t.levels}


def test_the_first_lease_ran_twelve_trials_at_every_level_of_the_profile():
    ts = trials()
    searched = [t for t in ts.values() if t.role in ("baseline", "search")]
    assert len(searched) == 12 and {t.trial for t in searched} == set(range(12))
    assert [t.trial for t in searched if t.role == "baseline"] == [0]
    for t in searched + [t for t in ts.values() if t.role == "finalist" and t.status == "ok"]:
        assert t.status == "ok" and t.crash is None
        assert [lv.concurrency for lv in t.levels] == PROFILE.bench.levels
        w = PROFILE.bench.workloads[0]
        for lv in t.levels:       # at least the workload's 4 x c requests (the steady window may want more), none failed
            assert lv.completed >= max(w.prompts_per_level * lv.concurrency, w.min_prompts)
            assert lv.failed_requests == 0
    # every proposal is a config of the profile's space
    space = PROFILE.search.space
    for t in searched:
        for k, v in t.params.items():
            spec = space[k]
            assert v in spec.choices if spec.choices else spec.low <= v <= spec.high


def test_the_trial_the_deadline_stopped_is_interrupted_and_the_next_lease_resumed_after_it():
    ts = trials()
    assert ts[18].status == "interrupted" and ts[18].levels == []
    assert "SIGTERM" in (E2E / "lease-1" / "search.err").read_text()
    assert "exit 124" in (E2E / "lease-1" / "steps.log").read_text()      # timeout's, at DEADLINE
    # lease 4 resumed the same command: the race's rest and the baseline's reruns, then the search ended itself
    assert sorted(ts) == list(range(27)) and "search end exit 0" in (E2E / "lease-4" / "steps.log").read_text()
    assert all(ts[n].status == "ok" and ts[n].role == "finalist" for n in range(19, 27))
    assert [n for n in range(19, 27) if ts[n].params == ts[0].params] == [25, 26]     # the gain's own launches
    assert not (STUDY / "locks").exists()                                 # no lease's lock travels


def test_best_crowns_a_config_the_race_relaunched_and_names_the_tie_and_the_two_machines(tmp_path: Path):
    shutil.copytree(STUDY.parent, tmp_path / "results")
    res = CliRunner().invoke(app, ["best", "--study", "e2e-llama8b", "--results", str(tmp_path / "results")],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    n = int(re.search(r"trial (\d+), ", out).group(1))
    ts = trials()
    runs = [t for t in ts.values() if t.status == "ok" and t.params == ts[n].params]
    assert len(runs) >= 3 and "mean of 3 runs" in out
    assert "--cuda-graph-max-bs-decode 256" in res.output
    assert "the search has not named a winner yet" not in out
    gain = re.search(r"gain (\d\.\d\d)x \((\d\.\d\d)-(\d\.\d\d)\)", out)
    assert gain and 1.0 < float(gain.group(2)) < float(gain.group(1)) < float(gain.group(3))      # above, not a tie
    ties = re.search(r"a tie with trial ([\d, ]+) \(intervals overlap\)", out)
    assert ties and len(ties.group(1).split(",")) >= 3                   # real launches: several configs tied
    assert "ran on 2 machines" in out and "not comparable" in out
    # this study's baseline drew the knobs the profile gives no default (it ran before they were left to SGLang)
    assert "its cuda-graph-max-bs-decode, max-running-requests, chunked-prefill-size drawn by the sampler" in out


def _by_machine() -> dict[str, dict[str, list[float]]]:
    """Config -> {machine: its objective readings}: lease 1's machine ("", not recorded by that version) and the
    H100 that lease 4 resumed on."""
    out: dict[str, dict[str, list[float]]] = {}
    for t in trials().values():
        if t.status == "ok":
            key = json.dumps(t.params, sort_keys=True)
            out.setdefault(key, {}).setdefault(t.machine or "", []).append(t.best_output_throughput)
    return out


def test_the_second_machine_read_the_same_configs_lower_and_the_race_takes_its_level_out(tmp_path: Path):
    """The resume ran on another H100 80GB HBM3 (same model, driver and power limit): the graphed configs' reruns
    read 6-18% below their readings on lease 1's machine, the baseline (its best level at 64 streams) 2%. The race
    of this version puts both machines on one scale (search/race.py `machine_terms`)."""
    import optuna

    from tunectl.search import finalists as fin
    from tunectl.search import race

    both = [m for m in _by_machine().values() if len(m) == 2]
    assert len(both) == 7
    ratios = sorted(sum(v[k]) / len(v[k]) / (sum(v[""]) / len(v[""])) for v in both for k in v if k)
    assert ratios[0] > 0.8 and ratios[-2] < 0.95 and 0.95 < ratios[-1] < 1.0       # the baseline: the last
    shutil.copytree(STUDY, tmp_path / "s")
    study = optuna.load_study(study_name="e2e-llama8b", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    st = fin.standings(study.get_trials(), PROFILE.search.finalists.noise)
    assert len(st.machines) == 2 and st.linked == 7
    [(gpu, level)] = [(m, v) for m, v in st.machines.items() if v != 0.0]
    assert gpu.endswith("gpu-86d1d4a7") and -0.14 < level < -0.08
    assert "2 machines" in race.rule(st)
    win = st.winner()
    recorded = json.loads((STUDY / "best.json").read_text())["best"]
    assert win is not None and win.trial in [recorded["trial"], *recorded["ties"]]   # inside the tie it recorded
    assert st.noise < recorded["race"]["noise"]                        # one scale: a narrower launch spread


def test_c02_on_this_machine_agrees_below_the_power_limit_and_not_at_256_streams():
    land = json.loads((LAND / "landscape.json").read_text())
    [c02] = [c for c in land["configs"] if c["id"] == "c02"]
    here = [t for t in trials().values() if t.status == "ok" and t.params == c02["set"]]
    assert len(here) >= 3
    before = [{int(c): v["value"] for c, v in ln["levels"]["builtin"].items()} for ln in c02["launches"]]
    now = [steady(t) for t in here]
    for c in (16, 64):
        lo, hi = min(r[c] for r in before + now), max(r[c] for r in before + now)
        assert hi / lo < 1.03, c
    assert min(r[256] for r in now) / max(r[256] for r in before) > 1.15
    # within this lease the relaunches agree within 5%
    assert max(r[256] for r in now) / min(r[256] for r in now) < 1.05


def confirm(name: str) -> TrialResult:
    return TrialResult.from_dict(json.loads((STUDY.parent / f"e2e-llama8b-{name}" / "trials" / "0" / "trial.json")
                                            .read_text()))


def test_the_second_lease_measured_sglangs_own_choice_and_the_leader_on_one_machine():
    """Lease 2 (CONFIRM_ONLY, default first): `sweep` with no `--set` leaves every searched flag to SGLang, which
    chose the decode graphs to 256 and 2,048 running requests, above the space's 1,024: its log says so, and
    tunectl reads it back. Both launches record the same machine; the leader's 256 level did not finish before the
    device time ran out, so the comparison stands at 16 and 64 streams, one launch each (no verdict)."""
    from tunectl.sglang import memory
    from tunectl.sglang.crashes.classifier import LogWatcher

    default, leader = confirm("confirm-default-1"), confirm("confirm-winner-2")
    assert default.params == {} and default.status == "ok"
    log = (STUDY.parent / "e2e-llama8b-confirm-default-1" / "trials" / "0" / "server.log").read_bytes()
    assert memory.resolved(LogWatcher.read(log).facts) == {
        "max-running-requests": 2048, "chunked-prefill-size": 8192, "cuda-graph-max-bs": 256}
    assert default.machine == leader.machine and default.machine.startswith("NVIDIA H100 80GB HBM3 x1, 700 W, gpu-")
    assert leader.status == "running" and [lv.concurrency for lv in leader.levels] == [16, 64]
    d = {lv.concurrency: lv.output_throughput for lv in default.levels}
    w = {lv.concurrency: lv.output_throughput for lv in leader.levels}
    assert sorted(d) == [16, 64, 256]
    assert all(abs(w[c] / d[c] - 1) < 0.03 for c in (16, 64))         # within 3% where both ran


def gain_script() -> dict[str, dict[str, list[str]]]:
    """bench/gpu/e2e_gain.py on the checked-in confirmation: {machine heading: {level: the row's cells}}."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "e2e_gain.py"), str(STUDY.parent)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    out: dict[str, dict[str, list[str]]] = {}
    for ln in res.stdout.splitlines():
        if ln.startswith("## "):
            head = ln
            out[head] = {}
        elif ln.startswith("| c"):
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            out[head][cells[0]] = cells
    return out


def test_the_gain_script_judges_machine_by_machine_and_gives_no_verdict_on_one_pair():
    """Lease 2's two launches (an H100) and lease 3's ten (an H200) are never pooled: each machine gets its table.
    On the H100 one launch each has no launch-to-launch spread, so no level is called for either side (the script
    once printed "default ahead" there); the leader's 256 level was not measured."""
    tables = gain_script()
    [h100] = [h for h in tables if "H100" in h]
    [h200] = [h for h in tables if "H200" in h]
    assert "winner 1 launches, default 1, 1 pairs (run order D1 W2)" in h100
    assert "winner 5 launches, default 5, 5 pairs (run order W1 D2 D3 W4 W5 D6 D7 W8 W9 D10)" in h200
    rows = tables[h100]
    assert set(rows) == {"c16", "c64", "c256"}
    for c in ("c16", "c64"):
        assert rows[c][5].startswith("no verdict: one pair") and "ahead" not in " ".join(rows[c])
    assert rows["c256"][4] == "-" and rows["c256"][5] == "-"


def test_the_third_lease_ties_sglangs_own_choice_on_throughput_once_paired():
    """Lease 3 (an H200, 5 launches each, W D D W W D D W W D): the machine stepped up ~12% at 256 streams from its
    fifth launch on, both sides alike, so the pooled intervals overlap everywhere; paired launch by launch, the
    leader ties SGLang's own choice at 64 and 256 streams and trails it by ~2% at 16, every pair agreeing."""
    name = re.compile(r"^e2e-llama8b-confirm-(winner|default)-(\d+)$")
    runs = [(int(m[2]), confirm(f"confirm-{m[1]}-{m[2]}")) for p in STUDY.parent.iterdir()
            if (m := name.match(p.name))]
    h200 = {n: t for n, t in runs if "H200" in t.machine}
    assert sorted(h200) == list(range(1, 11))
    assert len({t.machine for t in h200.values()}) == 1 and h200[1].machine.startswith("NVIDIA H200 x1, 700 W, gpu-")
    assert all(t.status == "ok" and [lv.concurrency for lv in t.levels] == [16, 64, 256] for t in h200.values())
    r256 = {n: {lv.concurrency: lv.output_throughput for lv in t.levels}[256] for n, t in h200.items()}
    before = [r256[n] for n in (1, 2, 3, 4)]
    after = [r256[n] for n in (5, 6, 7, 8, 9, 10)]
    assert min(after) / max(before) > 1.08                     # the step, on both sides
    assert max(after) / min(after) < 1.03 and max(before) / min(before) < 1.08
    [rows] = [r for h, r in gain_script().items() if "H200" in h]
    assert [rows[c][5] for c in ("c16", "c64", "c256")] == ["default ahead", "tie", "tie"]
    assert all(c.endswith("tie") for c in (rows["c16"][3], rows["c64"][3], rows["c256"][3]))   # pooled: all ties
    lo, hi = (float(x) for x in re.search(r"\(([\d.]+)-([\d.]+)\)", rows["c16"][4]).groups())
    assert 0.96 < lo < hi < 1.0
    assert rows["c64"][7] == "winner ahead"                    # per joule at 64: the leader's FP8 KV draws less
    # what the pairs tell apart at 256 streams: a fresh launch adds under 2.5%, the machine drifted over 5%
    launch, drift = (float(rows["c256"][k].rstrip("%")) for k in (8, 9))
    assert launch < 2.5 and drift > 5.0 and drift > 3 * launch


def test_the_8b_cards_noise_is_what_lease_3s_pairs_measured():
    """The stand-in's 8B H200 card plays the noise its real twin showed (docs/sim.md, "Noise"): its machine state is
    the drift the pairs read at 256 streams, its launch spread within what they read for a fresh launch."""
    from tunectl.sim.model import load_card

    [rows] = [r for h, r in gain_script().items() if "H200" in h]
    launches = [float(rows[c][8].rstrip("%")) for c in ("c16", "c64", "c256")]
    drift = float(rows["c256"][9].rstrip("%"))
    noise = load_card("llama31-8b-h200").noise
    assert abs(noise.machine * 100 - drift) < 0.1
    assert min(launches) <= noise.launch * 100 <= max(launches)


CONFIRM = STUDY.parent / "e2e-llama8b-confirm"


def test_tunectl_confirm_on_real_sglang_finds_the_declared_winner_level_with_sglangs_own_choice():
    """Lease 5 ran `tunectl confirm --study e2e-llama8b --client bench_serving --launches 3` itself (a third H100):
    the declared winner and SGLang's own choice (no searched flag passed: SGLang picked 2,048 running requests)
    interleaved W B B W W B on one machine, every level read by the real sglang.bench_serving with 8 x c requests.
    Judged again here from its launches, it says what it recorded: a tie at every level, the winner within a few
    percent of SGLang's choice; the search's 1.69x was over its drawn baseline, not over SGLang."""
    from tunectl import confirm as cf

    doc = json.loads((CONFIRM / "confirm.json").read_text())
    best = json.loads((STUDY / "best.json").read_text())["best"]
    assert doc["of"] == "e2e-llama8b" and doc["winner"] == best["params"] and doc["baseline"] == {}
    assert doc["order"] == cf.order(3) and doc["pairs"] == 3 and len(doc["machines"]) == 1
    recorded = {t.machine for t in trials().values()}
    assert doc["machines"][0].startswith("NVIDIA H100 80GB HBM3 x1, 700 W, gpu-") and doc["machines"][0] not in recorded
    runs = [TrialResult.from_dict(json.loads((CONFIRM / "trials" / str(n) / "trial.json").read_text()))
            for n in doc["trials"]]
    searched = {f"--{k}" for k in PROFILE.search.space}
    for t in runs:
        assert t.status == "ok" and [lv.concurrency for lv in t.levels] == PROFILE.bench.levels
        assert all(lv.workload == "random@bench_serving" and lv.failed_requests == 0
                   and lv.completed >= 8 * lv.concurrency for lv in t.levels)
        assert t.teardown["verdict"] == "clean"
        if cf.side(t) == "baseline":      # SGLang's own choice: no searched flag on its command line
            assert t.params == {} and not searched & set(t.launch.argv) and not searched & set(t.launch.exec_argv)
            assert t.server_facts["max_running_requests"] == 2048
        else:
            assert t.server_facts["max_running_requests"] == best["params"]["max-running-requests"]
    rows = cf.judge(runs, PROFILE)
    assert [r.label for r in rows] == [f"c{c}" for c in PROFILE.bench.levels] + ["objective"]
    assert [r.verdict for r in rows] == [r["verdict"] for r in doc["rows"]] == ["tie"] * 4
    for r in rows:
        assert r.paired.low < 1 < r.paired.high and abs(r.paired.value - 1) < 0.05
    assert doc["conclusion"] == cf.conclusion(rows, "SGLang's own choice", cf.crashes(runs))
    assert doc["conclusion"].startswith("the winner ties SGLang's own choice")


def test_best_and_the_report_carry_the_real_confirmation_and_what_its_tie_can_tell(tmp_path: Path):
    from tunectl import confirm as cf

    shutil.copytree(STUDY.parent, tmp_path / "results")
    res = CliRunner().invoke(app, ["best", "--study", "e2e-llama8b", "--results", str(tmp_path / "results")],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    doc = json.loads((CONFIRM / "confirm.json").read_text())
    assert f"# tunectl confirm (results/e2e-llama8b-confirm): {doc['conclusion']}" in res.output
    line = cf.resolution(doc["rows"], "tunectl confirm --study e2e-llama8b")
    assert line and line.startswith("a tie within") and f"# {line}" in res.output
    assert "`tunectl confirm --study e2e-llama8b --launches " in line
    rep = CliRunner().invoke(app, ["report", "--study", "e2e-llama8b", "--results", str(tmp_path / "results")])
    assert rep.exit_code == 0, rep.output
    page = (tmp_path / "results" / "e2e-llama8b" / "report.html").read_text()
    assert "the winner ties SGLang&#x27;s own choice" in page and "a tie within" in page


def test_a_sweep_line_of_the_real_client_shows_its_whole_run_not_an_empty_steady_window():
    """sglang.bench_serving reports the whole run only: the per-level line says so instead of '- tok/s steady'."""
    from tunectl.commands._levels import level_line

    t = TrialResult.from_dict(json.loads((CONFIRM / "trials" / "0" / "trial.json").read_text()))
    for lv in t.levels:
        text = level_line(lv)
        assert "steady" not in text and f"{lv.metrics['output_throughput']:,.1f} tok/s whole run" in text
    built = next(iter(trials().values())).levels[0]                 # the built-in client's steady window stays
    assert "tok/s steady" in level_line(built)


def test_the_trials_table_names_the_machine_of_each_trial_of_the_resumed_study(tmp_path: Path):
    """The study ran on two H100s (lease 1's, whose version did not record it, and lease 4's): `tunectl trials`
    names each trial's machine, so the 6-18% lower readings of trials 19-26 are seen as the other card's."""
    shutil.copytree(STUDY.parent, tmp_path / "results")
    res = CliRunner().invoke(app, ["trials", "--study", "e2e-llama8b", "--results", str(tmp_path / "results")],
                             env={"COLUMNS": "260"})
    assert res.exit_code == 0, res.output
    where = {}
    for ln in res.output.splitlines():
        cells = [c.strip() for c in ln.split("│")]
        if len(cells) > 2 and cells[1].isdigit():
            where[int(cells[1])] = cells[-3]
    ts = trials()
    assert set(where) == set(ts)
    for n, t in ts.items():
        expect = "-" if not t.levels else t.machine.rsplit(", ", 1)[-1] if t.machine else "not recorded"
        assert where[n] == expect, n
    assert {where[n] for n in range(19, 27)} == {"gpu-86d1d4a7"} and where[18] == "-"
