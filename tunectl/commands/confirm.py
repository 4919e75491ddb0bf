"""`tunectl confirm`: the winner against SGLang's own choice (or the study's baseline) on fresh launches of one
machine, interleaved W B B W W B, each level and the objective judged in pairs (tunectl/confirm.py).

Every launch is a trial of results/<study>-confirm (role confirm-winner or confirm-baseline); the same command
again continues where an interrupted one stopped, and `--launches` more extends it. A crash is a finding: shown as
it happens and counted in the verdict line (the launch's stable levels still count, as the search scores it); an
infra fault stops with exit 1, the launches so far kept.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tunectl import confirm as cf
from tunectl import redact
from tunectl.cli import app
from tunectl.commands._common import (RootOpt, StudyOpt, console, err_console, get_profile, one_line_errors,
                                      show_table)
from tunectl.commands import sweep as _sweep     # the module: importing sweep first registers confirm mid-way
from tunectl.errors import UsageError
from tunectl.models import TrialResult
from tunectl.profile import Profile
from tunectl.stats import Interval
from tunectl.store import DEFAULT_ROOT, StudyStore, atomic_write, check_name, list_studies

AGAINST = ("default", "baseline")
DONE = ("ok", "crashed")            # a launch that measured (or found a crash); infra and interrupted ones are redone


def _against_label(against: str) -> str:
    return "SGLang's own choice" if against == "default" else "the study's baseline"


def _winner(prof: Profile, study: str | None, sets: list[str], root: Path) -> tuple[dict[str, Any], str | None,
                                                                                    StudyStore | None]:
    """The config to confirm: `--set` flags, else the study's best (as `tunectl best` names it)."""
    if sets:
        if study is not None:
            raise UsageError("--set and --study: give one: the flags to confirm, or the study whose winner to confirm")
        return _sweep.parse_sets(prof, sets), None, None
    from tunectl.reports.data import load_study, summary

    from tunectl.commands.results import _store

    store = _store(study, root)
    recorded = (store.read_study().get("profile") or {}).get("name")
    if recorded and recorded != prof.name:
        raise UsageError(f"--profile: {prof.source or 'the embedded default'}: profile {prof.name!r}, but study "
                         f"{store.name} ran profile {recorded!r}; give that profile with -p")
    best = summary(load_study(store))["best"]
    if best is None:
        raise UsageError(f"{store.name}: no stable configuration yet (run `tunectl search` first)")
    return dict(best["params"]), store.name, store


def _baseline(against: str, store: StudyStore | None) -> dict[str, Any]:
    if against not in AGAINST:
        raise UsageError(f"--against: {against!r}: must be one of {', '.join(AGAINST)} (default: SGLang's own "
                         "choice for every searched flag, the profile's base flags kept; baseline: the study's "
                         "baseline trial)")
    if against == "default":
        return {}
    if store is None:
        raise UsageError("--against baseline: needs --study (the study whose baseline trial to run)")
    base = next((t for t in sorted(store.trials(), key=lambda t: t.trial) if t.role == "baseline"), None)
    if base is None:
        raise UsageError(f"--against baseline: {store.name} has no baseline trial; use --against default")
    return dict(base.params)


def _flags(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "(no --set: SGLang chooses every searched flag)"


def table(rows: list[cf.Row], against: str) -> Table:
    tab = Table(title=f"the winner against {_against_label(against)}, judged in pairs of launches")
    for col in ("level", "winner (95%)", "baseline (95%)", "pooled gain", "paired gain (pairs)", "verdict"):
        tab.add_column(col, justify="left" if col in ("level", "verdict") else "right")

    def iv(v: Interval | None, fmt: str | None = None) -> str:
        """A reading (throughput: no decimals; a small objective, a capacity in req/s: three) or a gain."""
        return "-" if v is None else v.text(fmt or (",.0f" if abs(v.value) >= 100 else ",.3f"))

    for r in rows:
        missing = [f"{n} {k} launch{'es' if n > 1 else ''} not measured" for k, n in r.missing.items() if n]
        miss = f" ({', '.join(missing)})" if missing else ""
        tab.add_row(r.label, iv(r.winner), iv(r.baseline), iv(r.pooled_gain, ".3f"),
                    "-" if r.paired is None else f"{r.paired.text('.3f')} ({r.paired.n})", r.verdict + miss)
    return tab


@app.command()
@one_line_errors
def confirm(study: StudyOpt = None,
            set_: Annotated[list[str], typer.Option("--set", help="NAME=VALUE: confirm these flags instead of a "
                                                     "study's winner (a search knob or SGLang flag, no dashes)")] = [],
            against: Annotated[str, typer.Option("--against", help="default: SGLang's own choice (the profile's "
                                                 "base flags, no searched flag set) | baseline: the study's "
                                                 "baseline trial")] = "default",
            launches: Annotated[int, typer.Option("--launches", "-n", help="fresh launches of each side "
                                                  "(interleaved W B B W ...; 3 or more for a verdict you can "
                                                  "bet on)")] = 3,
            concurrency: Annotated[str | None, typer.Option("--concurrency", "-c", help="levels, e.g. 16,64,256 "
                                                            "(default: the profile's)")] = None,
            profile: Annotated[Path | None, typer.Option("--profile", "-p", help="the study's profile YAML "
                                                         "(default: embedded)")] = None,
            client: Annotated[str | None, typer.Option("--client", help="builtin or bench_serving (the real "
                                                       "sglang.bench_serving) for every workload (default: the "
                                                       "profile's)")] = None,
            name: Annotated[str | None, typer.Option("--name", help="results/<name> for the launches "
                                                     "(default: <study>-confirm)")] = None,
            as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
            dry_run: Annotated[bool, typer.Option("--dry-run", help="print the two configs and the launch order, "
                                                  "start nothing")] = False,
            root: RootOpt = DEFAULT_ROOT) -> None:
    """The winner against SGLang's own choice on fresh launches of one machine, interleaved and judged in pairs
    (the same command again continues an interrupted one)."""
    prof = get_profile(profile)
    if prof.host.kind == "slurm":
        raise UsageError(f"{prof.source or prof.name}: host.kind: slurm: confirm runs on one machine (host.kind local "
                         "or ssh): its launches are compared in pairs, so they must share the GPUs")
    if launches < 1:
        raise UsageError(f"--launches: {launches}: expected 1 or more launches of each side (3 or more for a verdict)")
    levels = _sweep.parse_levels(concurrency)
    if client is not None:
        prof = _sweep.with_clients(prof, client)
    winner, of, store = _winner(prof, study, set_, root)
    base = _baseline(against, store)
    run_confirm(prof, winner, of, base, against, launches, levels, name, root, as_json, dry_run)


def run_confirm(prof: Profile, winner: dict[str, Any], of: str | None, base: dict[str, Any], against: str,
                launches: int, levels: list[int] | None, name: str | None, root: Path, as_json: bool,
                dry_run: bool = False, emit: bool = True) -> dict[str, Any] | None:
    """The confirmation's launches (those not yet measured under results/<name>), its table and verdict line
    (printed unless `as_json`, which prints the document), confirm.json written; the document, or None on a dry run.
    Also what `tunectl search --confirm N` runs after its race (`emit` False: the document is the caller's to print)."""
    if same_launch(prof, winner, base):
        raise UsageError(f"{of or '--set'}: the config to confirm launches as {_against_label(against)} does "
                         f"({_flags(winner)}): nothing to compare")
    given = name
    name = name or (f"{of}-confirm" if of else time.strftime("confirm-%Y%m%d-%H%M%S"))
    check_name(name, "--name" if given else "--study")
    out = StudyStore(name, root)
    info = {"kind": "confirm", "of": of, "winner": winner, "against": against, "baseline": base,
            "launches": launches}
    if name in list_studies(root) and out.trial_numbers():
        had = out.read_study()
        if had.get("kind") != "confirm" or had.get("winner") != winner or had.get("baseline") != base:
            raise UsageError(f"--name: results/{name} holds other launches (a {had.get('kind', 'search')} of "
                             f"{_flags(had.get('winner') or had.get('params') or {})}); give another --name")
    runs = sorted((t for t in out.trials() if t.status in DONE and cf.side(t)), key=lambda t: t.trial)
    plan = cf.order(launches)
    done = [cf.side(t) for t in runs]
    todo = plan[len(done):] if done == plan[:len(done)] else _rest(plan, done)
    params = {"winner": winner, "baseline": base}
    if dry_run and as_json:                   # what the launches would be, as the one document --json promises
        print(json.dumps({"study": name, "of": of, "against": against, "winner": winner, "baseline": base,
                          "order": plan, "measured": len(done), "to_run": todo, "dry_run": True},
                         indent=2, default=str))
        return None
    if dry_run:
        console.print(f"[bold]winner[/] ({of + ' best' if of else '--set'}): {_flags(winner)}", highlight=False)
        console.print(f"[bold]baseline[/] ({_against_label(against)}): {_flags(base)}", highlight=False)
        console.print(f"order: {' '.join(s[0].upper() for s in plan)} ({len(done)} measured, {len(todo)} to run) "
                      f"-> results/{name}", highlight=False)
        return None
    walls: list[float] = []                   # this run's launches: what the ones left will take, as a hint
    for i, who in enumerate(todo, len(done) + 1):
        if not as_json:
            left = (f"; about {_minutes(sum(walls) / len(walls) * (len(plan) - i + 1))} left with this one"
                    if walls else "")
            console.print(f"[bold]launch {i} of {len(plan)}: {who}[/] "
                          f"({_flags(params[who]) if who == 'winner' else _against_label(against)}){left}",
                          highlight=False)
        result, _ = _sweep._run(prof, params[who], (levels, [] if levels else None, False), name, root, as_json,
                         role=cf.ROLE[who], info={**info, "profile": redact.profile(prof)})
        if result.status == "infra":
            c = result.crash
            err_console.print(f"[red]error:[/red] launch {i} ({who}): not the configuration's fault: "
                              f"{(c.exception_line or c.message) if c else 'infra fault'}; the {len(runs)} launches "
                              "so far are kept and the same command continues", highlight=False, soft_wrap=True)
            sys.exit(1)
        runs.append(result)
        if result.wall_s:
            walls.append(result.wall_s)
        if not as_json:
            _launch_line(result, who)
    rows = cf.judge(runs, prof)
    machines = sorted({t.machine for t in runs if t.machine})
    doc = {"study": name, "of": of, "against": against, "winner": winner, "baseline": base,
           "order": [cf.side(t) for t in runs], "trials": [t.trial for t in runs], "machines": machines,
           "pairs": len(cf.pairs(runs)), "rows": [r.to_dict() for r in rows],
           "crashed": {k: v[0] for k, v in cf.crashes(runs).items()},
           "conclusion": cf.conclusion(rows, _against_label(against), cf.crashes(runs)),
           "resolution": cf.resolution(rows, f"tunectl confirm --study {of}" if of else None),
           "finished_at": time.time()}
    atomic_write(out.dir / "confirm.json", json.dumps(doc, indent=2, default=str))
    if as_json:
        if emit:
            print(json.dumps(doc, indent=2, default=str))
        return doc
    show_table(table(rows, against), keep=("level", "verdict"))
    if len(machines) > 1:
        console.print(f"[yellow]the launches ran on {len(machines)} machines: only launches next to each other on "
                      "one machine are paired[/]", highlight=False)
    if line := cf.noise_line(rows):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"[bold]{doc['conclusion']}[/]", highlight=False, soft_wrap=True)
    if doc["resolution"]:
        console.print(doc["resolution"], highlight=False, markup=False, soft_wrap=True)
    console.print(f"results: {out.dir} (confirm.json, one trial per launch)", highlight=False, markup=False,
                  soft_wrap=True)
    return doc


def same_launch(prof: Profile, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two configs launch the same server: the same command, environment and patches (a winner that spells
    out the profile's base values is the baseline)."""
    from tunectl.runners.server import plan as plan_mod

    def launch(params: dict[str, Any]) -> tuple[Any, ...]:
        p = plan_mod.build_plan(prof, params, "same", f"{prof.host.workdir}/same")
        return p.argv, sorted(p.env.items()), sorted(p.patches)

    return a == b or launch(a) == launch(b)


def _rest(plan: list[str], done: list[str]) -> list[str]:
    """What is left of the plan when the launches so far do not follow it (an earlier --launches): each side up to
    its count, in the plan's order."""
    left = {s: plan.count(s) - done.count(s) for s in cf.SIDES}
    out = []
    for s in plan:
        if left[s] > 0:
            out.append(s)
            left[s] -= 1
    return out


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _launch_line(t: TrialResult, who: str) -> None:
    if t.crash is not None:
        at = "startup" if t.crash.level is None else f"c={t.crash.level}"
        console.print(f"  {who}: [red]crashed[/] @{at}: {t.crash.cls} {t.crash.signature or ''}", highlight=False)
    else:
        best = max((lv.output_throughput for lv in t.levels if lv.status == "ok"), default=0.0)
        console.print(f"  {who}: {t.status}, best level {best:,.0f} tok/s, wall {t.wall_s:.0f} s", highlight=False)
