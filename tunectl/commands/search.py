"""`tunectl search`: the main job. A crash-aware Optuna study over the profile's search space."""
from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tunectl.cli import app
from tunectl.commands._common import console, err_console, get_profile, one_line_errors, show_table
from tunectl.commands._levels import progress_text
from tunectl.errors import UsageError
from tunectl.models import ladder_steps
from tunectl.profile import Profile
from tunectl.reports.data import fmt_reading, unit
from tunectl.store import DEFAULT_ROOT


class Progress:
    """The live view: every trial in flight (its slot, config and level), trials done of N, best so far, ETA.
    Fed by run_search's events, from the coordinator's thread and from each slot's thread (hence the lock)."""

    def __init__(self, total: int, what: str = "output tok/s"):
        self.total, self.started = total, time.monotonic()
        self.what = what                        # the objective's unit: each trial's value and the best read in it
        self.done = 0
        self.running: dict[Any, dict[str, Any]] = {}     # trial -> role, slot, params, level
        self.best: float | None = None
        self.note = ""
        self.lock = threading.Lock()
        self.live = Live(self.render(), console=console, refresh_per_second=4, transient=True)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        with self.lock:
            self._on_event(kind, data)
            self.live.update(self.render())

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "trial_start":
            self.running[data["n"]] = {"role": data["role"], "params": data["params"], "level": "starting",
                                       "slot": _slot_name(data.get("slot"))}
            self.done = max(self.done, data.get("done", 0))
        elif kind == "trial_end":
            self.running.pop(data["n"], None)
            self.best = data.get("best")
            self.done += data["role"] in ("search", "baseline")
            last = f"trial {data['n']}: {data['reason']}" + (
                f", {fmt_reading(data['values'][0])} {self.what}" if data.get("values") else "")
            console.print(Text(f"  {last}", style="red" if not data.get("feasible") else ""))
        elif kind == "machine_changed":
            before = "; ".join(f"{m}: {_trial_span(ns)}" for m, ns in data["before"].items())
            console.print(Text(f"  trial {data['n']} ran on {data['machine']}, the study's earlier trials on "
                               f"{before}: readings from different machines are compared (two cards of one "
                               "model can differ by 20%)", style="yellow"))
        elif kind == "baseline_chose" and data["chose"]:
            console.print(chose_line(data["chose"]), highlight=False, markup=False)
        elif kind == "resume" and data["mode"] != "new":
            console.print(resume_line(data), highlight=False)
        elif kind == "prior":
            console.print(f"  prior knowledge: {data['trials']} trials of study {escape(data['from'])} (not counted "
                          "as results)", highlight=False)
        elif kind == "slot_retired":
            name = _slot_name(data["slot"])
            console.print(Text(f"  {'slot ' + name if name else 'the host'} takes no more trials: {data['reason']}",
                               style="yellow"))
        elif kind == "parallel_capped":
            console.print(parallel_line(data), highlight=False, markup=False)
        elif kind == "finalists" and data.get("baseline"):
            self.note = f"the baseline (trial {data['picks'][0]}) on {data['reruns']} fresh launch(es) for the gain"
        elif kind == "finalists":
            self.note = (f"racing finalists {data['picks']} ({data['reruns']} rerun(s) this round, leader "
                         f"{data.get('leader')})")
        elif data.get("n") in self.running:
            self.running[data["n"]]["level"] = _level_text(data) or self.running[data["n"]]["level"]

    def render(self) -> Table:
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * max(0, self.total - self.done) if self.done else None
        t = Table.grid(padding=(0, 2))
        t.add_row("trials", f"{min(self.done, self.total)}/{self.total} done, {len(self.running)} running"
                  + (f"; {self.note}" if self.note else ""))
        for n, r in sorted(self.running.items()):
            where = f" on {r['slot']}" if r["slot"] else ""
            t.add_row(f"trial {n}", f"({r['role']}){where}  {r['level']}")
            t.add_row("", " ".join(f"{k}={v}" for k, v in r["params"].items()) or "-")
        t.add_row("best", f"{fmt_reading(self.best)} {self.what}" if self.best else "-")
        t.add_row("time", f"{elapsed:.0f}s elapsed" + (f", ETA {eta:.0f}s" if eta is not None else ""))
        return t


def _trial_span(ns: list[int]) -> str:
    """[0, 1, 2, 5] -> "trials 0-2, 5"."""
    runs: list[list[int]] = []
    for n in sorted(ns):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return ("trial " if len(ns) == 1 else "trials ") + ", ".join(parts)


def _slot_name(key: Any) -> str:
    """`local:gpus=0,1` -> `local gpus 0,1` (empty for the plain one-slot case)."""
    text = str(key or "")
    return ("" if not text or text.endswith("gpus=all") or text.startswith("virtual")
            else text.replace(":gpus=", " gpus "))


def _level_text(data: dict[str, Any]) -> str:
    if isinstance(data.get("level"), dict):
        lv = data["level"]
        thr = lv.get("metrics", {}).get("output_throughput", 0.0)
        load = f"{lv['request_rate']:.3g} req/s" if lv.get("request_rate") is not None else f"c={lv['concurrency']}"
        return f"{load} {lv['status']} {thr:,.0f} tok/s"
    if "concurrency" in data:
        return f"c={data['concurrency']} running"
    if "compilers" in data:
        return progress_text("compiling", data) or ""
    if "job_id" in data and "pending_s" in data:        # a Slurm job (docs/slurm.md): queued, or started after
        return (f"job {data['job_id']} on {data['node']} (queued {data['pending_s']:.0f}s)" if data.get("node")
                else f"job {data['job_id']} pending {data['pending_s']:.0f}s ({data.get('reason') or '-'})")
    return str(data["phase"]) if "phase" in data else ""


def numbers_line(trials: list[Any]) -> str | None:
    """Trial numbers are Optuna's: a proposal dropped before it ran (vetoed as a likely crash, moved onto the
    grid) takes one too, so the numbers of the trials that ran skip. Said, so that `trial 953` after 200 trials
    reads as what it is."""
    numbers = {t.trial for t in trials}
    if not numbers:
        return None
    top = max(numbers)
    skipped = top + 1 - len(numbers)
    if skipped <= 0:
        return None
    return (f"trial numbers run to {top}: {skipped} of them went to proposals dropped before they ran (vetoed as "
            f"likely crashes, moved onto the grid, or repeats), which Optuna numbers too; {len(numbers)} trials ran "
            "(tunectl trials lists them)")


def chose_line(chose: dict[str, tuple[int, Any]]) -> str:
    """What SGLang picked for the knobs the baseline left to it, and where the space could not follow."""
    parts = [f"{k}={raw:,}" + ("" if near == raw else f" (not in the search space: the steps start from {near:,})")
             for k, (raw, near) in chose.items()]
    return "  baseline: SGLang chose " + ", ".join(parts)


def parallel_line(d: dict[str, Any]) -> str:
    """--parallel N on hosts with fewer GPU slots: how many trials run at once, and why."""
    n = d["slots"]
    at_once = "trials run one at a time" if n == 1 else f"at most {n} trials run at once"
    return (f"--parallel {d['asked']}: {at_once}: the hosts have {n} GPU slot{'s' if n != 1 else ''} of "
            f"{d['gpus_per_trial']} GPUs (a trial's tp-size x pp-size x dp-size, or server.gpus_per_trial)")


def resume_line(d: dict[str, Any]) -> str:
    kept, requeued = d["kept"], d["requeued"]
    again = f", trial {', '.join(map(str, requeued))} re-queued (interrupted)" if requeued else ""
    if d["mode"] == "finished":
        return (f"already finished: {kept} of {d['trials']} search trials done; confirming the finalists and "
                f"naming the winner again (--trials N with N > {kept} extends the study)")
    if d["mode"] == "extending":
        return f"extending: {d['before']} -> {d['trials']} search trials, {kept} kept{again}"
    return f"resuming: {kept} of {d['trials']} search trials kept{again}"


def _ladder_table(ladder: list[Any]) -> Table:
    """The winner's levels; a capacity search's open-loop probes by their request rate, in the order run."""
    steps = ladder_steps(ladder)
    rate = any(s.request_rate is not None for s in steps)
    t = Table(title="the winner's ladder (its search run)" if not rate else
              "the winner's capacity search (its search run: the request rates probed, in order)", show_lines=False)
    for col in ("workload", "req/s" if rate else "concurrency", "status", "output tok/s"):
        t.add_column(col, justify="right" if col != "workload" else "left")
    for s in steps:
        load = f"{s.request_rate:.3g}" if rate and s.request_rate is not None else str(s.concurrency)
        t.add_row(s.workload, load, s.status, f"{s.output_throughput:,.0f}")
    return t


def _finalists_table(groups: list[dict[str, Any]], what: str = "output tok/s") -> Table:
    t = Table(title=f"finalists: the search run, then reruns on fresh launches ({what})")
    pooled = any("estimate" in g for g in groups)      # ranked by the pooled estimate (search.pool)
    for col in ("trial", "runs", "mean", *(["pooled"] if pooled else []), "spread"):
        t.add_column(col, justify="left" if col == "runs" else "right", overflow="fold")
    for g in groups:
        runs = ", ".join(f"#{r['trial']} {fmt_reading(r['output_throughput'])}" if r["status"] == "ok"
                         else f"#{r['trial']} {r['status']}" for r in g["runs"])
        spread = (f"{fmt_reading(g['min_output_throughput'])}-{fmt_reading(g['max_output_throughput'])}"
                  if g["ok_runs"] else "-")
        est = [f"{g['estimate']:,.1f}" if "estimate" in g else "-"] if pooled else []
        t.add_row(str(g["search_trial"]), runs, f"{g['mean_output_throughput']:,.1f}", *est, spread)
    return t


def show(out: dict[str, Any], root: Path) -> None:
    """The closing lines: the numbers come from the results on disk through the functions the report and
    `tunectl best` use, so the three agree."""
    from tunectl.reports.data import headline, load_study, study_profile, summary, winner_number
    from tunectl.reports.tables import finalists
    from tunectl.store import StudyStore

    console.print(f"[bold]study[/bold] {escape(out['study'])}: {out['trials']} search trials "
                  f"({out['crashed']} crashed, {out['pruned']} pruned, {out['duplicates']} duplicate proposals, "
                  f"{out['retries']} retries) in {out['wall_s']:.0f}s"
                  + (f" on {out['slots']} slots" if out.get("slots", 1) > 1 else "")
                  + f"; pruning saved ~{out['saved_s']:.0f}s",
                  highlight=False)
    data = load_study(StudyStore(out["study"], root))
    gap = numbers_line(data.trials)
    if gap:
        console.print(gap, highlight=False, markup=False)
    groups = finalists(data.trials, (data.best or {}).get("finalists"), study_profile(data))
    if groups:
        show_table(_finalists_table(groups, unit(study_profile(data))), keep=("trial",))
    pol = out.get("policy") or {}
    if pol.get("off"):                      # a policy the profile changed: say which rules did not run
        console.print(f"[bold]policy[/bold]: proposers {' > '.join(pol['proposers']) or 'none'}, vetoes "
                      f"{', '.join(pol['vetoes']) or 'none'}; off: {', '.join(pol['off'])} (search.policy)",
                      highlight=False)
    race = (out.get("best") or {}).get("race")
    if race:
        console.print(f"[bold]finalists[/bold]: {race['rule']}; {race['spent']} of {race['budget']} reruns spent "
                      f"(launch-to-launch noise {race['noise']:.1%}, search.finalists in the profile)",
                      highlight=False)
    best, number = out["best"], winner_number(data)
    if best is None or number is None:
        console.print("[red]no stable configuration survived[/red]: see the trials in the report")
    else:
        found = (f" (found after {out['trials_to_best']} of {out['trials']} search trials)"
                 if out.get("trials_to_best") else "")
        console.print(f"[bold green]best[/bold green]: trial {best['trial']}, {headline(number)}{found}",
                      highlight=False)
        console.print("  " + " ".join(f"{k}={v}" for k, v in best["params"].items()), highlight=False,
                      markup=False)
        if best.get("metric") == "capacity":
            value = best["confirmed_value"] if best.get("confirmed_value") is not None else best["value"]
            console.print(f"[bold]objective (goodput)[/bold]: capacity {value:,.3g} at the SLO (req/s, or concurrency "
                          f"with capacity.by: concurrency; mean of {best.get('launches') or 1} launches); the ladder "
                          "below is its bracketing search", highlight=False)
        if best.get("ladder"):
            show_table(_ladder_table(best["ladder"]), keep=("workload", "status"))
        s = summary(data)["best"] or {}
        if s.get("command"):
            console.print("[bold]launch command[/bold] (tunectl best --format command):")
            print(s["command"])
        if best.get("config_file"):
            console.print(f"[bold]config file[/bold]: {escape(best['config_file'])}", highlight=False)
    if out.get("warm_start"):
        from tunectl.reports.tables import warm_lines

        for line in warm_lines(out["warm_start"]):
            console.print(line, highlight=False, markup=False)
    console.print(f"results: {escape(out['results_dir'])} (best.json, trials/, study.db); storage "
                  f"{escape(out['storage'])}", highlight=False, soft_wrap=True)
    if out.get("stopped"):
        console.print(Text(f"search stopped: {out['stopped']}; fix the host (tunectl check), then the same "
                           "command resumes the study", style="red"))
        raise typer.Exit(1)


def _note_unset_baseline(prof: Any) -> None:
    """Knobs with no base value are left to SGLang in the baseline: say so before the study."""
    from tunectl.search.space import unset_in_baseline

    unset = unset_in_baseline(prof)
    if unset:
        console.print(Text(
            f"baseline: {', '.join(unset)} (no `default:` in search.space, no base flag): left to SGLang, which picks "
            "its own value for the model and GPU; the gain is over SGLang as the profile configures it",
            style="dim"))


def _warn_unreadable(study: str | None, prof: Any, root: Path) -> None:
    """A resumed study's trial records that cannot be read are named, not skipped without a word; a study.json that
    cannot be read is one line before the storage is opened (nothing written)."""
    from tunectl.commands.results import warn_unreadable
    from tunectl.store import StudyStore, check_name

    name = (check_name(study, "--study") if study is not None      # --study "": refused, not the default
            else check_name(prof.name, f"{prof.source or prof.name}: name"))
    warn_unreadable(StudyStore(name, root)).read_study()


def _rebuild(prof: Any, name: str, root: Path, storage: str | None) -> None:
    from tunectl.wiring.recovery import rebuild_study

    added, aside = rebuild_study(prof, name, root, storage)
    err_console.print(f"rebuilt study {name} from its trial files: {added} trials"
                      + (f" (the old study.db kept as {aside.name})" if aside else ""), highlight=False, markup=False)


TrialsOpt = Annotated[int | None, typer.Option("--trials", "-n", help="search trials (default: profile)")]
ProfileOpt = Annotated[Path | None, typer.Option("--profile", "-p", help="profile YAML (default: sim-glm5)")]
StudyOpt = Annotated[str | None, typer.Option("--study", help="study name (default: the profile's name)")]
StorageOpt = Annotated[str | None, typer.Option(
    "--storage", help="Optuna storage URL (default: SQLite results/<study>/study.db; postgresql://... for many "
    "workers, one per host)")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="sampler seed (default: profile)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document, no progress view")]
VirtualOpt = Annotated[bool, typer.Option("--virtual", help="evaluate on the stand-in's virtual-clock model (no "
                                          "processes; seconds for a whole study; sim profiles only)")]
RebuildOpt = Annotated[bool, typer.Option(
    "--rebuild", help="make the study's storage again from its trial files (after an empty or corrupt study.db; "
    "the old file is kept aside), then resume")]
ParallelOpt = Annotated[int | None, typer.Option(
    "--parallel", help="at most N trials at once (default: one per GPU slot: host.gpus split by "
    "server.gpus_per_trial or tp-size; with --virtual: 1)")]
RootOpt = Annotated[Path, typer.Option("--results", help="results folder", hidden=True)]
ConfirmOpt = Annotated[int, typer.Option("--confirm", help="after the race: N fresh launches each of the winner and "
                                         "SGLang's own choice, interleaved and judged in pairs (tunectl confirm)")]
WarmOpt = Annotated[str | None, typer.Option(
    "--warm-start", help="start from what study OLD learned (another SGLang version, patches or profile): its "
    "winner and top configs run first, its trials become prior knowledge (docs/versions.md)")]


def _virtual_flags(prof: Profile) -> None:
    """The virtual model runs no server to refuse a flag: the profile's flags are checked against the bundled --help
    of its SGLang version, as `tunectl check` does against the host's (an unknown flag, a bad choice or type)."""
    from tunectl.runners.checks.flagcheck import problems
    from tunectl.sglang.flags import bundled_flags

    version = prof.server.sglang_version
    try:
        flags = bundled_flags(version)
    except FileNotFoundError as e:              # the stand-in plays only the versions whose --help it bundles
        raise UsageError(f"{prof.source}: server.sglang_version: {version!r}: the virtual model plays the stand-in, "
                         f"which plays the bundled versions only ({str(e).split('; ', 1)[-1]})") from None
    bad = problems(prof, flags, f"SGLang {version} (its --help, bundled)")
    if bad:
        more = f" (and {len(bad) - 1} more: `tunectl check -p {prof.source}` lists them)" if len(bad) > 1 else ""
        raise UsageError(bad[0] + more)


@app.command()
@one_line_errors
def search(trials: TrialsOpt = None, profile: ProfileOpt = None, study: StudyOpt = None, storage: StorageOpt = None,
           seed: SeedOpt = None, as_json: JsonOpt = False, virtual: VirtualOpt = False,
           root: RootOpt = DEFAULT_ROOT, warm_start: WarmOpt = None, parallel: ParallelOpt = None,
           rebuild: RebuildOpt = False, confirm: ConfirmOpt = 0) -> None:
    """Search the profile's flags for the fastest config that does not crash (the same command again resumes)."""
    import optuna

    from tunectl.wiring.study import run_search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if trials is not None and trials < 1:
        raise UsageError(f"--trials: {trials}: must be a positive number of search trials (default: the profile's)")
    if parallel is not None and parallel < 1:
        raise UsageError(f"--parallel: {parallel}: must be a positive number of trials at once (default: one per "
                         "GPU slot)")
    if seed is not None and not 0 <= seed <= 2**32 - 1:
        raise UsageError(f"--seed: {seed}: must be 0 .. {2**32 - 1} (the samplers' range; default: the profile's)")
    if confirm < 0 or (confirm and virtual):
        raise UsageError(f"--confirm: {confirm}: " + ("the virtual model has no launches to confirm on" if virtual
                                                       else "must be 0 (none) or more fresh launches of each side"))
    prof = get_profile(profile)
    if confirm and prof.host.kind == "slurm":
        raise UsageError(f"--confirm: {prof.source or prof.name}: host.kind: slurm: the confirmation's launches are "
                         "compared in pairs on one machine; run `tunectl confirm` with a profile for one node")
    _warn_unreadable(study, prof, root)
    if rebuild:
        _rebuild(prof, study or prof.name, root, storage)
    evaluate = None
    if virtual:
        from tunectl.engines import engine

        if not engine(prof).has_model:
            raise UsageError(f"--virtual: profile {prof.source}: server.engine is {prof.server.engine!r}; "
                             "the virtual model needs 'sim'")
        _virtual_flags(prof)
        from tunectl.store import StudyStore
        from tunectl.wiring.virtual import VirtualEvaluator, recorded

        evaluate = recorded(VirtualEvaluator(prof, prof.search.seed if seed is None else seed), prof,
                            StudyStore(study or prof.name, root))
    if as_json:
        out = run_search(prof, trials, study, storage, seed, None, root=root, evaluate=evaluate,
                         warm_start=warm_start, in_memory=virtual, parallel=parallel).to_dict()
        if confirm and not out.get("stopped"):
            out["confirmation"] = _confirm_winner(prof, out, confirm, root, as_json=True)
        print(json.dumps(out, indent=2, default=str))
        if out.get("stopped"):
            raise typer.Exit(1)
        return
    _note_unset_baseline(prof)
    view = Progress(trials or prof.search.trials, unit(prof))
    with view.live:
        out = run_search(prof, trials, study, storage, seed, view.on_event, root=root, evaluate=evaluate,
                         warm_start=warm_start, in_memory=virtual, parallel=parallel).to_dict()
    show(out, root)
    if confirm and not out.get("stopped"):
        _confirm_winner(prof, out, confirm, root, as_json=False)


def _confirm_winner(prof: Profile, out: dict[str, Any], launches: int, root: Path,
                    as_json: bool) -> dict[str, Any] | None:
    """`--confirm N`: the winner against SGLang's own choice (tunectl confirm), when there is a winner that differs
    from it."""
    from tunectl.commands.confirm import run_confirm, same_launch

    best = out.get("best") or {}
    if not best or same_launch(prof, dict(best.get("params") or {}), {}):
        if not as_json:
            console.print("--confirm: " + ("no stable configuration to confirm" if not best else
                                           "the winner launches as SGLang's own choice does (the profile's base "
                                           "flags): nothing to confirm"), highlight=False)
        return None
    if not as_json:
        console.print(f"[bold]confirming the winner against SGLang's own choice: {launches} fresh launches each[/]",
                      highlight=False)
    return run_confirm(prof, dict(best["params"]), out["study"], {}, "default", launches, None, None, root, as_json,
                       emit=False)
