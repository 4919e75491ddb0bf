"""Shared CLI plumbing: the console, one-line errors, profile loading."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tunectl.errors import TunectlError
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
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/yellow]: results written so far are kept")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


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
