"""Energy and cost per token (tunectl/energy.py): the figures, the profile's `cost:` block, the
objectives `tokens_per_joule` / `tokens_per_dollar`, and their columns in trials, export and the report."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.ports import free_port
from tunectl.energy import energy_metrics
from tunectl.errors import ProfileError
from tunectl.objective import score
from tunectl.profile import Profile, load_profile
from tunectl.sim.card import CARDS_DIR
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

ROOT = Path(__file__).resolve().parents[1]


def test_per_token_arithmetic():
    m = energy_metrics(1000.0, 2, watts=500.0, gpu_hour_usd=3.6)
    assert m["joules_per_output_token"] == 1.0 and m["output_tokens_per_joule"] == 1.0     # 2 x 500 W / 1000 tok/s
    assert m["output_throughput_per_gpu"] == 500.0
    assert m["usd_per_million_output_tokens"] == pytest.approx(2.0)          # $0.002/s / 1000 tok/s x 1e6
    assert "gpu_power_w" not in energy_metrics(1000.0, 2) and energy_metrics(0.0, 2, 500.0) == {}


def _profile(tmp_path: Path, **extra) -> Path:
    data = yaml.safe_load((ROOT / "profiles" / "sim-llama8b-h200.yaml").read_text())
    data.update(extra)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.mark.parametrize("extra, needle", [
    ({"cost": {"gpu_hour_usd": 2.5, "currency": "EUR"}}, "cost.currency"),
    ({"cost": {"gpu_hour_usd": 0}}, "cost.gpu_hour_usd"),
    ({"objective": {"mode": "tokens_per_dollar"}}, "needs a cost block"),
    ({"objective": {"mode": "tokens_per_watt"}}, "objective.mode"),
])
def test_cost_block_is_strict(tmp_path, extra, needle):
    with pytest.raises(ProfileError) as e:
        load_profile(_profile(tmp_path, **extra))
    assert needle in str(e.value) and "\n" not in str(e.value).strip()


def _power_hungry_card(tmp_path: Path) -> str:
    """The H200 card where FA3 buys its last 5% of decode speed over FlashInfer by keeping the tensor cores busier
    through the memory waits: 1.5x the dynamic power per step (a saturated board is held at its 700 W limit)."""
    card = yaml.safe_load((CARDS_DIR / "llama31-8b-h200.yaml").read_text())
    card["attention"]["backends"]["flashinfer"] = {"decode_mult": 1.05, "prefill_mult": 1.05}
    card["power"]["kernel_mult"] = {"fa3": 1.5}
    path = tmp_path / "hungry.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False))
    return str(path)


def _hungry_profile(tmp_path: Path, mode: str) -> Profile:
    prof = load_profile(_profile(tmp_path, cost={"gpu_hour_usd": 3.0}, objective={"mode": mode}))
    prof.server.sim.card, prof.server.sim.noise = _power_hungry_card(tmp_path), 0.0
    prof.search.space = {"attention-backend": prof.search.space["attention-backend"]}
    prof.bench.levels = [16, 256]
    return prof


def test_tokens_per_joule_picks_another_winner_than_throughput(tmp_path):
    values = {}
    for mode in ("throughput", "tokens_per_joule", "tokens_per_dollar"):
        prof = _hungry_profile(tmp_path, mode)
        ev = VirtualEvaluator(prof)
        values[mode] = {b: score(ev(i, {"attention-backend": b}, "search"), prof).value
                        for i, b in enumerate(("fa3", "flashinfer"))}
    best = {mode: max(v, key=v.get) for mode, v in values.items()}
    assert best == {"throughput": "fa3", "tokens_per_joule": "flashinfer", "tokens_per_dollar": "fa3"}, values
    assert values["throughput"]["fa3"] < 1.07 * values["throughput"]["flashinfer"]      # a few % faster ...
    assert values["tokens_per_joule"]["fa3"] < 0.97 * values["tokens_per_joule"]["flashinfer"]   # ... hungrier


def test_search_by_tokens_per_joule_names_the_frugal_winner(tmp_path):
    wins = {}
    for mode in ("throughput", "tokens_per_joule"):
        prof = _hungry_profile(tmp_path, mode)
        prof.search.finalists.top_k, prof.search.finalists.reruns = 1, 1
        out = run_search(prof, trials=2, root=tmp_path / mode, evaluate=VirtualEvaluator(prof), seed=0)
        wins[mode] = (out.best["params"]["attention-backend"], out.best["metric"])
    assert wins == {"throughput": ("fa3", "output_throughput"),
                    "tokens_per_joule": ("flashinfer", "output_tokens_per_joule")}


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from tunectl.cli import app; app()", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_columns_in_trials_export_and_report(tmp_path):
    prof, res = _profile(tmp_path, cost={"gpu_hour_usd": 3.0}), str(tmp_path / "results")
    out = _cli("search", "--trials", "2", "--virtual", "-p", str(prof), "--study", "e", "--results", res)
    assert out.returncode == 0, out.stderr
    table = _cli("trials", "--study", "e", "--results", res)
    assert all(h in table.stdout for h in ("W/GPU", "J/tok", "$/Mtok")), table.stdout
    assert _cli("export", "--study", "e", "--results", res, "--out", str(tmp_path / "x")).returncode == 0
    with open(tmp_path / "x" / "e-levels.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r["joules_per_output_token"]) > 0 and float(r["usd_per_million_output_tokens"]) > 0
               for r in rows if r["status"] == "ok")
    with open(tmp_path / "x" / "e-trials.csv") as f:
        assert {"gpu_power_w", "joules_per_output_token", "usd_per_million_output_tokens"} <= set(next(csv.reader(f)))
    assert _cli("report", "--study", "e", "--results", res, "--out", str(tmp_path / "r.html")).returncode == 0
    html = (tmp_path / "r.html").read_text()
    assert "Throughput vs joules per output token" in html and "Throughput vs USD per million output tokens" in html
    assert "<th>j per token</th>" in html and "<th>usd per mtok</th>" in html


def test_live_stand_in_power_in_json_and_table(tmp_path):
    """The live path: the sampler runs the stand-in's nvidia-smi on the host through the runner during each level."""
    data = yaml.safe_load((ROOT / "profiles" / "sim-llama8b-h200.yaml").read_text())
    data["server"]["port"] = free_port()
    data["host"] = {"workdir": str(tmp_path / "host")}
    data["cost"] = {"gpu_hour_usd": 3.0}
    prof = tmp_path / "live.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    base = ["sweep", "-p", str(prof), "-c", "64", "--results", str(tmp_path / "res")]
    doc = json.loads(_cli(*base, "--json").stdout)
    lv = doc["levels"][0]
    assert lv["status"] == "ok" and lv["witness"]["power"]["source"] == "stand-in"
    assert 100 <= lv["metrics"]["gpu_power_w"] <= 700                      # the card's idle .. limit
    assert lv["metrics"]["joules_per_output_token"] == pytest.approx(
        lv["metrics"]["gpu_power_w"] / lv["metrics"]["output_throughput_per_gpu"], rel=1e-3)
    assert lv["metrics"]["usd_per_million_output_tokens"] > 0
    table = _cli(*base).stdout
    assert all(h in table for h in ("W/GPU", "J/tok", "$/Mtok")), table


def test_the_slo_stays_a_constraint_in_per_token_modes(tmp_path):
    from tunectl.models import LevelResult, TrialResult

    prof = load_profile(_profile(tmp_path, objective={"mode": "tokens_per_joule", "slo": {"p99_ttft_ms": 1000}}))
    fast = LevelResult(64, "ok", "random", metrics={"output_tokens_per_joule": 15.0, "p99_ttft_ms": 400})
    frugal = LevelResult(512, "ok", "random", metrics={"output_tokens_per_joule": 22.0, "p99_ttft_ms": 2500})
    got = score(TrialResult(0, "ok", levels=[fast, frugal]), prof)
    assert got.level is fast and got.value == 15.0 and got.slo <= 0         # the frugal level misses the SLO
    alone = score(TrialResult(1, "ok", levels=[frugal]), prof)
    assert alone.slo > 0                                                     # infeasible, not a winner
