"""Bundled SGLang source patches applied on the host's installed sglang.

`Patcher(runner, python).ensure(ids)` makes exactly `ids` applied (reverting to pristine copies first when the
set differs), verifies them and returns {id: sha256 of the patch file}; `last` holds the patched files' hashes
for the trial record. The work happens on the host in one `python -c` call of runners/checks/_patch_helper.py, under
an flock next to the sglang package, so two workers never patch one install at once.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tunectl.errors import TunectlError
from tunectl.runners.hosts.base import Runner

HELPER = (Path(__file__).parent / "_patch_helper.py").read_text()


class PatchError(TunectlError):
    """A patch cannot be applied (wrong SGLang version, conflict, lock held, patch file altered)."""

    def __init__(self, message: str, kind: str = "patch"):
        self.kind = kind
        super().__init__(message)


@dataclass
class PatchSpec:
    id: str
    file: str
    versions: list[str]
    sha256: str
    touches: list[str]
    fixes: str = ""
    verified_on_gpu: bool = False


@dataclass
class PatchState:
    dir: str = ""
    version: str = ""
    patches: dict[str, str] = field(default_factory=dict)   # id -> sha256 of the patch file
    files: dict[str, str] = field(default_factory=dict)     # patched file (relative to sglang/) -> sha256
    changed: bool = False
    reverted: list[str] = field(default_factory=list)


def patches_root() -> Path:
    return Path(str(resources.files("tunectl.sglang_patches")))


def load_manifest(root: Path | None = None) -> dict[str, PatchSpec]:
    root = root or patches_root()
    data = yaml.safe_load((root / "manifest.yaml").read_text())
    specs = [PatchSpec(**entry) for entry in data["patches"]]
    return {s.id: s for s in specs}


def patch_bytes(spec: PatchSpec, root: Path | None = None) -> bytes:
    data = ((root or patches_root()) / spec.file).read_bytes()
    if hashlib.sha256(data).hexdigest() != spec.sha256:
        raise PatchError(f"sglang_patches/{spec.file}: sha256 differs from manifest.yaml; the bundled patch was "
                         "altered", kind="hash")
    return data


class Patcher:
    def __init__(self, runner: Runner, python: str = "python3", workdir: str = "/tmp/tunectl",
                 lock_timeout: float = 120.0, root: Path | None = None):
        self.runner, self.python, self.workdir = runner, python, workdir
        self.lock_timeout, self.root = lock_timeout, root
        self.manifest = load_manifest(root)
        self.last = PatchState()
        self._located: dict[str, str] | None = None

    def _call(self, command: str, arg: dict[str, Any], timeout: float) -> dict[str, Any]:
        argv = [self.python, "-c", HELPER, command, json.dumps(arg)]
        res = self.runner.run(argv, timeout=timeout)
        try:
            out = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise PatchError(f"patch helper failed on {self.runner.name} with {self.python} "
                             f"(exit {res.exit_code}): {res.tail or 'no output'}", kind="helper") from None
        if not out.get("ok"):
            raise PatchError(f"{self.runner.name}: {out['error']}", kind=out.get("kind", "patch"))
        return out

    def locate(self) -> dict[str, str]:
        if self._located is None:
            self._located = self._call("locate", {}, timeout=60)
        return self._located

    def canonical(self, pid: str) -> str:
        """A manifest id; the number prefix may be left out (`flashinfer-cutlass-autotune`)."""
        if pid in self.manifest:
            return pid
        return next((i for i in self.manifest if i.split("-", 1)[-1] == pid), pid)

    def check(self, ids: list[str]) -> list[PatchSpec]:
        """The specs for ids, in manifest order; refuse unknown ids and wrong SGLang versions."""
        ids = [self.canonical(i) for i in ids]
        unknown = [i for i in ids if i not in self.manifest]
        if unknown:
            raise PatchError(f"unknown patch {unknown[0]!r}; bundled: {', '.join(self.manifest)}", kind="unknown")
        version = self.locate()["version"] if ids else ""
        specs = [s for s in self.manifest.values() if s.id in ids]
        for s in specs:
            if version not in s.versions:
                raise PatchError(f"patch {s.id} is for SGLang {', '.join(s.versions)}, but {self.python} on "
                                 f"{self.runner.name} has sglang {version} ({self.locate()['dir']}); remove it "
                                 "from the profile or install a matching SGLang", kind="version")
        return specs

    def dry_run(self, ids: list[str]) -> None:
        """Version check plus `patch --dry-run` on the host; changes nothing."""
        specs = self.check(ids)
        if specs:
            loc = self.locate()
            self._call("ensure", {"dir": loc["dir"], "version": loc["version"], "dry_run": True,
                                  "want": [self._upload(s) for s in specs], "lock_timeout": self.lock_timeout},
                       timeout=self.lock_timeout + 180)

    def ensure(self, ids: list[str]) -> dict[str, str]:
        specs = self.check(ids)
        if not specs and self._located is None:
            try:
                self.locate()
            except PatchError:          # nothing wanted and no sglang there: nothing to revert
                return {}
        loc = self.locate()
        want = [self._upload(s) for s in specs]
        out = self._call("ensure", {"dir": loc["dir"], "version": loc["version"], "want": want,
                                    "lock_timeout": self.lock_timeout}, timeout=self.lock_timeout + 180)
        self.last = PatchState(dir=loc["dir"], version=loc["version"], files=out["files"],
                               patches={s.id: s.sha256 for s in specs}, changed=out["changed"],
                               reverted=out["reverted"])
        return dict(self.last.patches)

    def _upload(self, spec: PatchSpec) -> dict[str, Any]:
        d = f"{self.workdir}/patches"
        self.runner.makedirs(self.workdir)
        self.runner.makedirs(d)
        path = f"{d}/{spec.sha256}.patch"
        if not self.runner.exists(path):
            self.runner.write_file(path, patch_bytes(spec, self.root), mode=0o600)
        return {"id": spec.id, "path": path, "sha256": spec.sha256, "touches": spec.touches}
