"""Bundled SGLang patches on the real SGLang 0.5.9 wheel source (pip download --no-deps sglang==0.5.9, cached in
.cache/sglang-src): apply, verify, idempotent re-apply, revert, wrong-version refusal, the lock."""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tunectl import REPO_ROOT
from tunectl.runners.checks.patches import Patcher, PatchError, load_manifest, patch_bytes, patches_root
from tunectl.runners.hosts.local import LocalRunner

CACHE = Path(REPO_ROOT) / ".cache" / "sglang-src"
MR = "srt/model_executor/model_runner.py"
MHA = "srt/models/deepseek_common/attention_forward_methods/forward_mha.py"
CUTLASS, PT1 = "0001-flashinfer-cutlass-autotune", "0002-page-table-1-flattened"
MOE_LOG, MOE_UTILS = "0003-log-moe-runner", "srt/layers/moe/utils.py"
DSA_LOG = "0004-log-dsa-fp8-prefix"


def sglang_source(version: str = "0.5.9") -> Path:
    """The unpacked wheel (sglang/ + dist-info), downloaded once with pip."""
    dest = CACHE / version
    if (dest / "sglang" / MR).is_file():
        return dest
    wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))       # 0.5.17 ships platform wheels, 0.5.9 py3-none
    if not wheels:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={version}", "-d",
                              str(CACHE)], capture_output=True, text=True, timeout=600)
        wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
        if res.returncode != 0 or not wheels:
            pytest.skip(f"cannot fetch sglang {version} with pip download: {res.stderr.strip()[-200:]}")
    wheel = wheels[0]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)
    return dest


@pytest.fixture(scope="module")
def pristine() -> Path:
    return sglang_source()


def make_install(tmp_path: Path, pristine: Path, version: str = "0.5.9") -> tuple[str, Path]:
    """A python whose `sglang` is a fresh copy of the real package: (python path, sglang dir)."""
    site = tmp_path / "site"
    shutil.copytree(pristine / "sglang", site / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(pristine / f"sglang-{version}.dist-info", site / f"sglang-{version}.dist-info")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python), site / "sglang"


@pytest.fixture
def install(tmp_path, pristine):
    return make_install(tmp_path, pristine)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def patcher(install, tmp_path):
    return Patcher(LocalRunner(), python=install[0], workdir=str(tmp_path / "work"), lock_timeout=2)


def test_manifest_hashes_match_bundled_files():
    manifest = load_manifest()
    assert set(manifest) == {CUTLASS, PT1, MOE_LOG, DSA_LOG}
    for spec in manifest.values():
        assert hashlib.sha256(patch_bytes(spec)).hexdigest() == spec.sha256
        assert spec.versions == (["0.5.17"] if spec.id in (MOE_LOG, DSA_LOG) else ["0.5.9"])
    assert manifest[PT1].verified_on_gpu is False


def test_apply_verify_and_record_hashes(patcher, install, pristine):
    _, pkg = install
    got = patcher.ensure([CUTLASS, PT1])
    assert got == {i: load_manifest()[i].sha256 for i in (CUTLASS, PT1)}
    autotune = (pkg / MR).read_text().split("def _should_run_flashinfer_autotune")[1].split("major, _")[0]
    assert '\n            "flashinfer_cutlass",' in autotune          # enabled, not a comment any more
    mha = (pkg / MHA).read_text()
    assert 'getattr(metadata, "page_table_1_flattened", None)' in mha
    assert "backend.forward_metadata.page_table_1_flattened" not in mha
    compile(mha, MHA, "exec")                                          # still valid Python
    compile((pkg / MR).read_text(), MR, "exec")
    assert patcher.last.files == {MR: sha(pkg / MR), MHA: sha(pkg / MHA)}
    assert patcher.last.version == "0.5.9" and patcher.last.changed


def test_reapply_is_idempotent(patcher, install):
    _, pkg = install
    patcher.ensure([CUTLASS, PT1])
    before = {f: ((pkg / f).stat().st_mtime_ns, sha(pkg / f)) for f in (MR, MHA)}
    assert patcher.ensure([PT1, CUTLASS]) == patcher.ensure([CUTLASS, PT1])
    assert not patcher.last.changed
    assert {f: ((pkg / f).stat().st_mtime_ns, sha(pkg / f)) for f in (MR, MHA)} == before


def test_revert_to_pristine_when_the_set_differs(patcher, install, pristine):
    _, pkg = install
    patcher.ensure([CUTLASS, PT1])
    patcher.ensure([CUTLASS])
    assert sha(pkg / MHA) == sha(pristine / "sglang" / MHA)
    assert sha(pkg / MR) != sha(pristine / "sglang" / MR)
    assert patcher.last.reverted == [CUTLASS, PT1]
    assert patcher.ensure([]) == {}
    assert sha(pkg / MR) == sha(pristine / "sglang" / MR)
    assert not list(pkg.rglob("*.orig")) and not list(pkg.rglob("*.rej"))


def test_wrong_version_refused(patcher, install):
    python, pkg = install
    meta = pkg.parent / "sglang-0.5.9.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.5.9", "Version: 0.5.17", 1))
    before = sha(pkg / MR)
    with pytest.raises(PatchError) as e:
        patcher.ensure([CUTLASS])
    assert e.value.kind == "version"
    assert "is for SGLang 0.5.9" in str(e.value) and "sglang 0.5.17" in str(e.value)
    assert sha(pkg / MR) == before


def test_conflicting_source_refused_untouched(patcher, install):
    _, pkg = install
    src = (pkg / MR).read_text().replace('# "flashinfer_cutlass",', '"flashinfer_cutlass",  # local edit')
    (pkg / MR).write_text(src)
    with pytest.raises(PatchError) as e:
        patcher.ensure([CUTLASS])
    assert e.value.kind == "dry-run" and "does not apply" in str(e.value)
    assert (pkg / MR).read_text() == src


def test_edit_outside_tunectl_detected(patcher, install):
    _, pkg = install
    patcher.ensure([CUTLASS])
    (pkg / MR).write_text((pkg / MR).read_text() + "\n# someone else\n")
    with pytest.raises(PatchError, match="modified outside tunectl"):
        patcher.ensure([])


def test_lock_held_by_another_worker(patcher, install):
    _, pkg = install
    (pkg / ".tunectl-patches").mkdir()
    with open(pkg / ".tunectl-patches" / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("other-host pid 4242")
        f.flush()
        with pytest.raises(PatchError) as e:
            patcher.ensure([CUTLASS])
        assert e.value.kind == "locked" and "other-host pid 4242" in str(e.value)
    assert patcher.ensure([CUTLASS])                      # free again: goes through


def test_two_workers_never_interleave(install, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    python, pkg = install
    sets = [[CUTLASS], [CUTLASS, PT1], [PT1], []] * 3
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda ids: Patcher(LocalRunner(), python, str(tmp_path / "w"), lock_timeout=60).ensure(ids),
                      sets))
    final = Patcher(LocalRunner(), python, str(tmp_path / "w"))
    final.ensure([CUTLASS, PT1])                         # state is coherent: a clean apply on top works
    assert final.last.files == {MR: sha(pkg / MR), MHA: sha(pkg / MHA)}


def test_unknown_patch_and_altered_bundle(patcher, tmp_path):
    with pytest.raises(PatchError, match="unknown patch 'nope'; bundled: 0001-flashinfer-cutlass-autotune"):
        patcher.ensure(["nope"])
    root = tmp_path / "bundle"
    shutil.copytree(patches_root(), root)
    spec = load_manifest(root)[CUTLASS]
    (root / spec.file).write_text((root / spec.file).read_text().replace("tunectl patch", "evil patch"))
    with pytest.raises(PatchError, match="sha256 differs"):
        patch_bytes(spec, root)


@pytest.mark.sshd
def test_patches_through_ssh(make_ssh_runner, install, tmp_path):
    python, pkg = install
    p = Patcher(make_ssh_runner(), python=python, workdir=str(tmp_path / "remote"))
    assert set(p.ensure([CUTLASS, PT1])) == {CUTLASS, PT1}
    assert p.last.files[MHA] == sha(pkg / MHA)
    assert os.stat(tmp_path / "remote" / "patches").st_mode & 0o777 == 0o700
