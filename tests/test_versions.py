"""SGLang's flags across the bundled versions (0.5.9, 0.5.17, 0.5.23), derived from their real --help texts:
renames, removals and aliases; a profile moved to another version; the crash catalog's repairs per version."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from tunectl.sglang import versions
from tunectl.sglang.crashes.catalog import CATALOG_VERSION, SIGNATURES
from tunectl.sglang.flags import bundled_flags, flag_index
from tunectl.wiring.migrate import move_profile
from tunectl.models import LOWER
from tunectl.profile import Profile, default_profile_path
from tunectl.runners.checks.flagcheck import problems
from tunectl.search.repair import repair_moves


def moved(name: str, value: Any, src: str, dst: str) -> dict[str, Any]:
    return versions.translate(name, value, src, dst).flags


def test_the_three_bundled_versions_are_known_in_order() -> None:
    assert versions.bundled_versions() == ["0.5.9", "0.5.17", "0.5.23"]


@pytest.mark.parametrize(("name", "value", "src", "dst", "want"), [
    # renamed: 0.5.17 keeps the old name as a deprecated alias, 0.5.23 drops it
    ("cuda-graph-max-bs", 64, "0.5.9", "0.5.23", {"cuda-graph-max-bs-decode": 64}),
    ("nsa-prefill-backend", "tilelang", "0.5.9", "0.5.23", {"dsa-prefill-backend": "tilelang"}),
    ("nsa-decode-backend", "trtllm", "0.5.17", "0.5.23", {"dsa-decode-backend": "trtllm"}),
    # and back: the newer name becomes the older one a newer version deprecated
    ("cuda-graph-max-bs-decode", 64, "0.5.23", "0.5.9", {"cuda-graph-max-bs": 64}),
    ("dsa-prefill-backend", "tilelang", "0.5.17", "0.5.9", {"nsa-prefill-backend": "tilelang"}),
    # a deprecated alias that still works stays as it is
    ("cuda-graph-max-bs", 64, "0.5.9", "0.5.17", {"cuda-graph-max-bs": 64}),
    ("disable-cuda-graph", True, "0.5.9", "0.5.23", {"disable-cuda-graph": True}),
    # a help's "'in-seq-split' maps to 'zigzag'" carries the value over
    ("dsa-prefill-cp-mode", "round-robin-split", "0.5.17", "0.5.23", {"cp-strategy": "interleave"}),
    # aliases of one flag (argparse option strings of one action) are kept as spelled
    ("tp-size", 8, "0.5.9", "0.5.23", {"tp-size": 8}),
    ("tensor-parallel-size", 8, "0.5.9", "0.5.23", {"tensor-parallel-size": 8}),
])
def test_renames_and_aliases_follow_the_help_texts(name: str, value: Any, src: str, dst: str,
                                                   want: dict[str, Any]) -> None:
    assert moved(name, value, src, dst) == want
    for flag in want:
        assert flag in flag_index(bundled_flags(dst))


def test_a_deprecation_note_says_what_replaces_the_flag() -> None:
    notes = versions.translate("cuda-graph-max-bs", 64, "0.5.9", "0.5.17").notes
    assert notes == ["--cuda-graph-max-bs is deprecated in SGLang 0.5.17: use --cuda-graph-max-bs-decode"]
    dep = versions.deprecations("0.5.17")["disable-cuda-graph"]
    assert dep.replaced_by == (("cuda-graph-backend-decode", "disabled"), ("cuda-graph-backend-prefill", "disabled"))
    assert versions.spelled("tp_size", "0.5.23") == versions.spelled("tensor-parallel-size", "0.5.23")


@pytest.mark.parametrize(("name", "value", "src", "dst", "said"), [
    ("prefill-round-robin-balance", True, "0.5.17", "0.5.23", "no longer exists in SGLang 0.5.23"),
    ("hybrid-kvcache-ratio", True, "0.5.9", "0.5.17", "takes a value: set it by hand"),
    ("no-such-flag", 1, "0.5.9", "0.5.17", "not a flag of SGLang 0.5.9"),
    ("tp-size", 8, "0.5.9", "0.6.0", "no bundled --help text for SGLang 0.6.0"),
])
def test_a_flag_without_successor_is_one_clear_error(name: str, value: Any, src: str, dst: str, said: str) -> None:
    with pytest.raises(versions.FlagGone, match=said) as e:
        versions.translate(name, value, src, dst)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.17", "0.5.23"])
def test_every_deprecation_points_at_flags_of_its_own_version(version: str) -> None:
    index = flag_index(bundled_flags(version))
    deps = versions.deprecations(version)
    assert deps
    for dep in deps.values():
        assert all(name in index for name, _ in dep.replaced_by), dep


def test_a_profile_naming_a_flag_of_another_version_is_told_the_new_name(tmp_path: Any) -> None:
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["sglang_version"] = "0.5.23"
    prof = Profile.model_validate(data)
    prof.source = "p.yaml"
    lines = problems(prof, bundled_flags("0.5.23"), "sglang.launch_server 0.5.23")
    assert ("p.yaml: server.flags.cuda-graph-max-bs: --cuda-graph-max-bs is not a flag of sglang.launch_server 0.5.23; "
            "--cuda-graph-max-bs is a flag of SGLang 0.5.17, not 0.5.23; use --cuda-graph-max-bs-decode") in lines
    assert any("--nsa-prefill-backend is a flag of SGLang 0.5.17, not 0.5.23; use --dsa-prefill-backend" in x
               for x in lines)


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_embedded_default_moves_to_a_newer_version_and_passes_its_flag_check(version: str) -> None:
    data = yaml.safe_load(default_profile_path().read_text())
    new, notes = move_profile(data, version)
    prof = Profile.model_validate(new)
    assert prof.server.sglang_version == version
    assert problems(prof, bundled_flags(version), version) == []
    assert "flashinfer-cutlass-autotune" not in prof.search.space             # patch 0001 is for 0.5.9 only
    assert any("patch 0001-flashinfer-cutlass-autotune is not for SGLang" in n for n in notes)
    if version == "0.5.23":
        assert "cuda-graph-max-bs-decode" in prof.search.space
        assert prof.search.space["cuda-graph-max-bs-decode"].when == {"disable-cuda-graph": False}
        assert prof.server.flags["dsa-prefill-backend"] == "tilelang" and "nsa-prefill-backend" not in prof.server.flags


def _repairs(signature: str, version: str) -> list[tuple[str, Any]]:
    sig = next(s for s in SIGNATURES if s.id == signature)
    return versions.resolve_repairs(sig.repairs, CATALOG_VERSION, version)


def test_the_catalogs_repairs_are_resolved_per_version() -> None:
    assert ("cuda-graph-max-bs", LOWER) in _repairs("capture_cuda_graph_failed", "0.5.9")
    on_0517 = _repairs("capture_cuda_graph_failed", "0.5.17")
    assert ("cuda-graph-max-bs", LOWER) in on_0517 and ("cuda-graph-max-bs-decode", LOWER) in on_0517
    on_0523 = _repairs("capture_cuda_graph_failed", "0.5.23")
    assert ("cuda-graph-max-bs-decode", LOWER) in on_0523 and ("cuda-graph-max-bs", LOWER) not in on_0523
    assert ("cuda-graph-backend-decode", "disabled") in _repairs("illegal_memory_access", "0.5.23")


def test_a_repair_reaches_the_knob_of_a_moved_profile() -> None:
    data = yaml.safe_load(default_profile_path().read_text())
    prof = Profile.model_validate(move_profile(data, "0.5.23")[0])
    params = {"disable-cuda-graph": False, "cuda-graph-max-bs-decode": 256}
    moves = repair_moves(prof.search, params, _repairs("capture_cuda_graph_failed", "0.5.23"))
    assert {"cuda-graph-max-bs-decode": 128} in moves
    # the catalog's 0.5.9 names reach it too (search/repair.py `spellings`: the search's own targets, the log
    # hints' graph max bs among them, are spelled as 0.5.9 spells them)
    assert {"cuda-graph-max-bs-decode": 128} in repair_moves(
        prof.search, params, next(s for s in SIGNATURES if s.id == "capture_cuda_graph_failed").repairs)


@pytest.mark.parametrize(("src", "dst"), [(a, b) for a in ("0.5.9", "0.5.17", "0.5.23")
                                          for b in ("0.5.9", "0.5.17", "0.5.23") if a != b])
def test_every_flag_of_a_version_moves_to_flags_of_the_other_or_is_named_gone(src: str, dst: str) -> None:
    known = flag_index(bundled_flags(dst))
    gone = 0
    for name, spec in bundled_flags(src).items():
        try:
            out = versions.translate(name, versions.ANY if spec.takes_value else True, src, dst).flags
        except versions.FlagGone as e:
            gone += 1
            assert name in str(e) and "\n" not in str(e)
            continue
        assert all(n in known for n in out), (name, out)
    assert gone < len(bundled_flags(src)) / 2
