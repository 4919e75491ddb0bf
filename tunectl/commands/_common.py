"""Shared CLI plumbing: the console, one-line errors, profile loading."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from rich.console import Console

from tunectl.errors import TunectlError
from tunectl.profile import Profile, default_profile_path, load_profile

console = Console(stderr=False)
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(fn: F) -> F:
    """Turn TunectlError into one red line on stderr and its exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TunectlError as e:
            err_console.print(f"[red]error:[/red] {e}", markup=True, highlight=False, soft_wrap=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/yellow]: results written so far are kept")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def get_profile(path: Path | None) -> Profile:
    return load_profile(path or default_profile_path())
