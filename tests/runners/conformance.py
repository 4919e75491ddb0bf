"""The Runner conformance suite: every Runner implementation must pass these tests unchanged.

Use it from a test module that provides two fixtures, then imports the classes:

    @pytest.fixture
    def runner(): ...            # a connected Runner
    @pytest.fixture
    def workdir(): ...           # a fresh writable directory (absolute path) on the runner's host

    from tests.runners.conformance import *

Optional fixture `runner_factory`: returns a new Runner; the survival test starts a run through it, closes it,
and checks through `runner` that the run lives on. Everything on the host is done through the runner itself
(`python3` must exist there), so the suite says nothing about where the host is.
"""
from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request
import uuid

import pytest

from tunectl.runners.hosts.base import ProcHandle, ProcInfo, Runner

__all__ = ["TestFiles", "TestGroups", "TestNetwork", "TestRun", "TestShellSafety", "TestStartDetached"]

HOSTILE = ["x; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a'b\"c", "line1\nline2", "$HOME", "*"]


def py(code: str, *args: str) -> list[str]:
    return ["python3", "-c", code, *args]


def wait_for(pred, timeout: float = 10.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def run_id() -> str:
    return f"conf-{uuid.uuid4().hex[:12]}"


def start(runner: Runner, workdir: str, argv: list[str], env: dict[str, str] | None = None,
          name: str = "run") -> ProcHandle:
    return runner.start_detached(argv, f"{workdir}/{name}", env or {}, run_id())


def finish(runner: Runner, h: ProcHandle) -> int | None:
    wait_for(lambda: runner.poll(h) is not None, timeout=15)
    return runner.poll(h)


def mode_of(runner: Runner, path: str) -> int:
    res = runner.run(py("import os,sys; print(oct(os.stat(sys.argv[1]).st_mode & 0o777))", path))
    assert res.ok, res.tail
    return int(res.stdout.strip(), 8)


def cleanup(runner: Runner, h: ProcHandle) -> None:
    """Kill the run and wait for the wrapper's last step: the group can look empty just before the wrapper's
    `mv exit_code.tmp exit_code` starts (seen on a loaded machine), so done = exit code written and group empty."""
    runner.signal_group(h, signal.SIGKILL)
    wait_for(lambda: runner.exists(h.exit_code_path) and not runner.group_processes(h), timeout=10)


class TestStartDetached:
    def test_exit_code_zero_and_nonzero(self, runner, workdir):
        ok = start(runner, workdir, ["true"], name="ok")
        bad = start(runner, workdir, py("import sys; sys.exit(7)"), name="bad")
        assert finish(runner, ok) == 0
        assert finish(runner, bad) == 7

    def test_self_sigkill_is_137(self, runner, workdir):
        h = start(runner, workdir, py("import os; os.kill(os.getpid(), 9)"))
        assert finish(runner, h) == 137

    def test_pgid_recorded_and_log_captured(self, runner, workdir):
        code = "import os,sys; print('pg', os.getpgrp(), 'sid', os.getsid(0)); print('err', file=sys.stderr)"
        h = start(runner, workdir, py(code))
        assert finish(runner, h) == 0
        assert isinstance(h.pgid, int) and h.pgid > 1
        assert runner.read_file(h.pgid_path).strip() == str(h.pgid).encode()
        log = runner.read_file(h.log_path).decode()
        assert f"pg {h.pgid} sid {h.pgid}" in log  # own session and group, led by the wrapper
        assert "err" in log  # stderr goes to the same log

    def test_env_file_private_dir_private_run_id_exported(self, runner, workdir):
        h = runner.start_detached(py("import os; print('RID=' + os.environ['TUNECTL_RUN_ID'], os.environ['K'])"),
                                  f"{workdir}/envrun", {"K": "v1"}, "conf-rid-1")
        assert finish(runner, h) == 0
        assert "RID=conf-rid-1 v1" in runner.read_file(h.log_path).decode()
        assert mode_of(runner, h.dir) == 0o700
        assert mode_of(runner, f"{h.dir}/env") == 0o600

    def test_stdin_is_dev_null(self, runner, workdir):
        h = start(runner, workdir, py("import sys; print('stdin=%r' % sys.stdin.read())"))
        assert finish(runner, h) == 0
        assert "stdin=''" in runner.read_file(h.log_path).decode()

    def test_poll_none_while_running(self, runner, workdir):
        h = start(runner, workdir, py("import time; time.sleep(30)"))
        try:
            time.sleep(0.3)
            assert runner.poll(h) is None
            assert runner.group_processes(h)
        finally:
            cleanup(runner, h)

    def test_survives_the_caller(self, runner, workdir, request):
        try:
            factory = request.getfixturevalue("runner_factory")
        except pytest.FixtureLookupError:
            pytest.skip("no runner_factory fixture")
        other = factory()
        h = start(other, workdir, py("import time; time.sleep(30)"))
        other.close()
        try:
            time.sleep(0.5)
            assert runner.poll(h) is None
            assert any(p.pgid == h.pgid for p in runner.group_processes(h))
        finally:
            cleanup(runner, h)


# a parent with two children in its group and one descendant that escaped with setsid
FAMILY = """
import os, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(2)]
esc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)
print('escaped', esc.pid, flush=True)
time.sleep(60)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('armed', flush=True)
time.sleep(60)
"""


class TestGroups:
    def test_finds_children_and_setsid_escapee(self, runner, workdir):
        h = start(runner, workdir, py(FAMILY))
        try:
            assert wait_for(lambda: b"escaped" in runner.read_file(h.log_path))
            escaped = int(runner.read_file(h.log_path).split()[1])
            # parent, two children, escapee
            assert wait_for(lambda: len(runner.group_processes(h)) >= 4), runner.group_processes(h)
            procs = runner.group_processes(h)
            pids = {p.pid for p in procs}
            assert escaped in pids  # found by run id, not by group
            assert {p.pgid for p in procs if p.pid != escaped} == {h.pgid}
            assert next(p for p in procs if p.pid == escaped).pgid != h.pgid
            assert all(isinstance(p, ProcInfo) and p.start_time for p in procs)
        finally:
            cleanup(runner, h)
        assert runner.group_processes(h) == []

    def test_term_then_kill_leaves_nothing(self, runner, workdir):
        h = start(runner, workdir, py(STUBBORN))
        assert wait_for(lambda: b"armed" in runner.read_file(h.log_path))
        runner.signal_group(h, signal.SIGTERM)
        time.sleep(0.5)
        alive = runner.group_processes(h)
        assert any("SIG_IGN" in p.cmdline for p in alive)  # the stubborn one ignored TERM
        runner.signal_group(h, signal.SIGKILL)
        assert wait_for(lambda: runner.group_processes(h) == [])

    def test_kill_reaches_escapee(self, runner, workdir):
        h = start(runner, workdir, py(FAMILY))
        assert wait_for(lambda: b"escaped" in runner.read_file(h.log_path))
        assert wait_for(lambda: len(runner.group_processes(h)) >= 4)
        runner.signal_group(h, signal.SIGKILL)
        assert wait_for(lambda: runner.group_processes(h) == [])

    def test_other_runs_untouched(self, runner, workdir):
        a = start(runner, workdir, py("import time; time.sleep(30)"), name="a")
        b = start(runner, workdir, py("import time; time.sleep(30)"), name="b")
        try:
            assert wait_for(lambda: runner.group_processes(a) and runner.group_processes(b))
            runner.signal_group(a, signal.SIGKILL)
            assert wait_for(lambda: runner.group_processes(a) == [])
            assert runner.poll(b) is None and runner.group_processes(b)
        finally:
            cleanup(runner, b)


class TestRun:
    def test_output_exit_code_env_cwd_stdin(self, runner, workdir):
        code = ("import os,sys; print(os.environ['X'], os.getcwd()); "
                "print(sys.stdin.read(), file=sys.stderr); sys.exit(4)")
        res = runner.run(py(code), env={"X": "hello"}, cwd=workdir, stdin=b"fed")
        assert res.exit_code == 4 and not res.ok and not res.timed_out
        assert res.stdout.split() == ["hello", workdir]
        assert res.stderr.strip() == "fed"

    def test_missing_command_is_exit_127(self, runner, workdir):
        res = runner.run(["tunectl-no-such-command-xyz", "--version"], cwd=workdir)
        assert res.exit_code == 127 and not res.ok and not res.timed_out

    def test_timeout_kills_the_command(self, runner, workdir):
        pidfile = f"{workdir}/run.pid"
        code = "import os,sys,time; open(sys.argv[1],'w').write(str(os.getpid())); time.sleep(30)"
        t0 = time.monotonic()
        res = runner.run(py(code, pidfile), timeout=1.0)
        assert res.timed_out and not res.ok
        assert time.monotonic() - t0 < 10
        pid = runner.read_file(pidfile).decode().strip()
        assert pid
        gone = "import os,sys\ntry:\n os.kill(int(sys.argv[1]), 0); print('alive')\nexcept OSError: print('gone')"
        assert wait_for(lambda: runner.run(py(gone, pid)).stdout.strip() == "gone", timeout=5)


class TestFiles:
    def test_read_file_offsets(self, runner, workdir):
        p = f"{workdir}/data.bin"
        runner.write_file(p, b"0123456789")
        assert runner.read_file(p) == b"0123456789"
        assert runner.read_file(p, offset=3) == b"3456789"
        assert runner.read_file(p, offset=3, max_bytes=2) == b"34"
        assert runner.read_file(p, offset=50) == b""
        assert runner.read_file(f"{workdir}/missing") == b""

    def test_tail_a_growing_log(self, runner, workdir):
        code = "import time\nfor i in range(3):\n print('line', i, flush=True); time.sleep(0.2)"
        h = start(runner, workdir, py(code))
        seen, offset = b"", 0
        while runner.poll(h) is None or offset < len(runner.read_file(h.log_path)):
            chunk = runner.read_file(h.log_path, offset)
            seen, offset = seen + chunk, offset + len(chunk)
            time.sleep(0.05)
        assert seen.decode().splitlines() == ["line 0", "line 1", "line 2"]

    def test_write_file_atomic_and_mode(self, runner, workdir):
        p = f"{workdir}/conf.yaml"
        runner.write_file(p, b"a: 1\n", mode=0o600)
        assert mode_of(runner, p) == 0o600
        inode = "import os,sys; print(os.stat(sys.argv[1]).st_ino)"
        before = runner.run(py(inode, p)).stdout
        runner.write_file(p, b"a: 2\n", mode=0o755)
        assert runner.read_file(p) == b"a: 2\n"
        assert mode_of(runner, p) == 0o755
        assert runner.run(py(inode, p)).stdout != before  # replaced by rename, never rewritten in place
        listing = runner.run(py("import os,sys; print(sorted(os.listdir(sys.argv[1])))", workdir)).stdout
        assert listing.strip() == "['conf.yaml']"  # no temp file left behind

    def test_makedirs_exists_remove_tree(self, runner, workdir):
        d = f"{workdir}/a/b/c"
        runner.makedirs(d, 0o700)
        runner.write_file(f"{d}/f", b"x")
        assert runner.exists(d) and runner.exists(f"{d}/f")
        assert mode_of(runner, d) == 0o700
        runner.remove_tree(f"{workdir}/a")
        assert not runner.exists(f"{workdir}/a")
        runner.remove_tree(f"{workdir}/a")  # missing: no error
        assert runner.exists(workdir)

    def test_put_get(self, runner, workdir, tmp_path):
        src = tmp_path / "src.bin"
        src.write_bytes(os.urandom(100_000))
        runner.put(str(src), f"{workdir}/up.bin", mode=0o640)
        assert runner.read_file(f"{workdir}/up.bin") == src.read_bytes()
        assert mode_of(runner, f"{workdir}/up.bin") == 0o640
        back = tmp_path / "back.bin"
        runner.get(f"{workdir}/up.bin", str(back))
        assert back.read_bytes() == src.read_bytes()


LISTEN = """
import http.server, sys
srv = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler)
print('listening', flush=True)
srv.serve_forever()
"""
FREE_PORT = "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"


class TestNetwork:
    def test_port_owner_free_then_taken(self, runner, workdir):
        port = int(runner.run(py(FREE_PORT)).stdout)
        assert runner.port_owner(port) is None
        h = start(runner, workdir, py(LISTEN, str(port)))
        try:
            assert wait_for(lambda: b"listening" in runner.read_file(h.log_path))
            owner = runner.port_owner(port)
            assert isinstance(owner, ProcInfo), owner
            assert owner.pid in {p.pid for p in runner.group_processes(h)}
            assert "http.server" in owner.cmdline
        finally:
            cleanup(runner, h)
        assert wait_for(lambda: runner.port_owner(port) is None)

    def test_endpoint_reaches_host_port(self, runner, workdir):
        port = int(runner.run(py(FREE_PORT)).stdout)
        h = runner.start_detached(py(LISTEN, str(port)), f"{workdir}/srv", {}, run_id())
        try:
            assert wait_for(lambda: b"listening" in runner.read_file(h.log_path))
            runner.write_file(f"{h.dir}/hello.txt", b"hi there")
            host, lport = runner.endpoint("127.0.0.1", port)
            with urllib.request.urlopen(f"http://{host}:{lport}/hello.txt", timeout=5) as r:
                assert r.read() == b"hi there"
            with socket.create_connection((host, lport), timeout=5):
                pass
        finally:
            cleanup(runner, h)


ECHO = "import json,os,sys; print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get('V')}))"


class TestShellSafety:
    @pytest.mark.parametrize("value", HOSTILE)
    def test_run_argv_and_env_are_data(self, runner, workdir, value):
        import json

        res = runner.run(py(ECHO, value), env={"V": value}, cwd=workdir)
        assert res.ok, res.tail
        assert json.loads(res.stdout) == {"argv": [value], "env": value}
        assert not runner.exists(f"{workdir}/PWNED")

    def test_detached_argv_env_and_paths_are_data(self, runner, workdir):
        import json

        d = f"{workdir}/dir $(touch PWNED); `id` 'q\""
        out = []
        for i, value in enumerate(HOSTILE):
            h = runner.start_detached(py(ECHO, value), f"{d}/{i}", {"V": value}, run_id())
            assert finish(runner, h) == 0, runner.read_file(h.log_path)
            out.append(json.loads(runner.read_file(h.log_path).decode().strip().splitlines()[-1]))
        assert out == [{"argv": [v], "env": v} for v in HOSTILE]
        assert not runner.exists(f"{workdir}/PWNED")
        assert not any(runner.exists(f"{d}/{i}/PWNED") for i in range(len(HOSTILE)))

    def test_file_paths_are_data(self, runner, workdir):
        p = f"{workdir}/name; touch PWNED $(id)"
        runner.write_file(p, b"ok")
        assert runner.read_file(p) == b"ok" and runner.exists(p)
        runner.remove_tree(p)
        assert not runner.exists(p) and not runner.exists(f"{workdir}/PWNED")
