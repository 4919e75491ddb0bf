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
from tunectl.profile import Profile
from tunectl.runners.checks.readiness import Check, run_checks
from tunectl.runners.hosts.base import Runner
from tunectl.store import DEFAULT_ROOT

__all__ = ["check", "render", "run_checks"]


def render(checks: list[Check], title: str = "tunectl check") -> Table:
    table = Table(title=title, show_lines=False)
    for col in ("check", "result", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name, Text("pass", style="green") if c.ok else Text("FAIL", style="bold red"),
                      Text(c.detail), Text(c.fix))
    return table


def _stop_leftovers(prof: Profile, runner: Runner, yes: bool, root: Path) -> None:
    """Stop the servers under host.workdir whose tunectl is gone (their study's lock is free), then remove what
    each left on the host that holds secrets (its `env` file); a live study's servers are never touched."""
    from tunectl.runners.checks.hostcheck import own_leftovers, stop_groups
    from tunectl.store import owner_alive

    groups = {}
    for pgid, h in own_leftovers(runner, prof.host.workdir, prof.server.python or "python3").items():
        alive, study = owner_alive(h.run_id, root)
        if alive is False:
            groups[pgid] = h
        else:
            console.print(Text(f"not touched: process group {pgid}, run {h.run_id}: " + (
                f"study {study} is running" if alive else f"launched from another results folder than {root}")))
    if not groups:
        console.print(Text(f"no leftovers of tunectl runs under {prof.host.workdir} on {runner.name}"))
        return
    for pgid, h in groups.items():
        console.print(Text(f"leftover: process group {pgid}, run {h.run_id} ({h.dir})"))
    if not yes and not typer.confirm(f"stop these {len(groups)} process group(s)?", default=False):
        raise typer.Exit(1)
    with console.status("stopping leftovers ..."):
        lines = stop_groups(runner, groups, prof.server.timeouts.teardown_grace_s)
    for line in lines:
        console.print(Text(line))
    for h in groups.values():
        if not runner.group_processes(h):           # its server is gone: no secrets left behind in clear
            runner.remove_tree(f"{h.dir}/env")


@app.command()
@one_line_errors
def check(profile: Path | None = typer.Option(None, "--profile", "-p", help="profile YAML (default: the "
                                                 "embedded stand-in profile)"),
          stop_leftovers: bool = typer.Option(False, "--stop-leftovers", help="first stop tunectl's own "
                                              "leftover servers under this profile's host.workdir (from a "
                                              "killed run), by their recorded process group"),
          yes: bool = typer.Option(False, "--yes", "-y", help="with --stop-leftovers: do not ask"),
          root: Path = typer.Option(DEFAULT_ROOT, "--results", help="results folder", hidden=True)) -> None:
    """Check the profile's host (each of its `hosts:`): SSH and host key, python and SGLang, GPUs, ports, disk,
    leftovers, flags, patches, backends the GPU has no kernels for."""
    from tunectl.wiring.slots import hosts_of
    from tunectl.store import owner_alive
    from tunectl.wiring.study import backend_check, make_runner

    prof = get_profile(profile)
    specs = hosts_of(prof)
    checks: list[Check] = []
    for spec in specs:
        host_prof = prof if spec is prof.host else prof.model_copy(update={"host": spec})
        runner = make_runner(host_prof)
        try:
            if stop_leftovers:
                _stop_leftovers(host_prof, runner, yes, root)
            found = run_checks(host_prof, runner, owner=lambda run_id: owner_alive(run_id, root))
            if found[0].ok:                                     # the host answered
                found.append(backend_check(host_prof, runner))
        finally:
            runner.close()
        show_table(render(found, "tunectl check" + (f": {runner.name}" if len(specs) > 1 else "")),
                   keep=("check", "result"))
        checks += found
    failed = [c for c in checks if not c.ok]
    if failed:
        console.print(Text(f"{len(failed)} check(s) failed: {', '.join(c.name for c in failed)}", style="red"))
        raise typer.Exit(1)
    console.print(Text(f"all {len(checks)} checks passed", style="green"))
