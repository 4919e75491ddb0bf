"""`tunectl confirm`: the winner against SGLang's own choice on fresh launches, interleaved W B B W W B and judged in
pairs, so that a step of the machine between pairs (a real H200 stepped 12% mid-lease) cancels; on the stand-in end
to end, continued where it stopped, and named by `tunectl best`."""
from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.profiles import fast_default
from tunectl import confirm as cf
from tunectl.models import LevelResult, TrialResult
from tunectl.profile import default_profile_path, load_profile

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ["--set", "max-running-requests=2048", "--set", "disable-cuda-graph=true",
         "--set", "moe-runner-backend=flashinfer_cutlass", "--set", "flashinfer-cutlass-autotune=true"]


def launch(n: int, side: str, value: float, machine: str = "H200 x1, gpu-a", status: str = "ok") -> TrialResult:
    lv = LevelResult(64, "ok" if status == "ok" else "crashed", metrics={"output_throughput": value})
    return TrialResult(trial=n, params={}, status=status, levels=[lv], role=cf.ROLE[side], machine=machine)


def test_the_order_puts_every_launch_beside_one_of_the_other_side():
    assert cf.order(3) == ["winner", "baseline", "baseline", "winner", "winner", "baseline"]
    assert cf.order(1) == ["winner", "baseline"]
    runs = [launch(i, s, 100.0) for i, s in enumerate(cf.order(4))]
    assert [(a.trial, b.trial) for a, b in cf.pairs(runs)] == [(0, 1), (3, 2), (4, 5), (7, 6)]


def test_launches_on_another_machine_or_of_one_side_are_not_paired():
    runs = [launch(0, "winner", 100.0), launch(1, "baseline", 100.0, machine="H100 x1, gpu-b"),
            launch(2, "baseline", 100.0, machine="H100 x1, gpu-b"), launch(3, "winner", 100.0, machine="H100 x1, gpu-b"),
            launch(4, "winner", 100.0, machine="H100 x1, gpu-b")]
    assert [(a.trial, b.trial) for a, b in cf.pairs(runs)] == [(3, 2)]


def test_a_step_of_the_machine_hides_a_two_percent_loss_pooled_and_not_paired():
    """The baseline reads 2% more than the winner in every pair; the machine steps 12% after the second pair. Pooled
    side by side that is a tie; paired it is the baseline ahead, and the objective says the same."""
    prof = load_profile(default_profile_path())
    machine = [1.0, 1.0, 1.12, 1.12, 1.12]
    runs: list[TrialResult] = []
    for i, (m, (w, b)) in enumerate(zip(machine, [(0.98, 1.0), (0.981, 1.0), (0.979, 1.0), (0.98, 1.001),
                                                  (0.98, 0.999)])):
        first, second = ("winner", "baseline") if i % 2 == 0 else ("baseline", "winner")
        vals = {"winner": 1000 * m * w, "baseline": 1000 * m * b}
        runs += [launch(len(runs), first, vals[first]), launch(len(runs) + 1, second, vals[second])]
    rows = cf.judge(runs, prof)
    assert [r.label for r in rows] == ["c64", "objective"]
    for r in rows:
        assert r.pooled_gain.low < 1 < r.pooled_gain.high                     # pooled: a tie
        assert r.verdict == "baseline ahead" and r.paired.n == 5
        assert r.paired.low < 0.98 < r.paired.high < 0.99
    assert cf.conclusion(rows, "SGLang's own choice").startswith("SGLang's own choice is ahead of the winner: 0.980x")


def _pairs_of(ratios: list[float]) -> list[TrialResult]:
    """Launches in confirm's order whose pairs read the given winner / baseline ratios."""
    runs: list[TrialResult] = []
    for i, r in enumerate(ratios):
        first, second = ("winner", "baseline") if i % 2 == 0 else ("baseline", "winner")
        vals = {"winner": 1000 * r, "baseline": 1000.0}
        runs += [launch(len(runs), first, vals[first]), launch(len(runs) + 1, second, vals[second])]
    return runs


def test_a_tie_says_how_wide_it_is_and_how_many_pairs_would_tell_the_measured_gain_from_none():
    """Three pairs reading -9%, +2%, -1% (a tie of -2.8% as the real H100 confirmation read): the line names the
    tie's width and the number of pairs that, at the same spread, would put an interval of the same gain clear of 1;
    one pair fewer would not."""
    import math
    from statistics import stdev

    from tunectl.stats import t95

    prof = load_profile(default_profile_path())
    ratios = [0.91, 1.02, 0.99]
    rows = cf.judge(_pairs_of(ratios), prof)
    assert rows[-1].verdict == "tie"
    line = cf.resolution(rows)
    half = math.log(rows[-1].paired.high / rows[-1].paired.low) / 2
    assert f"a tie within {math.exp(half) - 1:.1%} either way (3 pairs)" in line
    need = int(line.split("would take about ")[1].split()[0])
    logs = [math.log(r) for r in ratios]
    sd, effect = stdev(logs), abs(sum(logs) / len(logs))
    assert t95(need - 1) * sd / math.sqrt(need) < effect <= t95(need - 2) * sd / math.sqrt(need - 1)
    assert line.endswith(f"(the same command with --launches {need} adds them to these)")
    # read from confirm.json (rows as dicts) it says the same; given the command, it names it
    assert cf.resolution([r.to_dict() for r in rows]) == line
    named = cf.resolution(rows, "tunectl confirm --study s")
    assert named.endswith(f"(`tunectl confirm --study s --launches {need}` adds them to these)")


def test_a_verdict_needs_no_resolution_and_a_gain_too_small_to_ever_tell_is_called_alike():
    prof = load_profile(default_profile_path())
    ahead = cf.judge(_pairs_of([1.05, 1.06, 1.05, 1.07]), prof)
    assert ahead[-1].verdict == "winner ahead" and cf.resolution(ahead) is None
    assert cf.resolution(cf.judge(_pairs_of([0.98]), prof)) is None                  # one pair: no verdict at all
    level = cf.judge(_pairs_of([0.95, 1.05, 1.001]), prof)       # 0.0% measured inside a +-5% spread
    assert level[-1].verdict == "tie"
    assert "would take more than 50 pairs" in cf.resolution(level) and "serve alike" in cf.resolution(level)


def test_a_crashed_launch_is_left_out_of_the_pairs_and_counted():
    prof = load_profile(default_profile_path())
    runs = [launch(0, "winner", 0.0, status="crashed"), launch(1, "baseline", 900.0),
            launch(2, "baseline", 910.0), launch(3, "winner", 1000.0)]
    rows = cf.judge(runs, prof)
    assert rows[0].missing == {"winner": 1, "baseline": 0} and rows[0].paired.n == 1
    assert rows[0].verdict == "no verdict: one pair"
    said = cf.conclusion(rows, "SGLang's own choice", cf.crashes(runs))
    assert said.endswith("; the winner crashed in 1 of 2 launches (SGLang's own choice: 0 of 2)")


# ----------------------------------------------------------------------------------------- on the stand-in
@pytest.fixture
def env(tmp_path):
    prof, _ = fast_default(tmp_path)
    return {"profile": str(prof), "results": str(tmp_path / "results")}


def tunectl(env, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunectl", *args, "--results", env["results"]],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_a_config_that_is_faster_is_called_ahead_after_four_pairs(env):
    """The seeds' flags read ~1.4x SGLang's own choice at 64 streams on the GLM-5 card, whose launches differ by ~7%
    (its launch noise, independent per launch: pairs do not cancel it, four pairs resolve the gain anyway)."""
    res = tunectl(env, "confirm", "-p", env["profile"], *SEEDS, "-n", "4", "-c", "64", "--name", "seeds", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["order"] == cf.order(4) and doc["pairs"] == 4 and doc["baseline"] == {}
    c64, objective = doc["rows"]
    assert c64["label"] == "c64" and objective["label"] == "objective"
    assert objective["verdict"] == "winner ahead" and objective["paired"]["low"] > 1.05
    assert doc["conclusion"].startswith("the winner is ahead of SGLang's own choice: ")
    on_disk = json.loads((Path(env["results"]) / "seeds" / "confirm.json").read_text())
    assert on_disk["rows"] == doc["rows"]
    trials = sorted((Path(env["results"]) / "seeds" / "trials").iterdir(), key=lambda p: int(p.name))
    roles = [json.loads((p / "trial.json").read_text())["role"] for p in trials]
    assert roles == [cf.ROLE[s] for s in cf.order(4)]


def test_confirm_a_study_continues_where_it_stopped_and_best_names_it(env):
    done = tunectl(env, "search", "--virtual", "--trials", "4", "--study", "virt", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    winner = json.loads(done.stdout)["best"]["params"]
    best = tunectl(env, "best", "--study", "virt")
    assert "not yet confirmed against SGLang's own choice" in best.stdout and "tunectl confirm --study virt" in best.stdout
    dry = tunectl(env, "confirm", "--study", "virt", "-p", env["profile"], "--dry-run")
    assert dry.returncode == 0 and "order: W B B W W B (0 measured, 6 to run) -> results/virt-confirm" in dry.stdout
    one = tunectl(env, "confirm", "--study", "virt", "-p", env["profile"], "-n", "1", "-c", "64")
    assert one.returncode == 0, one.stderr[-2000:]
    assert "no verdict yet (one pair" in " ".join(one.stdout.split())
    heads = [ln for ln in one.stdout.splitlines() if ln.startswith("launch ")]
    # the first launch has nothing to go by; the next ones say what is left, from the launches so far
    assert heads[0].startswith("launch 1 of 2: winner") and "left" not in heads[0]
    assert heads[1].startswith("launch 2 of 2: baseline") and heads[1].endswith(" left with this one")
    two = tunectl(env, "confirm", "--study", "virt", "-p", env["profile"], "-n", "2", "-c", "64", "--json")
    assert two.returncode == 0, two.stderr[-2000:]
    doc = json.loads(two.stdout)
    assert doc["order"] == cf.order(2) and doc["trials"] == [0, 1, 2, 3] and doc["winner"] == winner
    assert doc["rows"][-1]["noise"] is None                   # two pairs: too few to tell the noise apart
    three = tunectl(env, "confirm", "--study", "virt", "-p", env["profile"], "-n", "3", "-c", "64")
    assert three.returncode == 0, three.stderr[-2000:]
    doc = json.loads((Path(env["results"]) / "virt-confirm" / "confirm.json").read_text())
    assert doc["trials"] == [0, 1, 2, 3, 4, 5] and doc["pairs"] == 3
    noise = doc["rows"][-1]["noise"]
    line = f"noise (objective, 3 pairs): a fresh launch {noise['launch']:.1%}, the machine's drift over the run"
    assert line in " ".join(three.stdout.split())
    best = tunectl(env, "best", "--study", "virt")
    assert f"# tunectl confirm (results/virt-confirm): {doc['conclusion']}" in best.stdout
    assert f"# {line}" in best.stdout
    assert json.loads(tunectl(env, "best", "--study", "virt", "-f", "json").stdout)["confirmation"]["pairs"] == 3
    assert tunectl(env, "report", "--study", "virt").returncode == 0
    page = (Path(env["results"]) / "virt" / "report.html").read_text()
    assert "confirmed on fresh launches of one machine, in pairs (results/virt-confirm)" in page
    assert html.escape(doc["conclusion"]) in page and html.escape(line) in page
    # another config under the same name is refused, not mixed in
    clash = tunectl(env, "confirm", "-p", env["profile"], *SEEDS, "--name", "virt-confirm")
    assert clash.returncode == 2 and "results/virt-confirm holds other launches" in clash.stderr
    assert len(clash.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, says", [
    (["--against", "nope", "--set", "max-running-requests=64"], "--against: 'nope': must be one of default, baseline"),
    (["--launches", "0", "--set", "max-running-requests=64"], "--launches: 0: expected 1 or more"),
    (["--against", "baseline", "--set", "max-running-requests=64"], "--against baseline: needs --study"),
    (["--set", "max-running-requests=64", "--study", "x"], "--set and --study: give one"),
    (["--study", "nothing-here"], "--study: 'nothing-here': no such study"),
])
def test_bad_input_is_one_line(env, args, says):
    res = tunectl(env, "confirm", "-p", env["profile"], *args)
    assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_search_confirm_runs_the_confirmation_after_the_race(env, tmp_path):
    """`tunectl search --confirm 1`: the race's winner, then one launch each of it and SGLang's own choice; the
    search's JSON carries the confirmation, and `best` names it."""
    data = yaml.safe_load(Path(env["profile"]).read_text())
    data["bench"]["levels"] = [16, 64]
    data["search"]["finalists"] = {"top_k": 1, "reruns": 1}
    prof = tmp_path / "small.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    res = tunectl(env, "search", "-p", str(prof), "--trials", "2", "--study", "sc", "--confirm", "1", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    conf = out["confirmation"]
    assert conf["of"] == "sc" and conf["study"] == "sc-confirm" and conf["order"] == ["winner", "baseline"]
    assert conf["winner"] == out["best"]["params"] and conf["baseline"] == {} and conf["pairs"] == 1
    assert conf["conclusion"].startswith("no verdict yet (one pair")
    best = tunectl(env, "best", "--study", "sc")
    assert f"# tunectl confirm (results/sc-confirm): {conf['conclusion']}" in best.stdout


def test_search_confirm_needs_launches():
    res = subprocess.run([sys.executable, "-m", "tunectl", "search", "--virtual", "--confirm", "2"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "--confirm: 2: the virtual model has no launches to confirm on" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_pairs_find_a_real_gain_under_a_step_more_often_than_pooling_at_the_nominal_false_alarm_price():
    """bench/confirm_pairs.py's claim, on fewer draws: the machine steps x1.12 mid-run; a true 5% gain over 5
    launches each at 1% noise is called by pairs at least twice as often as by pooling, and a true tie is called a
    side by pairs on no more than ~5% (the 95% interval's price) plus the draws' spread."""
    import importlib.util
    import random

    spec = importlib.util.spec_from_file_location("confirm_pairs", ROOT / "bench" / "confirm_pairs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = random.Random(1)
    gain = [mod.verdicts(1.05, 5, 0.01, 1.12, rng) for _ in range(400)]
    pooled_right, paired_right = (sum(v[k] == "above" for v in gain) for k in (0, 1))
    assert paired_right >= 2 * pooled_right and paired_right > 0.5 * 400
    tie = [mod.verdicts(1.0, 5, 0.01, 1.12, rng) for _ in range(400)]
    assert sum(v[1] != "tie" for v in tie) <= 0.08 * 400
