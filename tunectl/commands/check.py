"""`tunectl check [--profile P]`: is the profile's host ready? A table of checks, each failure with its fix.

The checks themselves live in tunectl.runners.checks.readiness (`run_checks`), which the study wiring also calls
before a study; this module only renders them.
"""
from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from tunectl.cli import app
from tunectl.commands._common import console, get_profile, one_line_errors, show_table
from tunectl.runners.checks.readiness import Check, run_checks

__all__ = ["check", "render", "run_checks"]


def render(checks: list[Check]) -> Table:
    table = Table(title="tunectl check", show_lines=False)
    for col in ("check", "result", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name, Text("pass", style="green") if c.ok else Text("FAIL", style="bold red"),
                      Text(c.detail), Text(c.fix))
    return table


@app.command()
@one_line_errors
def check(profile: Path | None = typer.Option(None, "--profile", "-p", help="profile YAML (default: the "
                                                 "embedded stand-in profile)")) -> None:
    """Check the profile's host: SSH and host key, python and SGLang, GPUs, ports, disk, leftovers, flags, patches."""
    from tunectl.study import make_runner

    prof = get_profile(profile)
    runner = make_runner(prof)
    try:
        checks = run_checks(prof, runner)
    finally:
        runner.close()
    show_table(render(checks), keep=("check", "result"))
    failed = [c for c in checks if not c.ok]
    if failed:
        console.print(Text(f"{len(failed)} check(s) failed: {', '.join(c.name for c in failed)}", style="red"))
        raise typer.Exit(1)
    console.print(Text(f"all {len(checks)} checks passed", style="green"))
