"""The stand-in's board power (sim/power.py) and its nvidia-smi (sim/smi.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tunectl.errors import ProfileError
from tunectl.sim.card import CARDS_DIR, known_cards, load_card
from tunectl.sim.model import virtual_ladder
from tunectl.sim.power import Meter, step_watts
from tunectl.sim.setup import resolve


@pytest.mark.parametrize("name", known_cards())
def test_every_card_has_sourced_power(name):
    p = load_card(name).power
    assert p is not None and 0 < p.idle_w < p.max_w and p.source


def test_power_grows_with_the_batch_up_to_the_limit():
    card = load_card("llama31-8b-h200")
    s = resolve(card, {})
    watts = [step_watts(card.power, s, "decode", bs) for bs in (1, 8, 64, 512)]
    assert watts == sorted(watts) and watts[0] > card.power.idle_w and watts[-1] <= card.power.max_w


def test_meter_counts_idle_between_steps():
    card = load_card("llama31-8b-h200")
    s, m = resolve(card, {}), Meter(card)
    m.step(s, 1.0, "decode", 512, 1000.0)            # busy for the first second
    busy = step_watts(card.power, s, "decode", 512)
    assert m.average(0.0, 0.0, 2.0) == pytest.approx((busy + card.power.idle_w) / 2)   # then idle for one
    assert m.draw(1.0) == (pytest.approx(busy), 100.0) and m.draw(5.0) == (card.power.idle_w, 0.0)


def test_virtual_levels_carry_power():
    lad = virtual_ladder("llama31-8b-h200", {}, levels=[1, 256], noise=0)
    low, high = lad.levels
    assert 100 < low.gpu_power_w < high.gpu_power_w <= 700
    assert low.gpu_power_w / low.output_throughput > high.gpu_power_w / high.output_throughput   # J/tok falls


def test_max_below_idle_is_one_line(tmp_path):
    data = yaml.safe_load((CARDS_DIR / "llama31-8b-h200.yaml").read_text())
    data["power"]["max_w"] = 50
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="max_w"):
        load_card(bad)


def test_smi_refuses_a_field_as_nvidia_smi_does():
    res = subprocess.run([sys.executable, "-m", "tunectl.sim.smi", "--server", "http://127.0.0.1:9",
                          "--query-gpu=index,power.drawz", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout.strip() == 'Field "power.drawz" is not a valid field to query.'
    res = subprocess.run([sys.executable, "-m", "tunectl.sim.smi", "--server", "http://127.0.0.1:9",
                          "--query-gpu=index,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 15 and res.stdout == ""        # no server: nvidia-smi's "GPU is lost"
