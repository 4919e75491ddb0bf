"""Every checked-in profile loads; bad profiles give one line naming file, field, line, value and valid choices."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests._badyaml import bad_yaml_error
from tunectl.sglang.flags import bundled_flags
from tunectl.profile import load_profile

PROFILES = sorted((Path(__file__).resolve().parents[1] / "profiles").glob("*.yaml"))
SIM = Path(__file__).resolve().parents[1] / "profiles" / "sim-glm5.yaml"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_every_profile_loads(path: Path) -> None:
    prof = load_profile(path)
    assert prof.name == path.stem


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_flags_exist_in_that_sglang_version(path: Path) -> None:
    prof = load_profile(path)
    known = bundled_flags(prof.server.sglang_version)
    names = list(prof.server.flags) + [k.flag or n for n, k in prof.search.space.items() if not (k.patch or k.env)]
    aliases = {a.lstrip("-") for spec in known.values() for a in spec.aliases}
    unknown = [n for n in names if n not in known and n not in aliases]
    assert not unknown, f"{path.name}: not flags of SGLang {prof.server.sglang_version}: {unknown}"


def test_seed_profiles_share_the_search_space() -> None:
    sim = load_profile(SIM)
    real = load_profile(SIM.with_name("glm5-nvfp4-8x-rtx-pro-6000.yaml"))
    assert sim.search.space == real.search.space and sim.server.engine == "sim" and real.server.engine == "sglang"
    assert real.host.kind == "ssh" and real.server.flags["nsa-prefill-backend"] != "trtllm"   # the crash is reachable


def _bad(tmp_path: Path, edit) -> str:
    return bad_yaml_error(tmp_path, SIM, edit, load_profile)


def test_unknown_key(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["server"].update(enigne="sim"))
    assert "server.enigne" in msg and "unknown key" in msg and "engine" in msg
    assert msg.split(":")[1].isdigit()                       # the line number


def test_bad_literal_lists_the_choices(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["host"].update(kind="ssh2"))
    assert "host.kind" in msg and "'ssh2'" in msg and "'local'" in msg and "'ssh'" in msg


def test_hosts_replace_host_and_the_first_is_the_single_host(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d.update(hosts=[{"kind": "local", "workdir": "/srv/a"}]))
    assert "not both" in msg and "host:" in msg and "hosts:" in msg       # the default profile has host:
    import yaml

    data = yaml.safe_load(SIM.read_text())
    del data["host"]
    data["hosts"] = [{"kind": "local", "workdir": "/srv/a"}, {"kind": "local", "workdir": "/srv/b"}]
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(data))
    prof = load_profile(tmp_path / "two.yaml")
    assert prof.host.workdir == "/srv/a" and [h.workdir for h in prof.hosts] == ["/srv/a", "/srv/b"]


def test_bad_type(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["bench"]["workloads"][0].update(input_len="long"))
    assert "bench.workloads.0.input_len" in msg and "'long'" in msg and "integer" in msg


def test_bad_knob(tmp_path: Path) -> None:
    msg = _bad(tmp_path, lambda d: d["search"]["space"]["cuda-graph-max-bs"].update(type="choice"))
    assert "search.space.cuda-graph-max-bs.type" in msg and "'categorical'" in msg
