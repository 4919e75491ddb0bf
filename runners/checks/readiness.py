"""`run_checks(profile, runner)`: is this host ready for a study? Data only (the CLI renders the table).

Each Check says pass/fail, what was seen, and for a failure how to fix it. Called by `tunectl check` and before
every study, so a renamed flag or a dirty GPU stops the study before trial 1, not at trial 17.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunectl import knobs
from tunectl.engines import engine
from tunectl.errors import HostKeyError, InfraError, TunectlError
from tunectl.profile import Profile
from tunectl.runners.checks import flagcheck, hostcheck
from tunectl.runners.checks.patches import Patcher, PatchError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


ENGINE_CHECKS = ("python", "sglang")
CONFIG_CHECKS = (*ENGINE_CHECKS, "flags", "patches")   # what the profile decides, not the host's current state


class ChecksFailed(TunectlError):
    """One line: "the engine cannot start: ..." when the server's interpreter or module is missing (exit 1),
    else the failed checks; a flag the host's SGLang does not know is the profile's mistake (exit 2)."""

    def __init__(self, checks: list[Check]):
        self.checks = [c for c in checks if not c.ok]
        engine = next((c for c in self.checks if c.name in ENGINE_CHECKS), None)
        if engine is not None:
            msg = f"the engine cannot start: {engine.detail}" + (f"; {engine.fix}" if engine.fix else "")
        else:
            msg = "host checks failed: " + "; ".join(f"{c.name}: {c.detail}" + (f" ({c.fix})" if c.fix else "")
                                                     for c in self.checks)
        self.exit_code = 2 if {c.name for c in self.checks} <= {"flags"} else 1
        super().__init__(msg)


def patch_ids(prof: Profile) -> list[str]:
    knob_patches = [t.name for n, s in prof.search.space.items() if (t := knobs.target(n, s)).kind == "patch"]
    return list(dict.fromkeys(prof.server.patches + knob_patches))


# run id -> (is the tunectl that launched it running: True/False, or None when nobody here can say; its study)
Owner = Callable[[str], "tuple[bool | None, str | None]"]


class _Ctx:
    def __init__(self, prof: Profile, runner: Any, owner: Owner | None = None):
        self.prof, self.runner, self.owner = prof, runner, owner
        self.version = prof.server.sglang_version
        self.engine = engine(prof)
        self.patcher = Patcher(runner, prof.server.python, prof.host.workdir, lock_timeout=30)


def _host(c: _Ctx) -> Check:
    patience = getattr(c.runner, "reconnect_s", None)
    try:
        if patience is not None:          # an unreachable host should fail the check fast, not after a minute
            c.runner.reconnect_s = min(patience, 2 * c.prof.host.connect_timeout_s)
        res = c.runner.run(["true"], timeout=c.prof.host.connect_timeout_s + 10)
    except HostKeyError as e:
        return Check("host", False, str(e), f"tunectl hosts trust {c.prof.host.address}")
    except InfraError as e:
        return Check("host", False, str(e), "check host.address, the network and ~/.ssh/config (ProxyJump)")
    except TunectlError as e:
        return Check("host", False, str(e), "ssh-add your key, or set host.identity_file")
    finally:
        if patience is not None:
            c.runner.reconnect_s = patience
    return Check("host", res.ok, f"{c.runner.name} reachable" + ("" if c.prof.host.kind == "local" else
                                                                  ", host key trusted"), "")


def importable(module: str) -> str:
    """Python that fails unless `module` is found as the server's `python -m` finds it: not from the current
    directory (`-c` puts it first on sys.path, `-m` in the server's working directory does not), so a checkout
    that runs tunectl without installing it fails here, not in every trial."""
    return (f"import sys, importlib.util; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
            f"sys.exit(0 if importlib.util.find_spec({module!r}) else {'No module named ' + repr(module)!r})")


def _python(c: _Ctx) -> Check:
    res = c.runner.run([c.prof.server.python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                       timeout=60)
    if not res.ok:
        last = res.tail.strip().splitlines()[-1] if res.tail.strip() else f"exit {res.exit_code}"
        return Check("python", False, f"server.python {c.prof.server.python!r} does not run on {c.runner.name}: "
                                      f"{last}", "set server.python to the interpreter that has "
                     + c.engine.package + " installed")
    return Check("python", True, f"{c.prof.server.python} is Python {res.stdout.strip()}")


def _sglang(c: _Ctx) -> Check:
    if not c.engine.patches_on_host:     # the stand-in: nothing to locate and patch, only to import
        res = c.runner.run([c.prof.server.python, "-c", importable(c.engine.module)], timeout=60)
        last = res.tail.strip().splitlines()[-1] if res.tail.strip() else f"exit {res.exit_code}"
        return Check("sglang", res.ok, "the stand-in tunectl.sim" if res.ok else
                     f"{c.prof.server.python} on {c.runner.name} cannot import the stand-in tunectl.sim: {last}",
                     "" if res.ok else "unset server.python (the interpreter running tunectl is used), or "
                                       "pip install tunectl for that interpreter")
    try:
        loc = c.patcher.locate()
    except PatchError as e:
        return Check("sglang", False, str(e), f"install sglang=={c.version} for {c.prof.server.python}")
    if loc["version"] != c.version:
        return Check("sglang", False, f"profile says {c.version}, host has sglang {loc['version']} ({loc['dir']})",
                     f"set server.sglang_version: \"{loc['version']}\" or install sglang=={c.version}")
    return Check("sglang", True, f"sglang {loc['version']} at {loc['dir']}")


def _gpus(c: _Ctx) -> list[Check]:
    host, sim = c.prof.host, not c.engine.uses_gpus
    try:
        gpus, apps = hostcheck.query(c.runner)
    except hostcheck.NvidiaSmiError as e:
        return [Check("gpus", sim, ("not needed by the stand-in; " if sim else "") + str(e),
                      "" if sim else "install the NVIDIA driver on the host, or run on a GPU host")]
    seen = ", ".join(f"{g.index}: {g.used_mib}/{g.total_mib} MiB" for g in gpus) or "none"
    problems = hostcheck.gpu_problems(gpus, apps, host.gpus, host.gpu_clean_mib)
    return [Check("gpus", bool(gpus) or sim, f"{len(gpus)} GPU(s): {seen}", "" if gpus else "no GPU visible"),
            Check("gpu memory", not problems, "; ".join(problems) or f"target GPUs under {host.gpu_clean_mib} MiB",
                  "stop those processes by their process group or wait; tunectl never kills what it did not start"
                  if problems else "")]


def _ports(c: _Ctx) -> Check:
    problems = hostcheck.port_problems(c.runner, [c.prof.server.port])
    bind = str(c.prof.server.flags.get("host", c.prof.server.host))
    note = "" if _loopback(bind) else f"; the server listens on {bind}: other machines can reach it"
    return Check("port", not problems, "; ".join(problems) or f"port {c.prof.server.port} free" + note,
                 "stop that server or set server.port" if problems else "")


def _loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (the servers tunectl starts need no other address: clients run beside them)."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:                    # a host name: not known to be loopback
        return False


def _disk(c: _Ctx) -> Check:
    gb, need = hostcheck.free_disk_gb(c.runner, c.prof.host.workdir), c.prof.host.min_free_disk_gb
    return Check("disk", gb >= need, f"{gb:.1f} GB free at {c.prof.host.workdir} (need {need:g})",
                 "" if gb >= need else "free space or set host.workdir elsewhere")


def _leftovers(c: _Ctx) -> Check:
    """Processes of earlier tunectl runs: those under this profile's host.workdir first (a killed run of this
    profile: `--stop-leftovers` stops them), then any other (another study on the same host). With an `owner`
    (`tunectl check`): only runs whose tunectl is gone are leftovers; a live study's servers are left alone."""
    if c.owner is not None:
        return _owned_leftovers(c)
    found = hostcheck.leftovers(c.runner, python=c.prof.server.python)
    own = {h.run_id for h in hostcheck.own_leftovers(c.runner, c.prof.host.workdir, c.prof.server.python).values()}
    found.sort(key=lambda line: not any(f"run {r})" in line for r in own))
    fix = ("those of runs under host.workdir: tunectl check --stop-leftovers (by their recorded process group); "
           "others: kill -TERM -- -PGID")
    return Check("leftovers", not found, "; ".join(found[:5]) or "no tunectl processes running", fix if found else "")


def _owned_leftovers(c: _Ctx) -> Check:
    assert c.owner is not None
    rows = hostcheck.host_helper(c.runner, "ours", {}, c.prof.server.python or "python3")
    gone, live, unknown = [], set(), set()
    for r in rows:
        alive, study = c.owner(r["run_id"])
        if alive is False:
            gone.append(f"pid {r['pid']} (pgid {r['pgid']}, run {r['run_id']}, study {study}): {r['cmdline'][:100]}")
        else:
            (live if alive else unknown).add(study or r["run_id"])
    seen = [f"{len(live)} running stud{'y' if len(live) == 1 else 'ies'} ({', '.join(sorted(live))}) left alone"
            if live else "", f"runs launched from another results folder or machine, not judged: "
            f"{', '.join(sorted(unknown))}" if unknown else ""]
    detail = "; ".join([*gone[:5], *filter(None, seen)]) or "no tunectl processes running"
    return Check("leftovers", not gone, detail,
                 "tunectl check --stop-leftovers (their tunectl is gone; by their recorded process group)"
                 if gone else "")


def _flags(c: _Ctx) -> Check:
    problems = flagcheck.check_flags(c.runner, c.prof, c.version)
    n = len(flagcheck.used_flags(c.prof))
    return Check("flags", not problems, "; ".join(problems) or f"{n} flags valid in the host's --help",
                 "rename the flag or fix the value as shown (from the host's own --help)" if problems else "")


def _patches(c: _Ctx) -> Check:
    ids = patch_ids(c.prof)
    if not c.engine.patches_on_host:
        unknown = [i for i in ids if c.patcher.canonical(i) not in c.patcher.manifest]
        return Check("patches", not unknown, f"unknown patch {unknown[0]!r}" if unknown else
                     f"{len(ids)} patch(es) known; the stand-in applies them by env",
                     f"bundled: {', '.join(c.patcher.manifest)}" if unknown else "")
    c.patcher.dry_run(ids)
    return Check("patches", True, f"{len(ids)} patch(es) apply to sglang {c.version}" if ids else "none used")


STEPS: list[Callable[[_Ctx], Check | list[Check]]] = [_python, _sglang, _gpus, _ports, _disk, _leftovers, _flags,
                                                     _patches]


def run_checks(prof: Profile, runner: Any, only: tuple[str, ...] | None = None,
               owner: Owner | None = None) -> list[Check]:
    """All checks, or `only` those named (the host's reachability always comes first). `owner`: whether a run's
    tunectl still runs (`tunectl.store.owner_alive`), so the leftovers are those whose tunectl is gone."""
    c = _Ctx(prof, runner, owner)
    first, steps = [_host], STEPS
    if prof.host.kind == "slurm":                    # the cluster's checks; ports and leftovers are the job's
        from tunectl.runners.checks import slurmcheck

        first, steps = [*slurmcheck.FIRST, _host], [_python, _sglang, *slurmcheck.STEPS, _flags, _patches]
        only = None if only is None else (*only, *(slurmcheck.NAMES if "gpus" in only else ()))
    out: list[Check] = []
    for step in first:                               # (a host that cannot run a command fails alone)
        out.append(step(c))
        if not out[-1].ok:
            return out
    for step in steps:
        name = step.__name__.strip("_")
        if only is not None and name not in only:
            continue
        try:
            got = step(c)
        except TunectlError as e:
            got = Check(name, False, str(e), "see the message")
        out += got if isinstance(got, list) else [got]
    return out


def require_checks(prof: Profile, runner: Any) -> list[Check]:
    checks = run_checks(prof, runner)
    if not all(c.ok for c in checks):
        raise ChecksFailed(checks)
    return checks
