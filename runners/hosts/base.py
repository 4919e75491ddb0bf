"""The Runner interface: what tunectl needs from a host, local or remote.

Every implementation (LocalRunner, SSHRunner) must pass the same conformance suite
(tests/runners/conformance.py). Nothing here builds shell strings from user values: commands are argv
lists, joined with shlex.join only where a shell is unavoidable (SSH exec), and user values travel as files.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

LOOPBACK = "127.0.0.1,localhost,::1"      # no_proxy for a server and its clients on one host

@dataclass
class Result:
    command: list[str]
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def tail(self) -> str:
        """The last lines of output, for error evidence (invoke's Result.tail)."""
        text = (self.stdout + ("\n" + self.stderr if self.stderr else "")).strip()
        return "\n".join(text.splitlines()[-10:])


@dataclass
class ProcHandle:
    """A detached process group started by `Runner.start_detached`, rebuilt from its directory if needed."""

    run_id: str
    dir: str                         # 0700 directory on the host holding the files below
    pgid: int | None = None          # recorded by the wrapper (== the command's pid: it runs under setsid)
    log_path: str = ""               # <dir>/server.log (stdout+stderr)
    exit_code_path: str = ""         # <dir>/exit_code, written by the wrapper when the command ends
    pgid_path: str = ""              # <dir>/pgid
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_dir(cls, run_id: str, d: str) -> ProcHandle:
        return cls(run_id=run_id, dir=d, log_path=f"{d}/server.log", exit_code_path=f"{d}/exit_code",
                   pgid_path=f"{d}/pgid")


@dataclass
class ProcInfo:
    pid: int
    pgid: int
    cmdline: str
    start_time: str = ""             # /proc/<pid>/stat field 22, guards against pid reuse


@runtime_checkable
class Runner(Protocol):
    """A host tunectl drives. All methods take explicit timeouts or use bounded defaults."""

    name: str                        # "local" or "ssh:<alias>"

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None) -> Result: ...

    def start_detached(self, argv: list[str], workdir: str, env: dict[str, str], run_id: str) -> ProcHandle:
        """Start argv in a new session/process group under `workdir` (created 0700), stdout+stderr to
        workdir/server.log, stdin from /dev/null, env from a 0600 file (plus TUNECTL_RUN_ID=run_id);
        the wrapper records the pgid and, when the command ends, its exit code (128+N for signal N)."""
        ...

    def poll(self, handle: ProcHandle) -> int | None:
        """The wrapper's recorded exit code, or None while it runs."""
        ...

    def group_processes(self, handle: ProcHandle) -> list[ProcInfo]:
        """Live processes of the run: in its process group, or carrying its TUNECTL_RUN_ID in environ."""
        ...

    def signal_group(self, handle: ProcHandle, sig: int) -> None:
        """Send sig to the recorded process group (and stragglers with the run id). Never by name."""
        ...

    def read_file(self, path: str, offset: int = 0, max_bytes: int | None = None) -> bytes:
        """Bytes of path from offset (b"" if missing)."""
        ...

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Atomically write path (temp + rename) with the given mode; parents must exist."""
        ...

    def makedirs(self, path: str, mode: int = 0o700) -> None: ...

    def exists(self, path: str) -> bool: ...

    def remove_tree(self, path: str) -> None:
        """Remove a directory tree that tunectl created (never an interpolated shell rm)."""
        ...

    def put(self, local_path: str, remote_path: str, mode: int = 0o600) -> None: ...

    def get(self, remote_path: str, local_path: str) -> None: ...

    def port_owner(self, port: int) -> ProcInfo | None | bool:
        """Who listens on TCP port: a ProcInfo when known, True when taken by an unknown process,
        None when free."""
        ...

    def endpoint(self, host: str, port: int) -> tuple[str, int]:
        """Where this machine reaches host:port on the runner's host (SSH: a local forward)."""
        ...

    def close(self) -> None: ...


# The wrapper every runner starts. Arguments: $1 = the directory; the real command follows `--`.
# The command runs under its own `setsid`, so its pid is the process group id recorded in `pgid`; the wrapper
# stays outside that group, so neither SGLang's own killpg on a crash (SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION=1)
# nor tunectl's group signals take it down before it records `$?` (over SSH the exit signal is otherwise lost:
# paramiko only reports exit-status).
WRAPPER = r"""#!/usr/bin/env bash
# tunectl launch wrapper: records the process group and the exit code of one server run.
dir="$1"; shift; [ "$1" = "--" ] && shift
cd "$dir" || exit 90
cat /proc/sys/kernel/random/boot_id > boot_id 2>/dev/null || true
set -a; . ./env; set +a
setsid "$@" < /dev/null &
child=$!
echo "$child" > pgid.tmp && mv pgid.tmp pgid
wait "$child"
rc=$?
echo "$rc" > exit_code.tmp && mv exit_code.tmp exit_code
"""


def env_file(env: dict[str, str]) -> str:
    """A file `set -a; . ./env` can source: every value shell-quoted, keys validated."""
    lines = []
    for k, v in sorted(env.items()):
        if not k.replace("_", "a").isalnum() or k[0].isdigit():
            raise ValueError(f"invalid environment variable name: {k!r}")
        lines.append(f"{k}={shlex.quote(str(v))}")
    return "\n".join(lines) + "\n"
