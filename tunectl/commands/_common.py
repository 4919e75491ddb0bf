"""Shared CLI plumbing: the console, one-line errors, profile loading."""
from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tunectl.errors import Terminated, TunectlError
from tunectl.profile import Profile, default_profile_path, load_profile

# No emoji codes and no markup from data: a study named `study:smile:` or a flag value `[x]` prints as written.
# Piped or captured, lines are not wrapped at COLUMNS (a script reads them whole); at a terminal they fit it.
console = Console(stderr=False, emoji=False)
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
            name = signal.Signals(e.signum).name
            err_console.print(f"[yellow]terminated[/yellow] ({name}): results written so far are kept")
            sys.exit(128 + e.signum)
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/yellow]: results written so far are kept")
            sys.exit(130)
        except Exception as e:        # the file system's and storage's refusals: one line, never a traceback
            from tunectl.commands._oserrors import one_line

            line = one_line(e)
            if line is None:
                raise
            err_console.print(f"[red]error:[/red] {escape(line)}", markup=True, highlight=False, soft_wrap=True)
            sys.exit(1)
        finally:
            _ssh_notes()

    return wrapper  # type: ignore[return-value]


def _ssh_notes() -> None:
    """What the SSH library reported (refused forward channels of a crashed server), in one line on stderr."""
    mod = sys.modules.get("tunectl.runners.hosts._ssh_log")
    line = mod.summary() if mod is not None else None
    if line:
        mod.NOTES.reset()
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def stop_on_terminate() -> None:
    """SIGTERM and SIGHUP stop tunectl as Ctrl-C does (servers torn down, results kept), not mid-trial with a
    server left running on the host. A signal already ignored (nohup) stays ignored; a process forked from this
    one (the client's workers) dies of the signal as it would by default."""
    if threading.current_thread() is not threading.main_thread():    # called in-process by a host program
        return
    main = os.getpid()

    def on_signal(signum: int, _frame: object) -> None:
        if os.getpid() != main:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
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
