"""How `tunectl sweep` shows a launch: the level table, a crash's evidence, progress lines, several launches pooled.

The CLI owns the console: these build rich tables and lines from results; the command prints them.
"""
from __future__ import annotations

from typing import Any

from rich.table import Table

from tunectl.commands._common import console
from tunectl.models import LevelResult, TrialResult
from tunectl.runners.server.compiling import describe


def _fmt(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


# energy and cost per level (tunectl/energy.py): metric, column, digits; shown when a level has them
ENERGY_COLUMNS = (("gpu_power_w", "W/GPU", 0), ("output_throughput_per_gpu", "tok/s/GPU", 0),
                  ("joules_per_output_token", "J/tok", 3), ("usd_per_million_output_tokens", "$/Mtok", 2))


def level_table(result: TrialResult) -> Table:
    tab = Table(title=f"trial {result.trial}: {result.status} (latencies in ms)")
    spec = any("spec_accept_length" in lv.metrics for lv in result.levels)   # speculative decoding on
    energy = [(k, col, d) for k, col, d in ENERGY_COLUMNS if any(k in lv.metrics for lv in result.levels)]
    for col in ("workload", "c", "status", "steady tok/s (95%)", "samples", "whole-run tok/s", "TTFT p50",
                "TTFT p99", "TPOT p50", "TPOT p99", *(("accept len",) if spec else ()), *(c for _, c, _ in energy),
                "done/failed"):
        tab.add_column(col, justify="left" if col in ("workload", "status") else "right")
    from tunectl.goodput import jitter_bound

    style = {"ok": "green", "crashed": "bold red", "failed": "yellow", "pruned": "dim"}
    for lv in result.levels:
        m = lv.metrics
        tab.add_row(lv.workload, str(lv.concurrency) if lv.load.startswith("c") else lv.load,
                    f"[{style.get(lv.status, '')}]{lv.status}[/]" + ("*" if lv.client_bound else "")
                    + ("?" if jitter_bound(lv) else ""),
                    steady_text(lv), str(lv.samples or "-"), _fmt(m.get("output_throughput")),
                    _fmt(m.get("median_ttft_ms"), 0), _fmt(m.get("p99_ttft_ms"), 0), _fmt(m.get("median_tpot_ms")),
                    _fmt(m.get("p99_tpot_ms")), *((_fmt(m.get("spec_accept_length"), 2),) if spec else ()),
                    *(_fmt(m.get(k), d) for k, _, d in energy),
                    f"{lv.completed}/{lv.failed_requests}")
    notes = []
    if any(lv.client_bound for lv in result.levels):
        notes.append("* the benchmark client was busy: the server may do better than measured")
    jittery = [lv for lv in result.levels if jitter_bound(lv)]
    if jittery:
        floor = max(lv.metrics["timing_floor_ms"] for lv in jittery)
        notes.append(f"? latencies within 4x of what the host's timing reads as on this clock (~{floor:,.0f} ms: "
                     "5 ms of wall time / the stand-in's time scale): mostly host jitter, not the server; raise "
                     "server.sim.time_scale (e.g. 0.1) to measure open-loop latency")
    if any(lv.capped for lv in result.levels):
        notes.append("~ the level's time cap came before its interval was within bench.precision")
    if any(lv.load[0] != "c" for lv in result.levels):
        notes.append("rN: open-loop level at N requests/s; xN: trace replay at N x its pace")
    for lv in result.levels:
        if lv.metrics.get("late_requests"):
            notes.append(f"{lv.workload} {lv.load}: {int(lv.metrics['late_requests'])} requests sent late "
                         f"(max {lv.metrics['max_lateness_ms']:,.0f} ms, p99 {lv.metrics['p99_lateness_ms']:,.0f} ms)")
        if lv.status == "failed" and lv.errors:     # why it failed, in the client's words (a crash has its own lines)
            more = f" (+{len(lv.errors) - 1} more)" if len(lv.errors) > 1 else ""
            notes.append(f"{lv.workload} {lv.load}: failed: {lv.errors[0][:400]}{more}")
    if any(lv.witness.get("flag") for lv in result.levels):
        notes.append("! client and server disagree by more than 5% (see the level's witness)")
    tab.caption = "\n".join(notes) or None
    return tab


def steady_text(lv: LevelResult) -> str:
    """The steady window's throughput with its 95% interval; marks: ~ capped, ! witnesses disagree."""
    if lv.status != "ok" or "steady_output_throughput" not in lv.metrics:
        return "-"
    ci = lv.output_throughput_ci95
    text = _fmt(lv.metrics["steady_output_throughput"], 0) + (f" ({ci[0]:,.0f}-{ci[1]:,.0f})" if ci else "")
    return text + ("~" if lv.capped else "") + ("!" if lv.witness.get("flag") else "")


def level_line(lv: LevelResult) -> str:
    """One finished level as the sweep prints it: the steady window where the client measured one (the built-in
    client), else the whole run only (sglang.bench_serving reports no steady window)."""
    whole = f"{lv.metrics.get('output_throughput', 0):,.1f}"
    if lv.status == "ok" and "steady_output_throughput" not in lv.metrics:
        return f"  {lv.load:<7} {lv.status:<8} {whole:>22} tok/s whole run"
    return f"  {lv.load:<7} {lv.status:<8} {steady_text(lv):>22} tok/s steady, {whole} whole run"


def capacity_lines(result: TrialResult) -> list[str]:
    """The capacity search's answer and the loads it tried, as lines (empty without one)."""
    cap = result.capacity
    if not cap:
        return []
    slo = ", ".join(f"{k} <= {v:g}" for k, v in cap["slo"].items())
    share = f"{cap['slo_attainment']:.0%}"
    from tunectl.goodput import capacity_words, slo_within_jitter   # numpy: only with a capacity to show

    head = f"capacity: {capacity_words(cap)} with {slo} for >= {share} of requests"
    if cap["low"] is not None and cap["high"] is not None:
        head += f" (bracket {cap['low']:.4g}-{cap['high']:.4g}, tolerance {cap['tolerance']:.0%})"
    runs = cap.get("runs") or [[*p, ""] for p in cap["probes"]]        # every run; older records: probes only
    tried = ", ".join(f"{r[0]:.4g} {'pass' if r[1] else 'fail'} ({r[2]:.1%}"
                      + {"late": ", sent late: run again", "crash": ", crashed"}.get(r[3], "") + ")" for r in runs)
    why = {"crash": "the server crashed", "max_probes": "objective.capacity.max_probes reached",
           "client_bound": "the client could not send the next load on schedule on this host (a faster host, more "
                           "cores, or a larger stand-in time scale measures further)"}
    lines = [head, f"  tried: {tried}"] + ([f"  stopped early: {why.get(cap['stopped'], cap['stopped'])}"]
                                          if cap["stopped"] else [])
    floor = slo_within_jitter([lv for lv in result.levels if lv.request_rate is not None], cap["slo"])
    if floor is not None:
        lines.append(f"  ? unreliable here: the host's timing reads as ~{floor:,.0f} ms on this clock, a fair share "
                     f"of the SLO's {slo}: pass or fail measures host jitter more than the config (raise "
                     "server.sim.time_scale, e.g. 0.1, or give a looser --slo)")
    return lines


def print_capacity(result: TrialResult) -> None:
    for i, line in enumerate(capacity_lines(result)):
        console.print(f"[bold]{line}[/]" if i == 0 else line, highlight=False, markup=i == 0, soft_wrap=True)


def print_crash(result: TrialResult) -> None:
    c = result.crash
    if c is None:
        return
    where = f"at concurrency {c.level}" if c.level is not None else f"during {c.phase}"
    console.print(f"[bold red]crash[/]: {c.cls} ({c.signature}) {where}", highlight=False)
    if c.exception_line:
        console.print(f"  exception: {c.exception_line}", highlight=False, markup=False)
    if c.exit_code is not None or c.detect_latency_s is not None:
        console.print(f"  exit code: {c.exit_code}  detected within {_fmt(c.detect_latency_s, 2)} s of the traceback",
                      highlight=False)
    if c.message:
        console.print(f"  {c.message}", highlight=False, markup=False)
    for line in c.traceback_excerpt.splitlines()[-6:]:
        console.print(f"  | {line}", highlight=False, markup=False, style="dim")


def progress_text(kind: str, data: dict[str, Any]) -> str | None:
    if kind == "milestone":
        return f"starting: {data['name']} (+{data['t']:.1f} s)"
    if kind == "compiling":
        return f"compiling kernels ({describe(data['compilers'])}) during {data['phase']} (+{data['t']:.1f} s) ..."
    if kind == "ready":
        return f"ready after {data['ready_s']:.1f} s"
    if kind == "level_start":
        if data.get("trace"):
            return f"{data['workload']}: replaying {data['num_prompts']} requests"
        if data.get("request_rate") is not None:
            return f"{data['workload']} @ {data['request_rate']:g} req/s ({data['num_prompts']} requests)"
        return f"{data['workload']} @ concurrency {data['concurrency']} ({data['num_prompts']} requests)"
    if kind == "teardown":
        return "tearing down"
    return None


def launches_table(results: list[TrialResult]) -> Table:
    """Per level: each launch's reading, the launches pooled into one 95% interval, their spread."""
    from tunectl.launches import summarize

    tab = Table(title=f"{len(results)} fresh launches (output tok/s; steady window with its 95% interval where "
                      "measured, else the whole run)")
    for col in ("workload", "c", *(f"launch {i + 1}" for i in range(len(results))), "pooled (95%)", "spread"):
        tab.add_column(col, justify="left" if col == "workload" else "right")
    for row in summarize(results):
        cells = [r.text() if r and r.low != r.high else (_fmt(r.value, 0) if r else s)
                 for r, s in zip(row.readings, row.statuses)]
        p, sp = row.pooled, row.spread
        tab.add_row(row.workload, str(row.concurrency) if row.load.startswith("c") else row.load, *cells,
                    p.text() if p else "-",
                    f"{sp:.1%}" if sp is not None else "-")
    return tab
