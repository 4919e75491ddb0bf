"""Server lifecycle on a Runner: preflight gate, launch, readiness, crash watch, teardown.

- `preflight(runner, prof, plan)`: refuse a dirty host (HostDirtyError naming pid and command of whoever holds
  the port, or the GPU evidence).
- `launch(runner, prof, plan, config_yaml) -> Server`: writes config.yaml into the 0700 trial dir and starts
  `plan.exec_argv` detached (process group + exit code recorded by the wrapper).
- `wait_ready(server) -> Startup`: ready = the "fired up" log line AND `GET /health_generate` 200. Deadlines per
  startup phase come from log milestones (profile `server.timeouts`, scaled by the stand-in's time scale); a
  deadline that passes while the server's kernel compilers run waits for them (compiling.py, `compile_s`).
  The log is polled every `POLL_S` (sooner in the first two seconds); a crash is classified by `LogWatcher` as
  soon as its line shows.
- `Server.check()`: one crash-watch step (used during load by the ladder).
- `teardown(server) -> dict`: always; snapshot pids, TERM the group, grace, KILL the group (and run-id
  stragglers), wait for the port and GPU memory, verdict "clean" | "dirty" with evidence.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tunectl.sglang.crashes.classifier import LogWatcher
from tunectl.engines import engine
from tunectl.errors import HostDirtyError
from tunectl.models import CrashInfo, LaunchPlan, http_url
from tunectl.profile import Profile
from tunectl.runners.hosts.base import ProcHandle, Runner
from tunectl.runners.server.compiling import TIMEOUT_COMPILE, CompileWait, describe

POLL_S = 0.2
FIRST_POLL_S = 0.05       # the first seconds of a startup are polled sooner: a small model is ready in about one
FIRST_POLLS_FOR_S = 2.0
SETTLE_S = 0.3            # after a death line: let the rest of the traceback land before classifying
PHASE_SLACK_S = 1.0       # wall-clock slack on scaled phase deadlines (process start, scheduling noise)
Event = Callable[[str, dict[str, Any]], None]

# (begin milestone, end milestone, Timeouts field)
PHASES = (("load_weight_begin", "load_weight_end", "load_weights_s"),
          ("load_weight_end", "memory_pool_end", "memory_pool_s"),
          ("autotune_begin", "autotune_end", "autotune_s"),
          ("cuda_graph_begin", "cuda_graph_end", "cuda_graph_s"))


def time_scale(prof: Profile) -> float:
    return engine(prof).time_scale(prof)


def scaled(prof: Profile, modeled_s: float, slack: float = PHASE_SLACK_S) -> float:
    """A deadline in wall seconds: modeled seconds times the stand-in's time scale, plus slack."""
    return modeled_s * time_scale(prof) + engine(prof).slack_s(slack)


# ---------------------------------------------------------------------------------------------- host gate
def gpu_evidence(runner: Runner, prof: Profile, pids: set[int] | None = None) -> list[str]:
    """Why the target GPUs are not clean (memory, compute apps, snapshot pids), for engine sglang; [] where the
    host has no nvidia-smi. The stand-in uses no GPU, so a GPU in use does not make its host dirty."""
    if not engine(prof).uses_gpus:
        return []
    from tunectl.runners.checks import hostcheck

    try:
        return hostcheck.gpu_problems(*hostcheck.query(runner), prof.host.gpus, prof.host.gpu_clean_mib, pids)
    except hostcheck.NvidiaSmiError as e:
        return [] if hostcheck.NO_SMI in str(e) else [str(e)]


def machine(runner: Runner, prof: Profile) -> str:
    """The GPUs a trial runs on, for its record (hostcheck.machine); "" for the stand-in, which uses none."""
    if not engine(prof).uses_gpus:
        return ""
    from tunectl.runners.checks import hostcheck

    return hostcheck.machine(runner, prof.host.gpus)


def port_evidence(runner: Runner, port: int) -> str | None:
    owner = runner.port_owner(port)
    if owner is None:
        return None
    if owner is True:
        return f"port {port} is held by a process this user cannot see"
    return f"port {port} is held by pid {owner.pid} ({owner.cmdline[:160]})"


def preflight(runner: Runner, prof: Profile, plan: LaunchPlan) -> None:
    evidence = [e for e in [port_evidence(runner, plan.port)] if e]
    evidence += gpu_evidence(runner, prof)
    if engine(prof).uses_gpus:       # on a GPU host, any live run of ours holds GPU memory
        from tunectl.runners.checks import hostcheck

        evidence += hostcheck.leftovers(runner, {plan.run_id}, prof.server.python)
    if evidence:
        raise HostDirtyError(f"refusing to launch on {runner.name}", evidence)


# ---------------------------------------------------------------------------------------------- the server
@dataclass
class Server:
    runner: Runner
    prof: Profile
    plan: LaunchPlan
    handle: ProcHandle
    started: float
    watcher: LogWatcher = field(default_factory=LogWatcher)
    first_line_at: float | None = None
    log_offset: int = 0                   # bytes of the log read so far
    pumps: list[float] = field(default_factory=list)  # recent times the log was read
    crash: CrashInfo | None = None
    detected_at: float | None = None      # monotonic time the crash was first seen
    phase: str = "startup"
    level: int | None = None
    jit: CompileWait = field(default_factory=CompileWait)   # time waited on kernel compilers during startup

    @property
    def base_url(self) -> str:
        host, port = self.runner.endpoint(self.plan.reach_host, self.plan.port)
        return http_url(host, port)

    def pump(self) -> None:
        """Read what the log gained since the last call and feed the watcher."""
        now = time.monotonic()                # lines read now were written before this instant
        self.pumps = [*self.pumps[-49:], now]
        data = self.runner.read_file(self.handle.log_path, self.log_offset)
        if data:
            self.log_offset += len(data)
            self.first_line_at = self.first_line_at or now
            self.watcher.feed(data, now)

    def check(self) -> CrashInfo | None:
        """One crash-watch step: the log, then the process. Sets and returns `crash` once it is known."""
        if self.crash is not None:
            return self.crash
        self.pump()
        exit_code = self.runner.poll(self.handle)
        if not self.watcher.crashed and exit_code is None:
            return None
        detected = self.detected_at = time.monotonic()
        self._settle(exit_code)
        exit_code = self.runner.poll(self.handle) if exit_code is None else exit_code
        info = self.watcher.crash_info(self.phase, self.level, exit_code, detected_at=detected)
        if info is None:
            info = CrashInfo(cls="flaky" if self.phase == "load" else "config_error", signature="unknown",
                             phase=self.phase, level=self.level if self.phase == "load" else None,
                             exit_code=exit_code, message=f"server exited with code {exit_code}")
        info.detect_latency_s = self._latency_bound(detected, info.detect_latency_s)
        self.crash = info
        return info

    def _latency_bound(self, detected: float, watched: float | None) -> float | None:
        """Traceback written -> detected, bounded above: it was written after the last read that missed it."""
        seen = self.watcher.first_traceback_at
        before = [t for t in self.pumps if seen is not None and t < seen]
        return round(detected - before[-1], 3) if before else watched

    def _settle(self, exit_code: int | None) -> None:
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end:
            time.sleep(0.05)
            self.pump()
        if exit_code is not None:
            self.watcher.flush(time.monotonic())

    def tail(self, max_bytes: int = 1 << 22) -> str:
        """The last max_bytes of the log, including what arrived since the last poll."""
        self.pump()
        return self.runner.read_file(self.handle.log_path, max(0, self.log_offset - max_bytes)).decode(errors="replace")


def launch(runner: Runner, prof: Profile, plan: LaunchPlan, config_yaml: str) -> Server:
    runner.makedirs(plan.trial_dir, 0o700)
    runner.makedirs(f"{plan.trial_dir}/tmp", 0o700)
    runner.write_file(f"{plan.trial_dir}/config.yaml", config_yaml.encode(), 0o600)
    handle = runner.start_detached(plan.exec_argv, plan.trial_dir, plan.env, plan.run_id)
    return Server(runner, prof, plan, handle, time.monotonic())


# ---------------------------------------------------------------------------------------------- readiness
@dataclass
class Startup:
    ready: bool
    crash: CrashInfo | None = None
    ready_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)


def phase_deadline(server: Server) -> tuple[str, float]:
    """(what we are waiting for, the wall-clock deadline) from the milestones seen so far; a phase counts from no
    earlier than the end of a compile that outlived its deadline (re-armed)."""
    prof, w = server.prof, server.watcher
    t, rearm = prof.server.timeouts, server.jit.rearm_at
    if server.first_line_at is None:
        return "first log line", max(server.started, rearm) + scaled(prof, t.launch_s, slack=10.0)
    open_phases = [(w.milestones[b], f) for b, e, f in PHASES if b in w.milestones and e not in w.milestones]
    if open_phases:
        since, fld = max(open_phases)
        return fld.removesuffix("_s"), max(since, rearm) + scaled(prof, getattr(t, fld))
    since = w.last_milestone[1] if w.last_milestone else server.first_line_at
    return "ready", max(since, rearm) + scaled(prof, t.ready_s, slack=5.0)


def health_ok(base_url: str, timeout: float = 25.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health_generate", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(server: Server, on_event: Event | None = None) -> Startup:
    seen: set[str] = set()
    while True:
        crash = server.check()
        for name, t in _phases(server).items():
            if name not in seen:
                seen.add(name)
                if on_event:
                    on_event("milestone", {"name": name, "t": t})
        if crash is not None:
            return _startup(server, crash)
        if server.watcher.ready and health_ok(server.base_url, timeout=_probe_timeout(server)):
            server.phase = "load"
            return _startup(server, None, ready_s=round(time.monotonic() - server.started, 3))
        what, deadline = phase_deadline(server)
        if time.monotonic() > deadline and not compile_grace(server, what, on_event):
            server.crash = startup_timeout(server, what)
            return _startup(server, server.crash)
        time.sleep(FIRST_POLL_S if time.monotonic() - server.started < FIRST_POLLS_FOR_S else POLL_S)


def _phases(server: Server) -> dict[str, float]:
    return {k: round(v - server.started, 3) for k, v in server.watcher.milestones.items()}


def _startup(server: Server, crash: CrashInfo | None, ready_s: float | None = None) -> Startup:
    phases = _phases(server)
    if server.jit.waited_s or server.jit.since is not None:
        phases["compiling_s"] = round(server.jit.total(time.monotonic()), 3)
    return Startup(crash is None, crash, ready_s=ready_s, phases=phases)


def compile_grace(server: Server, what: str, on_event: Event | None = None) -> bool:
    """The deadline of `what` passed: True while the server's compilers run (within compile_s) or re-armed it."""
    jit, now = server.jit, time.monotonic()
    if not jit.due(now):
        return True
    cap = scaled(server.prof, server.prof.server.timeouts.compile_s)
    state = jit.step(server.runner.group_processes(server.handle), now, cap)
    if state == "started" and on_event:
        on_event("compiling", {"phase": what, "compilers": dict(jit.found), "t": round(now - server.started, 3)})
    return state in ("started", "compiling") or state == "finished" and time.monotonic() <= phase_deadline(server)[1]


def _probe_timeout(server: Server) -> float:
    return engine(server.prof).probe_timeout_s


def startup_timeout(server: Server, what: str) -> CrashInfo:
    """A startup deadline passed. Past `compile_s` with compilers still running it is `timeout_compile`, class
    infra: a fresh host's one-time compile, not the config's fault (retried; the compiler cache keeps what was
    built)."""
    last = server.watcher.last_milestone[0] if server.watcher.last_milestone else "none"
    lines = server.tail(1 << 16).splitlines()
    evidence = {"phase": "startup", "exception_line": lines[-1] if lines else "",
                "traceback_excerpt": "\n".join(lines[-12:])}
    if server.jit.over_cap:
        limit = server.prof.server.timeouts.compile_s
        return CrashInfo(cls="infra", signature=TIMEOUT_COMPILE, **evidence,
                         message=f"not ready: the kernel compile ({describe(server.jit.found)}) did not finish "
                                 f"within compile_s={limit:g} (waiting for {what}; last milestone: {last})")
    return CrashInfo(cls="startup_timeout", signature=f"timeout_{what.replace(' ', '_')}", **evidence,
                     message=f"not ready: deadline for {what} passed (last milestone: {last})")


# ---------------------------------------------------------------------------------------------- teardown
def _wait(pred: Callable[[], bool], limit: float, step: float = 0.1) -> bool:
    end = time.monotonic() + limit
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(step)
    return True


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP that arrive inside the block wait until it ends, then act as they would have
    (the first one: Ctrl-C's KeyboardInterrupt, the CLI's `Terminated`). For a teardown: a second Ctrl-C, or
    `timeout`'s signal sent to tunectl and then again to its process group, would otherwise break the teardown off
    and leave the server running on the GPUs. Main thread only (where Python handles signals); a signal ignored
    stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        if handler is signal.SIG_IGN or handler is None:
            continue
        before[sig] = handler
        signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if held:
            handler = before[held[0]]
            if callable(handler):
                handler(held[0], None)          # raises here, as the signal would have inside the block
            else:                               # SIG_DFL: the default action
                os.kill(os.getpid(), held[0])


def teardown(server: Server) -> dict[str, Any]:
    from tunectl.runners.checks import hostcheck

    r, h, t = server.runner, server.handle, server.prof.server.timeouts
    t0 = time.monotonic()
    snapshot = r.group_processes(h)
    server.watcher.mark_stopping()
    graceful = not hostcheck.terminate(r, {0: h}, t.teardown_grace_s)
    # the launch wrapper's last step (`mv exit_code.tmp exit_code`, with the run's environment) can start just
    # after the group first looked empty: done = exit code written and group empty
    _wait(lambda: r.exists(h.exit_code_path) and not r.group_processes(h), 2.0, 0.05)
    left = r.group_processes(h)
    port_free = _wait(lambda: r.port_owner(server.plan.port) is None, t.port_release_s if not left else 1.0, 0.2)
    pids = {p.pid for p in snapshot}
    gpu = gpu_evidence(r, server.prof, pids)
    if gpu:
        _wait(lambda: not gpu_evidence(r, server.prof, pids), t.gpu_release_s, 1.0)
        gpu = gpu_evidence(r, server.prof, pids)
    r.remove_tree(f"{server.plan.trial_dir}/tmp")
    evidence = [f"pid {p.pid} still alive ({p.cmdline[:120]})" for p in left] + gpu
    if not port_free:
        evidence.append(port_evidence(r, server.plan.port) or f"port {server.plan.port} busy")
    return {"verdict": "dirty" if evidence else "clean", "seconds": round(time.monotonic() - t0, 3),
            "graceful": graceful, "snapshot_pids": [p.pid for p in snapshot], "exit_code": r.poll(h),
            "evidence": evidence}
