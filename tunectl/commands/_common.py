"""Shared CLI plumbing: the console, one-line errors, profile loading."""
from __future__ import annotations

import functools
import os
import select
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Callable, TypeVar

import typer

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tunectl.errors import Terminated, TunectlError
from tunectl.profile import Profile, default_profile_path, load_profile


def _stdout_gone() -> bool:
    """Is stdout a pipe whose reader has gone (not some other broken pipe: an SSH channel, a socket)?"""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):      # no file descriptor (captured by a test): not a pipe
        return False


def _drop_stdout() -> None:
    """Whatever is still printed goes nowhere: the reader of the pipe (`| head`) has gone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """`tunectl trials | head`: the reader closed the pipe. Stop as a Unix tool does on SIGPIPE, quietly, exit
        141, by the path Ctrl-C takes (servers torn down, results kept); rich's own way was a bare exit 1 that could
        stop a search in silence. In another thread (a parallel slot's event) the work goes on, unprinted."""
        self.quiet = True
        _drop_stdout()
        if threading.current_thread() is threading.main_thread():
            raise Terminated(signal.SIGPIPE)


# No emoji codes and no markup from data: a study named `study:smile:` or a flag value `[x]` prints as written.
# Piped or captured, lines are not wrapped at COLUMNS (a script reads them whole); at a terminal they fit it.
console = _Console(stderr=False, emoji=False)
err_console = Console(stderr=True, emoji=False)
console.soft_wrap, err_console.soft_wrap = not console.is_terminal, not err_console.is_terminal
F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(fn: F) -> F:
    """Turn TunectlError into one red line on stderr and its exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TunectlError as e:
            err_console.print(f"[red]error:[/red] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True)
            sys.exit(e.exit_code)
        except Terminated as e:
            _stop_listening()
            if e.signum == signal.SIGPIPE:      # nobody reads stdout any more: nothing to say, as `git log | head`
                sys.exit(128 + e.signum)
            name = signal.Signals(e.signum).name
            err_console.print(f"[yellow]terminated[/yellow] ({name}): results written so far are kept")
            sys.exit(128 + e.signum)
        except KeyboardInterrupt:
            _stop_listening()
            err_console.print("[yellow]interrupted[/yellow]: results written so far are kept")
            sys.exit(130)
        except Exception as e:        # the file system's and storage's refusals: one line, never a traceback
            from tunectl.commands._oserrors import one_line

            if isinstance(e, BrokenPipeError) and _stdout_gone():    # print() into a closed pipe: as _Console
                _drop_stdout()
                sys.exit(128 + signal.SIGPIPE)
            line = one_line(e)
            if line is None:
                raise
            err_console.print(f"[red]error:[/red] {escape(line)}", markup=True, highlight=False, soft_wrap=True)
            sys.exit(1)
        finally:
            _ssh_notes()

    return wrapper  # type: ignore[return-value]


def _stop_listening() -> None:
    """Stopping already (servers down, results kept): a further Ctrl-C or SIGTERM while the last line prints would
    end in a traceback instead of it."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


def _ssh_notes() -> None:
    """What the SSH library reported (refused forward channels of a crashed server), in one line on stderr."""
    mod = sys.modules.get("tunectl.runners.hosts._ssh_log")
    line = mod.summary() if mod is not None else None
    if line:
        mod.NOTES.reset()
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def stop_on_terminate() -> None:
    """SIGTERM and SIGHUP stop tunectl as Ctrl-C does (servers torn down, results kept), not mid-trial with a
    server left running on the host. The first of these signals (Ctrl-C included) starts the stop; the ones after
    it are ignored until tunectl has exited, so pressing Ctrl-C again (or `timeout -s INT`, which signals tunectl
    and then its whole process group) cannot break a teardown off and leave a server on the GPUs (SIGQUIT,
    Ctrl-\\, still ends tunectl at once). A signal already ignored (nohup) stays ignored; a process forked from this
    one (the client's workers) dies of the signal as it would by default."""
    if threading.current_thread() is not threading.main_thread():    # called in-process by a host program
        return
    main = os.getpid()
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def on_signal(signum: int, _frame: object) -> None:
        if os.getpid() != main:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for sig in stops:                   # stopping now: the next ones wait for nothing
            if signal.getsignal(sig) is on_signal:
                signal.signal(sig, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    for sig in stops:
        if signal.getsignal(sig) is (signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL):
            signal.signal(sig, on_signal)


def show_table(tab: Table, keep: tuple[str, ...] = (), out: Console | None = None) -> None:
    """Print a table whole. Piped (no terminal to fit): at its natural width, whatever COLUMNS says. At a
    terminal: the `keep` columns (names) and right-aligned ones (numbers) never wrap or get cut; others fold."""
    out = out or console
    for col in tab.columns:
        if str(col.header) in keep or col.justify == "right":
            widths = [out.measure(cell, options=out.options.update(max_width=100_000)).maximum for cell in col.cells]
            col.no_wrap, col.min_width = True, max([*widths, len(str(col.header)), col.min_width or 0])
    if out.is_terminal:
        out.print(tab)
        return
    width = out.width
    out.width = max(width, out.measure(tab, options=out.options.update(max_width=100_000)).maximum)
    try:
        out.print(tab)
    finally:
        out.width = width


def get_profile(path: Path | None) -> Profile:
    return load_profile(path or default_profile_path())


# the options every results command takes (here, not in results.py: a command module imported first registers the
# others through tunectl.cli, before its own names exist)
StudyOpt = Annotated[str | None, typer.Option(
    "--study", "-s", help="study name under results/ (default: the most recent)")]
RootOpt = Annotated[Path, typer.Option("--results", help="results folder", hidden=True)]
