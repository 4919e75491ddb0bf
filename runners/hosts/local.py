"""LocalRunner: the Runner interface on this machine, with subprocess and /proc.

Detached runs go through the shared WRAPPER under a new session (`start_new_session=True`), so the wrapper's pid
is the process group id. Process discovery reads /proc: the group by pgid, escaped descendants by the
TUNECTL_RUN_ID in their environment. Nothing is ever found or killed by name.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from tunectl.runners.hosts.base import WRAPPER, ProcHandle, ProcInfo, Result, env_file
from tunectl.store import atomic_write

_TCP_LISTEN = "0A"


def _proc_stat(pid: int) -> tuple[str, int, str] | None:
    """(state, pgid, start_time) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[2]), fields[19]


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p)


def _has_env(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _code(returncode: int) -> int:
    """Shell convention: 128+N for death by signal N (what the wrapper records too)."""
    return returncode if returncode >= 0 else 128 - returncode


def proc_info(pid: int) -> ProcInfo | None:
    st = _proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return None
    return ProcInfo(pid=pid, pgid=st[1], cmdline=_cmdline(pid), start_time=st[2])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _listen_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == _TCP_LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def _socket_owner(inodes: set[str]) -> int | None:
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return pid
            except OSError:
                continue
    return None


class LocalRunner:
    name = "local"

    def __init__(self) -> None:
        self._children: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------------ commands
    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None) -> Result:
        full_env = {**os.environ, **(env or {})}
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=full_env, start_new_session=True,
                                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError as e:   # like a shell: command not found is exit 127, not an exception
            return Result(list(argv), 127, "", f"{argv[0]}: {e.strerror}")
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(proc.pid)
            out, err = proc.communicate()
            return Result(list(argv), _code(proc.returncode), out.decode(errors="replace"),
                          err.decode(errors="replace"), timed_out=True)
        return Result(list(argv), _code(proc.returncode), out.decode(errors="replace"),
                      err.decode(errors="replace"))

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # ------------------------------------------------------------------ detached process groups
    def start_detached(self, argv: list[str], workdir: str, env: dict[str, str], run_id: str) -> ProcHandle:
        self.makedirs(workdir, 0o700)
        handle = ProcHandle.for_dir(run_id, workdir)
        wrapper = f"{workdir}/launch.sh"
        self.write_file(wrapper, WRAPPER.encode(), 0o700)
        self.write_file(f"{workdir}/env", env_file({**env, "TUNECTL_RUN_ID": run_id}).encode(), 0o600)
        with open(handle.log_path, "ab") as log:
            proc = subprocess.Popen(["bash", wrapper, workdir, "--", *argv], cwd=workdir,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        self._children.append(proc)
        threading.Thread(target=proc.wait, daemon=True).start()  # reap: no zombie in the group
        handle.pgid = self._wait_pgid(handle, proc)
        return handle

    def _wait_pgid(self, handle: ProcHandle, proc: subprocess.Popen[bytes], limit: float = 10.0) -> int:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            raw = self.read_file(handle.pgid_path).strip()
            if raw:
                return int(raw)
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        return proc.pid  # the session leader's pid is the pgid even if the wrapper died early

    def poll(self, handle: ProcHandle) -> int | None:
        raw = self.read_file(handle.exit_code_path).strip()
        return int(raw) if raw else None

    def group_processes(self, handle: ProcHandle) -> list[ProcInfo]:
        marker = f"TUNECTL_RUN_ID={handle.run_id}".encode()
        out = []
        for pid in _pids():
            if pid == os.getpid():
                continue
            st = _proc_stat(pid)
            if st is None or st[0] in ("Z", "X"):
                continue
            if (handle.pgid is not None and st[1] == handle.pgid) or _has_env(pid, marker):
                out.append(ProcInfo(pid=pid, pgid=st[1], cmdline=_cmdline(pid), start_time=st[2]))
        return out

    def signal_group(self, handle: ProcHandle, sig: int) -> None:
        if handle.pgid is not None and handle.pgid > 1:
            try:
                os.killpg(handle.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.group_processes(handle):
            if p.pgid == handle.pgid:
                continue
            st = _proc_stat(p.pid)
            if st is not None and st[2] == p.start_time:  # same process, not a reused pid
                try:
                    os.kill(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    # ------------------------------------------------------------------ files
    def read_file(self, path: str, offset: int = 0, max_bytes: int | None = None) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read() if max_bytes is None else f.read(max_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return b""

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        atomic_write(Path(path), data, mode, make_parents=False)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        os.makedirs(path, mode=mode, exist_ok=True)
        os.chmod(path, mode)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def remove_tree(self, path: str) -> None:
        p = Path(path)
        if not p.is_absolute() or len(p.resolve().parts) < 3:
            raise ValueError(f"refusing to remove {path!r}: not a tunectl directory")
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)

    def put(self, local_path: str, remote_path: str, mode: int = 0o600) -> None:
        self.write_file(remote_path, Path(local_path).read_bytes(), mode)

    def get(self, remote_path: str, local_path: str) -> None:
        shutil.copyfile(remote_path, local_path)

    # ------------------------------------------------------------------ network
    def port_owner(self, port: int) -> ProcInfo | None | bool:
        inodes = _listen_inodes(port)
        if not inodes:
            return None
        pid = _socket_owner(inodes)
        info = proc_info(pid) if pid is not None else None
        return info if info is not None else True

    def endpoint(self, host: str, port: int) -> tuple[str, int]:
        return host, port

    def close(self) -> None:
        self._children = [p for p in self._children if p.poll() is None]
