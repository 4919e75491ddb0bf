# Runs ON THE HOST as `python -c <this file's text> <command> <json>` (stdlib only, no tunectl import).
# Commands: `locate` -> {"dir", "version"} of the sglang package the given python imports;
# `ensure` -> make exactly the wanted patch set applied (revert to pristine first when it differs), under an
# flock in <sglang>/.tunectl-patches/lock so two workers never patch one install at once.
# Prints one JSON object; {"ok": false, "kind": ..., "error": ...} on failure.
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

STATE_DIR = ".tunectl-patches"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Fail(Exception):
    def __init__(self, kind, error):
        super().__init__(error)
        self.kind, self.error = kind, error


def locate(_arg):
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise Fail("missing", "sglang is not installed for %s" % sys.executable)
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"dir": list(spec.submodule_search_locations)[0], "version": version, "python": sys.executable}


def take_lock(sdir, timeout):
    os.makedirs(sdir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(sdir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                raise Fail("locked", "another worker is patching this install (lock holder: %s)" % holder)
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("%s pid %d" % (socket.gethostname(), os.getpid())).encode(), 0)
    return fd


def run_patch(pdir, patch_file, *extra):
    if shutil.which("patch") is None:
        raise Fail("no-patch", "the `patch` program is not installed on the host (apt-get install patch)")
    cmd = ["patch", "-p1", "--batch", "--no-backup-if-mismatch", "-r", "-", "-d", pdir, "-i", patch_file]
    p = subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=120)
    return p.returncode, (p.stdout + p.stderr).strip()


def load_state(sdir, version):
    try:
        with open(os.path.join(sdir, "state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    if state.get("version") != version:
        shutil.rmtree(os.path.join(sdir, "pristine"), ignore_errors=True)
        state = {}
    state.setdefault("version", version)
    state.setdefault("applied", [])
    state.setdefault("files", {})
    state.setdefault("pristine", {})
    return state


def save_state(sdir, state):
    tmp = os.path.join(sdir, "state.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(sdir, "state.json"))


def check_untouched(pdir, state):
    for rel, want in state["files"].items():
        now = sha256(os.path.join(pdir, rel))
        if now not in (want, state["pristine"].get(rel)):
            raise Fail("tampered", "%s was modified outside tunectl (sha256 %s); reinstall sglang" % (rel, now[:12]))


def revert(pdir, sdir, state):
    for rel, pristine_sha in state["pristine"].items():
        src = os.path.join(sdir, "pristine", rel)
        dst = os.path.join(pdir, rel)
        if sha256(dst) != pristine_sha:
            shutil.copy2(src, dst)
        if sha256(dst) != pristine_sha:
            raise Fail("revert", "could not restore pristine %s" % rel)
    reverted = state["applied"]
    state["applied"], state["files"] = [], {}
    return reverted


def keep_pristine(pdir, sdir, state, touches):
    for rel in touches:
        if rel not in state["pristine"]:
            dst = os.path.join(sdir, "pristine", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(pdir, rel), dst)
            state["pristine"][rel] = sha256(dst)


def apply_one(pdir, sdir, state, patch):
    if sha256(patch["path"]) != patch["sha256"]:
        raise Fail("hash", "patch %s does not match its manifest sha256" % patch["id"])
    keep_pristine(pdir, sdir, state, patch["touches"])
    rc, out = run_patch(pdir, patch["path"], "--forward", "--dry-run")
    if rc != 0:
        raise Fail("dry-run", "patch %s does not apply to sglang %s: %s" % (patch["id"], state["version"], out))
    rc, out = run_patch(pdir, patch["path"], "--forward")
    if rc != 0:
        raise Fail("apply", "patch %s failed after a clean dry-run: %s" % (patch["id"], out))
    state["applied"].append(patch["id"])


def verify(pdir, state, want):
    for patch in reversed(want):
        rc, out = run_patch(pdir, patch["path"], "--reverse", "--dry-run")
        if rc != 0:
            raise Fail("verify", "patch %s is not in effect after applying: %s" % (patch["id"], out))
    state["files"] = {rel: sha256(os.path.join(pdir, rel)) for p in want for rel in p["touches"]}


def dry_run(pdir, state, want):
    for patch in want:
        if patch["id"] not in state["applied"]:
            rc, out = run_patch(pdir, patch["path"], "--forward", "--dry-run")
            if rc != 0 and state["applied"]:
                continue          # another set is applied; ensure() reverts to pristine first
            if rc != 0:
                raise Fail("dry-run", "patch %s does not apply to sglang %s: %s" % (patch["id"], state["version"], out))
    return {"changed": False, "reverted": [], "files": state["files"], "applied": state["applied"]}


def ensure(arg):
    pdir, want = arg["dir"], arg["want"]
    sdir = os.path.join(pdir, STATE_DIR)
    fd = take_lock(sdir, arg.get("lock_timeout", 60))
    try:
        state = load_state(sdir, arg["version"])
        check_untouched(pdir, state)
        ids = [p["id"] for p in want]
        if arg.get("dry_run"):
            return dry_run(pdir, state, want)
        wanted_sha = {p["id"]: p["sha256"] for p in want}
        if state["applied"] == ids and state.get("patch_sha") == wanted_sha:
            return {"changed": False, "reverted": [], "files": state["files"], "applied": ids}
        reverted = revert(pdir, sdir, state)
        save_state(sdir, state)
        for patch in want:
            apply_one(pdir, sdir, state, patch)
            save_state(sdir, state)
        verify(pdir, state, want)
        state["patch_sha"] = wanted_sha
        save_state(sdir, state)
        return {"changed": True, "reverted": reverted, "files": state["files"], "applied": ids}
    finally:
        os.close(fd)


def main():
    arg = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    try:
        out = {"locate": locate, "ensure": ensure}[sys.argv[1]](arg)
        out["ok"] = True
    except Fail as e:
        out = {"ok": False, "kind": e.kind, "error": e.error}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
