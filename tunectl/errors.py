"""The small error hierarchy. Each error renders as one line for the CLI (`str(err)`)."""
from __future__ import annotations


class TunectlError(Exception):
    """Base class. The CLI prints `str(err)` on one line and exits with `exit_code`."""

    exit_code = 1


class ProfileError(TunectlError):
    """A profile (or a --set override) is invalid: names file, field, value and valid choices."""

    exit_code = 2

    def __init__(self, file: str, field: str, value: object, problem: str, line: int | None = None):
        self.file, self.field, self.value, self.problem, self.line = file, field, value, problem, line
        where = f"{file}:{line}" if line else file
        if field.startswith("("):          # the file itself ((yaml), (file), (top level)): no field, no value
            super().__init__(f"{where}: {problem}")
        elif value is None:                # a missing key or an empty value: nothing to quote
            super().__init__(f"{where}: {field}: {problem}")
        else:
            super().__init__(f"{where}: {field}: {value!r}: {problem}")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a job scheduler's stop, `timeout`, a closed terminal): handled as Ctrl-C is, so the
    server is torn down by its process group and the results so far are kept; the exit code is 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class UsageError(TunectlError):
    exit_code = 2


class RunnerError(TunectlError):
    """A command on a host failed. Carries evidence like invoke's UnexpectedExit."""

    def __init__(self, message: str, command: list[str] | None = None, exit_code: int | None = None,
                 tail: str = ""):
        self.command, self.exit_status, self.tail = command, exit_code, tail
        extra = f" (exit {exit_code})" if exit_code is not None else ""
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        super().__init__(f"{message}{extra}" + (f": {last}" if last else ""))


class InfraError(TunectlError):
    """Not the config's fault: SSH link lost, host unreachable, disk full. The trial is retried."""


class HostDirtyError(InfraError):
    """The host still holds GPU memory, ports or processes of ours: never launch on top."""

    def __init__(self, message: str, evidence: list[str] | None = None):
        self.evidence = evidence or []
        super().__init__(message + ("; " + "; ".join(self.evidence[:5]) if self.evidence else ""))


class HostKeyError(TunectlError):
    """Unknown or changed SSH host key. Never retried."""

    exit_code = 3
