"""The host-side power sampler (runners/server/power.py): nvidia-smi's power query parsed from real-format text,
read through a runner from a real process, averaged over a level's middle."""
from __future__ import annotations

import stat
import sys
from pathlib import Path

from tunectl.runners.hosts.local import LocalRunner
from tunectl.runners.server.power import QUERY, Sampler, parse_power, smi_reader, summarize

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "power"


def test_parses_real_format_rows():
    assert parse_power((FIX / "h200x1-idle.power.csv").read_text()) == {0: (100.21, 0.0)}
    busy = parse_power((FIX / "h100x8-tp8-busy.power.csv").read_text())
    assert sorted(busy) == list(range(8)) and busy[2] == (640.77, 99.0)
    assert parse_power((FIX / "h200x1-busy.units.csv").read_text()) == {0: (611.84, 100.0)}   # without nounits


def test_na_power_is_no_reading_not_an_error():
    assert parse_power((FIX / "mig-na.power.csv").read_text()) == {0: (None, 0.0)}
    assert summarize([parse_power((FIX / "mig-na.power.csv").read_text())]) == {}
    assert parse_power("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n") == {}


def test_summary_leaves_out_ramp_up_and_drain():
    idle, busy = parse_power((FIX / "h200x1-idle.power.csv").read_text()), \
        parse_power((FIX / "h200x1-busy.power.csv").read_text())
    ramp = {0: (380.0, 60.0)}
    out = summarize([idle, ramp] + [busy] * 8 + [ramp, idle])   # idle (0%): not the level's work; then 10% trimmed
    assert out["watts"] == 611.84 and out["gpus"] == 1 and out["samples"] == 8
    assert summarize([ramp, busy])["watts"] == (380.0 + 611.84) / 2     # too few to trim: all of them
    assert summarize([idle, idle])["watts"] == 100.21                    # an idle level still reads its idle power


def test_reads_through_the_runner_from_a_real_process(tmp_path):
    """A stand-in `nvidia-smi` program on the host (a script printing the H100 x8 capture) read through LocalRunner:
    the query's arguments reach it, the GPUs asked for are passed with -i, and the sampler averages its rows."""
    smi = tmp_path / "nvidia-smi"
    argv_file, capture = str(tmp_path / "argv"), str(FIX / "h100x8-tp8-busy.power.csv")
    smi.write_text(f"#!{sys.executable}\nimport sys\nopen({argv_file!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                   f"print(open({capture!r}).read(), end='')\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    read = smi_reader(LocalRunner(), [str(smi)], [0, 1, 2, 3, 4, 5, 6, 7])
    got = Sampler(read, "nvidia-smi", interval_s=0.01).start().stop()
    assert (tmp_path / "argv").read_text() == " ".join([*QUERY, "-i", "0,1,2,3,4,5,6,7"])
    assert got["gpus"] == 8 and got["source"] == "nvidia-smi" and 640 < got["watts"] < 662


def test_a_host_without_nvidia_smi_gives_no_power(tmp_path):
    read = smi_reader(LocalRunner(), [str(tmp_path / "no-such-nvidia-smi")], None)
    assert Sampler(read, "nvidia-smi", interval_s=0.01).start().stop() == {}


def test_nvml_reader_reads_milliwatts_and_none_without_the_module(tmp_path, monkeypatch):
    """NVML's API as `nvidia-ml-py` exposes it (power in milliwatts); no GPU here, so a module with its five calls."""
    from tunectl.runners.server.power import nvml_reader

    monkeypatch.setitem(sys.modules, "pynvml", None)       # not installed: no NVML reader (nvidia-smi then)
    assert nvml_reader(None) is None
    (tmp_path / "pynvml.py").write_text(
        "class _U:\n    gpu = 87\n"
        "def nvmlInit(): pass\n"
        "def nvmlDeviceGetCount(): return 2\n"
        "def nvmlDeviceGetHandleByIndex(i): return i\n"
        "def nvmlDeviceGetPowerUsage(h): return 612470 if h == 0 else 598010\n"
        "def nvmlDeviceGetUtilizationRates(h): return _U()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    read = nvml_reader([1])
    assert read is not None and read() == {1: (598.01, 87.0)}
    assert nvml_reader(None)() == {0: (612.47, 87.0), 1: (598.01, 87.0)}
