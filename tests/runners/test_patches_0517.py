"""Bundled patches 0003 and 0004 on the real SGLang 0.5.17 wheel source (pip download --no-deps sglang==0.5.17, cached
in .cache/sglang-src/0.5.17): applied, verified, reverted to pristine; refused on 0.5.9. Its line in a real server
log is pinned in tests/reports/test_real_gpu_ssh.py."""
from __future__ import annotations

import pytest

from tests.runners.test_patches import DSA_LOG, MHA, MOE_LOG, MOE_UTILS, make_install, sglang_source, sha
from tunectl.runners.hosts.local import LocalRunner
from tunectl.runners.checks.patches import Patcher, PatchError, load_manifest


@pytest.fixture(scope="module")
def pristine():
    return sglang_source("0.5.17")


@pytest.fixture
def install(tmp_path, pristine):
    return make_install(tmp_path, pristine, "0.5.17")


def test_log_moe_runner_applies_verifies_and_reverts(tmp_path, install, pristine):
    python, pkg = install
    patcher = Patcher(LocalRunner(), python=python, workdir=str(tmp_path / "work"), lock_timeout=2)
    before = sha(pkg / MOE_UTILS)
    assert patcher.ensure([MOE_LOG]) == {MOE_LOG: load_manifest()[MOE_LOG].sha256}
    body = (pkg / MOE_UTILS).read_text().split("def initialize_moe_config")[1].split("\ndef ")[0]
    assert '"tunectl patch 0003: moe_runner_backend=%s, moe_a2a_backend=%s, flashinfer_autotune=%s"' in body
    assert body.index("moe.quantization = server_args.quantization") < body.index("tunectl patch 0003")
    compile((pkg / MOE_UTILS).read_text(), MOE_UTILS, "exec")
    assert patcher.last.files == {MOE_UTILS: sha(pkg / MOE_UTILS)} != {MOE_UTILS: before}
    assert patcher.last.version == "0.5.17"
    assert patcher.ensure([]) == {}
    assert sha(pkg / MOE_UTILS) == before == sha(pristine / "sglang" / MOE_UTILS)
    assert patcher.last.reverted == [MOE_LOG]


def test_log_moe_runner_refused_on_059(tmp_path):
    python, _ = make_install(tmp_path, sglang_source("0.5.9"))
    patcher = Patcher(LocalRunner(), python=python, workdir=str(tmp_path / "work"), lock_timeout=2)
    with pytest.raises(PatchError) as e:
        patcher.ensure([MOE_LOG])
    assert e.value.kind == "version" and "is for SGLang 0.5.17" in str(e.value)


def test_log_dsa_fp8_prefix_sits_after_the_seeds_crash_site_and_reverts(tmp_path, install, pristine):
    python, pkg = install
    patcher = Patcher(LocalRunner(), python=python, workdir=str(tmp_path / "work"), lock_timeout=2)
    before = sha(pkg / MHA)
    assert patcher.ensure([MOE_LOG, DSA_LOG]) == {i: load_manifest()[i].sha256 for i in (MOE_LOG, DSA_LOG)}
    body = (pkg / MHA).read_text().split("def _get_mla_kv_buffer_from_fp8_for_dsa")[1].split("\n    def ")[0]
    # the line is logged only once the page table passed the assert that replaced 0.5.9's AttributeError
    assert body.index("page_table_1_flattened should have been generated") < body.index("tunectl patch 0004")
    assert body.index("tunectl patch 0004") < body.index("dequantize_k_cache_paged(")
    compile((pkg / MHA).read_text(), MHA, "exec")
    assert patcher.ensure([MOE_LOG]) == {MOE_LOG: load_manifest()[MOE_LOG].sha256}
    assert sha(pkg / MHA) == before == sha(pristine / "sglang" / MHA)
    assert DSA_LOG in patcher.last.reverted and "tunectl patch 0003" in (pkg / MOE_UTILS).read_text()
