"""SSHRunner: the Runner protocol over paramiko.

Host keys are pinned (unknown or changed = HostKeyError, never retried); key and agent auth only; every call is
bounded; a dead link is found by keepalive plus a liveness probe and re-dialled with tenacity on transient errors
only. Servers start fully detached (setsid + WRAPPER, I/O redirected, exit code written to a file), so they
outlive the link; a handle is rebuilt from its remote directory with `attach`. Commands are argv lists joined
with shlex; user values travel as files.
"""
from __future__ import annotations

import json
import posixpath
import shlex
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from tunectl.errors import InfraError, RunnerError, TunectlError
from tunectl.profile import HostSpec
from tunectl.runners.hosts import _ssh_log
from tunectl.runners.hosts._ssh_forward import Forward
from tunectl.runners.hosts.base import WRAPPER, ProcHandle, ProcInfo, Result, env_file
from tunectl.runners.hosts.ssh_conn import collect, connect_chain, is_transient, resolve

HOST_HELPER = (Path(__file__).parent / "host_helper.py").read_text()


class SSHAuthError(TunectlError):
    exit_code = 3


class SSHRunner:
    relays_in_process = True       # endpoint() is a port forward whose threads run in this process

    def __init__(self, host: HostSpec, python: str = "python3", reconnect_s: float = 60.0,
                 probe_interval_s: float = 10.0, on_event: Callable[[str, dict[str, Any]], None] | None = None):
        _ssh_log.install()                # paramiko's per-channel ERROR records: counted, not printed
        self.host, self.python = host, python
        self.alias = host.address or ""
        self.name = f"ssh:{self.alias}"
        self.reconnect_s, self.probe_interval_s = reconnect_s, probe_interval_s
        self.on_event = on_event or (lambda kind, data: None)
        self.op_timeout = max(host.connect_timeout_s, 5.0)
        self.hops = resolve(host)
        self._clients: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._last_ok = 0.0
        self._forwards: dict[tuple[str, int], Forward] = {}
        self._lock = threading.RLock()
        self.connects = 0                 # successful dials; the link changed when this moved
        self.reconnects = 0

    # ------------------------------------------------------------------------------------------ connection
    def _transport(self) -> paramiko.Transport:
        with self._lock:                  # forward threads, log pumps and the caller share one link
            t = self._clients[-1].get_transport() if self._clients else None
            if t is None or not t.is_active():
                self._connect()
                t = self._clients[-1].get_transport()
            elif time.monotonic() - self._last_ok > self.probe_interval_s:
                self._probe(t)
            assert t is not None
            return t

    def _connect(self) -> None:
        self._drop()
        try:
            self._clients = connect_chain(self.hops, self.alias)
        except (paramiko.AuthenticationException, paramiko.SSHException) as e:
            if not isinstance(e, paramiko.AuthenticationException) and "authentication methods" not in str(e):
                raise                     # link trouble: the caller's retry decides
            hop = self.hops[-1]
            raise SSHAuthError(f"ssh {hop.user}@{hop.display}: authentication failed ({e}); load your key into "
                               "ssh-agent or set host.identity_file (passwords are not supported)") from None
        self._last_ok = time.monotonic()
        self.connects += 1
        self.reconnects = self.connects - 1
        self.on_event("ssh_connected", {"host": self.alias, "reconnects": self.reconnects})

    def _probe(self, t: paramiko.Transport) -> None:
        chan = t.open_session(timeout=5)
        try:
            chan.settimeout(5)
            chan.exec_command("true")
            if not chan.status_event.wait(5):
                raise TimeoutError("ssh liveness probe got no answer in 5 s")
            self._last_ok = time.monotonic()
        finally:
            chan.close()

    def _drop(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:
                pass
        self._sftp = None
        for c in reversed(self._clients):
            c.close()
        self._clients = []

    def _retry(self, fn: Callable[[], Any]) -> Any:
        def before_sleep(state: Any) -> None:
            self._drop()
            self.on_event("ssh_reconnect", {"host": self.alias, "error": repr(state.outcome.exception())})

        try:
            for attempt in Retrying(retry=retry_if_exception(is_transient), reraise=True,
                                    wait=wait_exponential_jitter(multiplier=0.5, max=10),
                                    stop=stop_after_delay(self.reconnect_s), before_sleep=before_sleep):
                with attempt:
                    return fn()
        except Exception as e:
            if is_transient(e):
                raise InfraError(f"{self.name}: link down and not back within {self.reconnect_s:.0f}s: "
                                 f"{type(e).__name__}: {e}") from None
            raise

    def _sftp_client(self) -> paramiko.SFTPClient:
        t = self._transport()
        with self._lock:
            if self._sftp is None or self._sftp.get_channel().closed:
                self._sftp = paramiko.SFTPClient.from_transport(t)
                assert self._sftp is not None
                self._sftp.get_channel().settimeout(self.op_timeout * 4)
            return self._sftp

    @property
    def link_epoch(self) -> int:
        """Changes whenever the link was re-dialled: work spanning a change (a benchmark level through the
        forward) may have lost requests to the link, not to the server."""
        return self.reconnects

    # ------------------------------------------------------------------------------------------ commands
    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None) -> Result:
        return self._retry(lambda: self._exec(list(argv), timeout, env, cwd, stdin))

    def _command(self, argv: list[str], timeout: float, env: dict[str, str] | None, cwd: str | None) -> str:
        env_part = ["env", "--", *[f"{k}={v}" for k, v in (env or {}).items()]] if env else []
        cmd = shlex.join(["timeout", "-k", "5", f"{timeout:.3f}", *env_part, *argv])
        return f"cd -- {shlex.quote(cwd)} && {cmd}" if cwd else cmd

    def _exec(self, argv: list[str], timeout: float, env: dict[str, str] | None, cwd: str | None,
              stdin: bytes | None) -> Result:
        chan = self._transport().open_session(timeout=self.op_timeout)
        start = time.monotonic()
        try:
            chan.exec_command(self._command(argv, timeout, env, cwd))
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, code = collect(chan, deadline=start + timeout + 10)
        finally:
            chan.close()
        self._last_ok = time.monotonic()
        timed_out = code is None or (code in (124, 137) and time.monotonic() - start >= timeout * 0.9)
        return Result(command=argv, exit_code=-1 if code is None else code, stdout=out, stderr=err,
                      timed_out=timed_out)

    def check(self, argv: list[str], timeout: float = 60.0) -> Result:
        res = self.run(argv, timeout=timeout)
        if not res.ok:
            raise RunnerError(f"{self.name}: {shlex.join(argv)[:120]} failed", argv, res.exit_code, res.tail)
        return res

    def helper(self, command: str, arg: dict[str, Any], timeout: float = 60.0) -> Any:
        res = self.check([self.python, "-c", HOST_HELPER, command, json.dumps(arg)], timeout=timeout)
        return json.loads(res.stdout)

    # ------------------------------------------------------------------------------------------ processes
    def start_detached(self, argv: list[str], workdir: str, env: dict[str, str], run_id: str) -> ProcHandle:
        self.makedirs(workdir)
        self.write_file(f"{workdir}/env", env_file({**env, "TUNECTL_RUN_ID": run_id}).encode(), mode=0o600)
        self.write_file(f"{workdir}/launch.sh", WRAPPER.encode(), mode=0o700)
        # the token makes a retried launch (link lost mid-call) a no-op instead of a second server
        token = f"launched-{uuid.uuid4().hex[:12]}"
        launch = (f"cd -- {shlex.quote(workdir)} && mkdir {token} && rm -f exit_code pgid && "
                  f"{{ setsid bash launch.sh {shlex.join([workdir, '--', *argv])} >> server.log 2>&1 < /dev/null & }}")
        self._retry(lambda: self._exec(["sh", "-c", launch], 30, None, None, None))
        handle = ProcHandle.for_dir(run_id, workdir)
        deadline = time.monotonic() + 15
        while handle.pgid is None and time.monotonic() < deadline:
            handle = self.attach(run_id, workdir)
            if handle.pgid is None:
                time.sleep(0.05)
        if handle.pgid is None:
            raise RunnerError(f"{self.name}: the launch wrapper did not start in {workdir}",
                              argv, None, self.read_file(handle.log_path).decode(errors="replace"))
        return handle

    def attach(self, run_id: str, workdir: str) -> ProcHandle:
        """Rebuild a handle from the run's remote directory (after a reconnect or a restart)."""
        handle = ProcHandle.for_dir(run_id, workdir)
        pgid = self.read_file(handle.pgid_path).strip()
        handle.pgid = int(pgid) if pgid.isdigit() else None
        return handle

    def poll(self, handle: ProcHandle) -> int | None:
        raw = self.read_file(handle.exit_code_path).strip()
        return int(raw) if raw.lstrip(b"-").isdigit() else None

    def group_processes(self, handle: ProcHandle) -> list[ProcInfo]:
        rows = self.helper("procs", {"run_id": handle.run_id, "pgid": handle.pgid})
        return [ProcInfo(**r) for r in rows]

    def signal_group(self, handle: ProcHandle, sig: int) -> None:
        self.helper("signal", {"run_id": handle.run_id, "pgid": handle.pgid, "sig": int(sig)})

    def port_owner(self, port: int) -> ProcInfo | None | bool:
        out = self.helper("port", {"port": int(port)})
        return ProcInfo(**out) if isinstance(out, dict) else out

    def endpoint(self, host: str, port: int) -> tuple[str, int]:
        fwd = self._forwards.get((host, port))
        if fwd is None:
            self._retry(self._transport)
            fwd = self._forwards[(host, port)] = Forward(lambda: self._retry(self._transport), host, port)
        return "127.0.0.1", fwd.local_port

    # ------------------------------------------------------------------------------------------ files (SFTP)
    def read_file(self, path: str, offset: int = 0, max_bytes: int | None = None) -> bytes:
        def read() -> bytes:
            try:
                with self._sftp_client().open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(max_bytes) if max_bytes is not None else f.read()
            except FileNotFoundError:
                return b""
        return self._retry(read)

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        def write() -> None:
            sftp = self._sftp_client()
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            with sftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                f.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        self._retry(write)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        def mk() -> None:
            sftp, cur = self._sftp_client(), ""
            for part in posixpath.normpath(path).split("/"):
                cur = f"{cur}/{part}" if cur or part else "/"
                if part and not self._isdir(sftp, cur):
                    sftp.mkdir(cur, mode)
            sftp.chmod(path, mode)
        self._retry(mk)

    @staticmethod
    def _isdir(sftp: paramiko.SFTPClient, path: str) -> bool:
        try:
            return stat.S_ISDIR(sftp.stat(path).st_mode or 0)
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        def ex() -> bool:
            try:
                self._sftp_client().stat(path)
                return True
            except FileNotFoundError:
                return False
        return self._retry(ex)

    def remove_tree(self, path: str) -> None:
        norm = posixpath.normpath(path)
        if not norm.startswith("/") or norm.count("/") < 2 or ".." in norm.split("/"):
            raise ValueError(f"{self.name}: refusing to remove {path!r}: not a tunectl directory")
        self.check(["rm", "-rf", "--", norm])

    def put(self, local_path: str, remote_path: str, mode: int = 0o600) -> None:
        self.write_file(remote_path, Path(local_path).read_bytes(), mode=mode)

    def get(self, remote_path: str, local_path: str) -> None:
        self._retry(lambda: self._sftp_client().get(remote_path, local_path))

    def close(self) -> None:
        for fwd in self._forwards.values():
            fwd.close()
        self._forwards.clear()
        self._drop()

