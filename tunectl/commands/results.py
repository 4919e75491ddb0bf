"""Commands around results: report, trials, best, diff, export. They read results/ and never run anything."""
from __future__ import annotations

import json
import os
import time
import warnings
import webbrowser
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tunectl.cli import app
from tunectl.commands._common import RootOpt, StudyOpt, console, err_console, one_line_errors, show_table
from tunectl.errors import UsageError
from tunectl.store import (DEFAULT_ROOT, RecordError, StudyStore, atomic_write, default_study, list_studies,
                           study_kind)

FormatOpt = Annotated[str, typer.Option("--format", "-f", help="command | yaml | json")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="where to write")]
RefOpt = Annotated[Path | None, typer.Option(
    "--reference", help="a profile with a reference: block to draw as the reference line, e.g. "
                        "profiles/k2-thinking-reference.yaml (default: the study's own profile's, if any)")]
OpenOpt = Annotated[bool, typer.Option("--open", help="open the report in a browser")]


def _store(study: str | None, root: Path) -> StudyStore:
    names = list_studies(root)
    if study is None:
        name = default_study(root)
        if name is None:
            raise UsageError(f"{root}: no studies yet (run `tunectl search` or `tunectl sweep` first)")
        err_console.print(f"study: {name} (the latest {study_kind(root, name)}; --study NAME picks another, "
                          "`tunectl studies` lists them)", highlight=False, markup=False, soft_wrap=True)
        return warn_unreadable(StudyStore(name, root))
    if study not in names:
        valid = ", ".join(names) or "none"
        raise UsageError(f"--study: {study!r}: no such study under {root}; valid: {valid}")
    return warn_unreadable(StudyStore(study, root))


def _on_slurm(study: dict[str, Any]) -> bool:
    """A study whose trials ran as Slurm jobs (`tunectl confirm` needs one machine: it is not suggested there)."""
    return ((study.get("profile") or {}).get("host") or {}).get("kind") == "slurm"


def warn_unreadable(store: StudyStore) -> StudyStore:
    """A trial record that cannot be read is named on stderr (and left out), never skipped without a word."""
    for path, why in store.unreadable():
        what = ("not a launch record ({}); its trial.json's copy is used" if path.name == "launch.json" else
                "not a trial record ({}); left out")
        err_console.print(f"warning: {path}: {what.format(why)}", highlight=False, markup=False, soft_wrap=True)
    return store


@app.command()
@one_line_errors
def studies(root: RootOpt = DEFAULT_ROOT) -> None:
    """The studies and sweeps under results/, oldest first; the default one (the latest search) is marked."""
    names = list_studies(root)
    if not names:                          # an empty list is an answer, not an error (exit 0)
        err_console.print(f"{root}: no studies yet (run `tunectl search` or `tunectl sweep` first)",
                          highlight=False, markup=False, soft_wrap=True)
        return
    from tunectl.reports.data import load_study, winner_number

    default = default_study(root)
    tab = Table(title=f"{root}: {len(names)} studies")
    for col in ("study", "kind", "SGLang", "trials", "best", "updated"):
        tab.add_column(col, justify="right" if col in ("trials", "best") else "left", overflow="fold")
    for name in names:
        store = warn_unreadable(StudyStore(name, root))      # its trial count leaves them out: say which
        try:
            data = load_study(store)
        except RecordError as e:             # one damaged study: named, the others still listed
            err_console.print(f"warning: {e}", highlight=False, markup=False, soft_wrap=True)
            tab.add_row(escape(name) + (" (default)" if name == default else ""), study_kind(root, name), "?",
                        "?", "?", "?")
            continue
        number = winner_number(data)           # the winner's one number: the study's objective, confirmed
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime((store.dir / "study.json").stat().st_mtime))
        tab.add_row(escape(name) + (" (default)" if name == default else ""), study_kind(root, name),
                    escape(_setup(store)), str(len(data.trials)),
                    "-" if number is None else f"{number['value']:,.1f} {number['unit']}", stamp)
    show_table(tab, keep=("study", "kind", "updated"))


def _setup(store: StudyStore) -> str:
    """The SGLang version and patches a study ran with, and the study it was warm-started from."""
    info = store.read_study()
    ident = info.get("identity") or {}
    version = ident.get("sglang_version") or (info.get("profile") or {}).get("server", {}).get("sglang_version", "?")
    patches = f" +{len(ident['patches'])} patch(es)" if ident.get("patches") else ""
    warm = ((store.read_best() or {}).get("warm_start") or {}).get("from")
    return f"{version}{patches}" + (f" (warm from {warm})" if warm else "")


def _reference(path: Path | None) -> dict[str, Any] | None:
    from tunectl.reports.compare import profile_side

    if path is None:
        return None
    side = profile_side(path)
    return {**side["results"], "label": side.get("note") or side["label"], "flags": side["flags"]}


@app.command()
@one_line_errors
def report(study: StudyOpt = None, out: OutOpt = None, reference: RefOpt = None, open_: OpenOpt = False,
           root: RootOpt = DEFAULT_ROOT) -> None:
    """Write one self-contained HTML report (works offline)."""
    from tunectl.reports.data import load_study
    from tunectl.reports.render import compute, render

    store = _store(study, root)
    ref = _reference(reference)
    data = load_study(store, ref)
    path = out or store.dir / "report.html"
    prefix = os.path.relpath(store.dir.resolve(), path.parent.resolve())
    with warnings.catch_warnings():      # Optuna's notes on few trials per regime: not the user's to act on
        warnings.simplefilter("ignore", UserWarning)
        r = compute(data, log_prefix="" if prefix == "." else prefix + "/")
    if r["summary"]["best"] is not None:                 # `tunectl confirm`'s verdict on this winner, if one ran
        from tunectl.confirm import noise_line, recorded, resolution

        conf = recorded(store.root, store.name, dict(r["summary"]["best"]["params"]))
        if conf is not None:
            conf["noise_line"] = noise_line(conf.get("rows") or [])
            conf["resolution"] = resolution(conf.get("rows") or [], f"tunectl confirm --study {store.name}")
        r["summary"]["confirmation"] = conf
        r["summary"]["slurm"] = _on_slurm(data.study)
    page = render(r)
    atomic_write(path, page)
    console.print(f"report: {path} ({len(data.trials)} trials, {len(page) // 1024} KiB)")
    if open_ and not webbrowser.open(path.resolve().as_uri()):
        err_console.print(f"--open: no browser found here; open {path.resolve()} by hand (or copy it to a machine "
                          "with one: the page works offline)", highlight=False, markup=False, soft_wrap=True)


DIGITS = {"j_per_token": 3, "usd_per_mtok": 2}      # energy and cost columns of `trials`


@app.command()
@one_line_errors
def trials(study: StudyOpt = None, root: RootOpt = DEFAULT_ROOT) -> None:
    """Table of all trials of a study."""
    from tunectl.reports.data import fmt_params, load_study
    from tunectl.reports.tables import several_machines, trial_rows, workload_columns

    store = _store(study, root)
    rows = trial_rows(load_study(store))
    mach = ["machine"] if several_machines(rows) else []     # a study resumed on other GPUs: whose reading is whose
    labels = workload_columns(rows)           # several workloads: each one's best stable tok/s
    tab = Table(title=f"{store.name}: {len(rows)} trials")
    cap = ["capacity"] if any(r["capacity"] for r in rows) else []     # goodput studies, sweep --capacity
    per_tok = [(k, h) for k, h in (("w_per_gpu", "W/GPU"), ("j_per_token", "J/tok"), ("usd_per_mtok", "$/Mtok"))
               if any(r.get(k) is not None for r in rows)]                 # energy and cost at the peak level
    for col in ("#", "role", "status", "key flags (vs baseline)", "tok/s", "confirmed", *cap, *labels, "at c",
                *(h for _, h in per_tok), "max stable c", *mach, "crash"):
        tab.add_column(col, justify="left" if col in ("role", "status", "key flags (vs baseline)", "crash") else
                       "right", overflow="fold")
    style = {"ok": "green", "crashed": "red", "pruned": "dim", "infra": "yellow", "running": "cyan",
             "interrupted": "yellow"}
    for r in rows:
        flags = fmt_params(r["key_flags"]) or "(as baseline)"
        flags = "(baseline)" if r["role"] == "baseline" else flags
        where = "startup" if r["crashed_at"] is None else f"c={r['crashed_at']}"
        crash = f"{r['crash_class']} @{where}" if r["crash_class"] else ""
        tab.add_row(str(r["trial"]), r["role"], Text(r["status"], style=style.get(r["status"], "")), escape(flags),
                    f"{r['output_throughput']:,.0f}", "-" if r["confirmed"] is None else f"{r['confirmed']:,.1f}",
                    *([r["capacity"] or "-"] if cap else []),
                    *(f"{r['per_workload'].get(w, 0.0):,.0f}" for w in labels),
                    str(r["peak_concurrency"] or "-"),
                    *("-" if r[k] is None else f"{r[k]:,.{DIGITS.get(k, 0)}f}" for k, _ in per_tok),
                    str(r["max_stable_concurrency"]), *([r["machine"] or "-"] if mach else []), escape(crash))
    show_table(tab, keep=("role", "status"))


@app.command()
@one_line_errors
def best(study: StudyOpt = None, format: FormatOpt = "command", root: RootOpt = DEFAULT_ROOT) -> None:
    """The best stable config: its launch command (environment and patches included), SGLang --config YAML, or
    JSON; with its one number (mean of its runs, spread, gain over the baseline)."""
    from tunectl.confirm import noise_line, recorded, resolution
    from tunectl.reports.data import headline, load_study, summary, unfinished

    if format not in ("command", "yaml", "json"):
        raise UsageError(f"--format: {format!r}: must be one of command, yaml, json")
    store = _store(study, root)
    data = load_study(store)
    s = summary(data)["best"]
    if s is None:
        raise UsageError(f"{store.name}: no stable configuration yet")
    conf = recorded(store.root, store.name, dict(s["params"]))
    if format == "command":
        if not s["command"]:
            raise UsageError(f"{store.name}: trial {s['trial']} has no launch.json")
        cap = f"; SLA capacity {s['capacity']}" if s.get("capacity") else ""
        print(f"# {store.name}: trial {s['trial']}, {headline(s['confirmed'])}{cap}")
        if unfinished(data):
            print(f"# {unfinished(data)}")
        if conf is not None:
            print(f"# tunectl confirm (results/{conf['study']}): {conf['conclusion']}")
            if line := noise_line(conf.get("rows") or []):
                print(f"# {line}")
            if line := resolution(conf.get("rows") or [], f"tunectl confirm --study {store.name}"):
                print(f"# {line}")
        elif data.study.get("kind", "search") == "search" and not _on_slurm(data.study):
            print(f"# not yet confirmed against SGLang's own choice on fresh launches: `tunectl confirm --study "
                  f"{store.name}`")
        print(s["command"])
    elif format == "yaml":
        cfg = store.trial_dir(s["trial"]) / "config.yaml"
        config = data.launches.get(s["trial"], {}).get("config") or {}
        print(cfg.read_text() if cfg.is_file() else yaml.safe_dump(config, sort_keys=False), end="")
    else:
        launch = data.launches.get(s["trial"], {})
        print(json.dumps({"study": store.name, **s, "finished": unfinished(data) is None, "config": launch.get("config"),
                          "confirmation": conf},
                         indent=2, default=str))


@app.command()
@one_line_errors
def diff(a: Annotated[str, typer.Argument(help="study:trial, a study (its best), or a profile .yaml")],
         b: Annotated[str, typer.Argument(help="the same kinds as A")],
         all_: Annotated[bool, typer.Option("--all", help="show equal flags too")] = False,
         root: RootOpt = DEFAULT_ROOT) -> None:
    """Flags and results of two configurations side by side."""
    from tunectl.reports.compare import diff as compute_diff
    from tunectl.reports.compare import resolve_side

    sa, sb = resolve_side(a, root), resolve_side(b, root)
    d = compute_diff(sa, sb)
    for section, rows in d.items():
        shown = rows if all_ or section == "results" else [r for r in rows if not r["same"]]
        if not shown:
            continue
        tab = Table(title=section)
        for col in ("", sa["label"], sb["label"]):
            tab.add_column(col, overflow="fold")
        for r in shown:
            mark = "" if r["same"] else "[bold yellow]"
            tab.add_row(f"{mark}{escape(r['key'])}", _cell(r["a"]), _cell(r["b"]))
        show_table(tab, keep=("",))
    same = sum(r["same"] for r in d["flags"])
    console.print(f"{len(d['flags']) - same} flag(s) differ, {same} equal")


def _cell(v: Any) -> str:
    from tunectl.reports.data import fmt_cell

    return "-" if v is None else fmt_cell(v)


@app.command()
@one_line_errors
def export(study: StudyOpt = None,
           format: Annotated[str, typer.Option("--format", "-f", help="csv | parquet")] = "csv",
           out: Annotated[Path | None, typer.Option("--out", "-o", help="output folder (default: "
                                                     "results/<study>/)")] = None,
           root: RootOpt = DEFAULT_ROOT) -> None:
    """Tidy tables (trials, levels, crashes) as CSV or Parquet."""
    from tunectl.reports import export as exp
    from tunectl.reports.data import load_study

    if format not in exp.FORMATS:
        raise UsageError(f"--format: {format!r}: must be one of {', '.join(exp.FORMATS)}")
    store = _store(study, root)
    for p in exp.write(load_study(store), out or store.dir, format):
        console.print(str(p))
