"""The HTML report: compute every section's data (`compute`), then render one self-contained page (`render`):
plotly.js inline once, compressed (`embed`), no network access, opens offline in any current browser."""
from __future__ import annotations

import html
import json
import time
from typing import Any

from tunectl.reports import embed, figures
from tunectl.reports.data import (
    StudyData,
    baseline_trial,
    best_info,
    best_trial,
    fmt_cell,
    fmt_params,
    fmt_reading,
    headline,
    history,
    pareto,
    pareto_per_token,
    study_profile,
    summary,
    throughput_curves,
)
from tunectl.reports.importance import importance
from tunectl.reports.tables import (PER_TOKEN_COLUMNS, crash_map, finalists, several_machines, trial_rows, warm_lines,
                                    workload_columns)


def flag_diff(data: StudyData) -> list[dict[str, Any]]:
    """The winner's SGLang flags, patches ("patch <id>") and environment ("env <NAME>", as reproduce() keeps it)
    next to the baseline's and the reference's (a column whenever the study has a reference): first their results
    (peak output tok/s and its concurrency), then the flags that differ among the columns that record flags."""
    from tunectl.reports.compare import norm_flag
    from tunectl.reports.command import STAND_IN_ENV, reproduce
    from tunectl.reports.data import peak_level

    def knobs(launch: dict[str, Any]) -> dict[str, Any]:
        again = reproduce(launch)
        return {**{norm_flag(f): v for f, v in (launch.get("config") or {}).items()},
                **{f"patch {p}": True for p in again["patches"]},
                **{f"env {k}": v for k, v in again["env"].items() if k not in STAND_IN_ENV}}   # a patch shows once

    cols = {k: t for k, t in (("best", best_trial(data)), ("baseline", baseline_trial(data.trials))) if t is not None}
    flags = {k: knobs(data.launches.get(t.trial, {})) for k, t in cols.items()}
    results = {k: (t.best_output_throughput, getattr(peak_level(t), "concurrency", None)) for k, t in cols.items()}
    ref = data.reference
    if ref:
        flags["reference"] = {norm_flag(f): v for f, v in (ref.get("flags") or {}).items()}
        results["reference"] = (ref.get("output_throughput"), ref.get("concurrency"))
    if not flags:
        return []
    rows = [{"flag": "result: output tok/s", **{k: v[0] for k, v in results.items()}},
            {"flag": "result: at concurrency", **{k: v[1] for k, v in results.items()}}]
    known = [k for k, d in flags.items() if d]           # a reference that records no flags is not a difference
    for f in sorted({f for d in flags.values() for f in d}):
        row = {"flag": f, **{k: d.get(f) for k, d in flags.items()}}
        if len({json.dumps(row.get(k), default=str) for k in known}) > 1:
            rows.append(row)
    return rows


def compute(data: StudyData, log_prefix: str = "") -> dict[str, Any]:
    picks = (data.best or {}).get("finalists")
    return {"summary": summary(data), "throughput": throughput_curves(data), "history": history(data.trials),
            "importance": importance(data.trials, study_profile(data),
                                     ((best_info(data).get("race") or {}).get("noise"))),
            "crash_map": crash_map(data.trials), "pareto": pareto(data.trials),
            "pareto_per_token": pareto_per_token(data.trials),
            "finalists": finalists(data.trials, picks, study_profile(data)),
            "flag_diff": flag_diff(data), "trials": trial_rows(data, log_prefix)}


def _e(v: Any) -> str:
    if isinstance(v, (float, bool)):
        return fmt_cell(v)
    if isinstance(v, dict):
        return html.escape(fmt_params(v, "\n")).replace("\n", "<br>") or "(base flags)"
    return html.escape("" if v is None else str(v))


def _table(rows: list[dict[str, Any]], cols: list[str], cls: str = "") -> str:
    head = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{r.get(c, '') if c == 'log' else _e(r.get(c))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _summary_html(s: dict[str, Any]) -> str:
    counts = ", ".join(f"{v} {k}" for k, v in sorted(s["status_counts"].items()))
    parts = [f"<p>Study <b>{_e(s['study'])}</b> ({_e(s['kind'])}): {s['trials']} trial(s): {_e(counts)}.</p>"]
    b = s["best"]
    if b is None:
        return "".join(parts) + "<p>No stable configuration yet.</p>"
    lat = ", ".join(f"{k} {_e(v)}" for k, v in b["latencies"].items() if v is not None)
    if b.get("spec_accept_length") is not None:        # speculative decoding: the server's acceptance length
        lat += f"; speculative accept length {_e(b['spec_accept_length'])}"
    ref = s.get("reference")
    ref_txt = (f"<li>reference: {_e(ref.get('label'))}: {_e(float(ref['output_throughput']))} tok/s</li>"
               if ref and ref.get("output_throughput") else "")
    slo = ", ".join(f"{k} <= {v:g}" for k, v in (b.get("slo") or {}).items())
    cap_txt = (f"<li>SLA capacity: <b>{_e(b['capacity'])}</b>" + (f" at {_e(slo)}" if slo else "") + "</li>"
               if b.get("capacity") else "")
    patches = ", ".join(f"{p} {b['patch_hashes'][p][:12]}" if p in b["patch_hashes"] else p
                        for p in b["patches"]) or "none"
    parts.append(
        f"<ul><li>best stable: trial <b>#{b['trial']}</b> ({_e(b['role'])}): "
        f"<b>{_e(headline(b['confirmed']))}</b>; peak of trial #{b['trial']} at concurrency "
        f"{_e(b['concurrency'])}; stable up to {_e(b['max_stable_concurrency'])}</li>"
        f"<li>latencies at that level: {lat}</li>{cap_txt}"
        f"<li>host {_e(b['host'])}{', ' + _e(b['machine']) if b.get('machine') else ''}, "
        f"SGLang {_e(b['sglang_version'] or 'unknown')}, "
        f"patches: {_e(patches)}</li>"
        f"{ref_txt}{_confirmation(s)}</ul>"
        f"<p>Launch command:</p><pre class='cmd'>{_e(b['command'])}</pre>")
    if s.get("warm_start"):
        lines = warm_lines(s["warm_start"])
        parts.append(f"<p>{_e(lines[0])}</p>" + ("<ul>" + "".join(f"<li>{_e(x.strip())}</li>" for x in lines[1:])
                                                  + "</ul>" if len(lines) > 1 else ""))
    return "".join(parts)


def _confirmation(s: dict[str, Any]) -> str:
    """`tunectl confirm`'s verdict on the winner (a search's report only)."""
    c = s.get("confirmation")
    if c:
        more = "".join(f"; {_e(x)}" for x in (c.get("noise_line"), c.get("resolution")) if x)
        return (f"<li>confirmed on fresh launches of one machine, in pairs (results/{_e(c['study'])}): "
                f"<b>{_e(c['conclusion'])}</b>{more}</li>")
    if s.get("kind") == "search" and "confirmation" in s and not s.get("slurm"):
        return (f"<li>not yet confirmed against SGLang's own choice on fresh launches: "
                f"<code>tunectl confirm --study {_e(s['study'])}</code></li>")
    return ""


def _figures(r: dict[str, Any]) -> list[tuple[str, str, Any]]:
    out = [("throughput", "Throughput vs concurrency", figures.throughput_figure(r["throughput"])),
           ("latency", "Latency vs concurrency", figures.latency_figure(r["throughput"]))]
    if len(r["history"]) > 1:
        out.append(("history", "Optimization history", figures.history_figure(r["history"])))
    if r["importance"]["values"]:
        out.append(("importance", "Parameter importance", figures.importance_figure(r["importance"])))
    if r["crash_map"]["rows"]:
        out.append(("crashmap", "Crash map", figures.crash_map_figure(r["crash_map"])))
    if r["pareto"]["points"]:
        out.append(("pareto", "Pareto front", figures.pareto_figure(r["pareto"])))
    for key, p in r.get("pareto_per_token", {}).items():      # energy and cost (docs/energy.md)
        out.append((f"pareto-{key}", f"Throughput vs {p['axis']}", figures.per_token_figure(key, p)))
    return out




def _tables_html(r: dict[str, Any]) -> str:
    crashes = r["crash_map"]["crashes"]
    fin = [{**g, "runs": " / ".join(f"#{x['trial']} {fmt_reading(x['output_throughput'])}" for x in g["runs"]),
            "95% interval": f"{fmt_reading(g['ci95'][0])}-{fmt_reading(g['ci95'][1])}" if g.get("ci95") else "-",
            "spread": f"{g['launch_spread']:.1%}" if g.get("launch_spread") is not None else "-",
            "pooled estimate": fmt_reading(g["estimate"]) if "estimate" in g else "-"}
           for g in r["finalists"]]
    what = ((r["summary"].get("best") or {}).get("confirmed") or {}).get("unit") or "output tok/s"
    labels = workload_columns(r["trials"])
    mach = ["machine"] if several_machines(r["trials"]) else []
    rows = [{**t, "log": f'<a class="log" href="{html.escape(t["log"])}">server.log</a>',
             **{f"tok/s {w}": round(t["per_workload"].get(w, 0.0)) for w in labels}} for t in r["trials"]]
    diff_cols = ["flag"] + [c for c in ("best", "baseline", "reference")
                            if any(c in d for d in r["flag_diff"])]
    ref = r["summary"].get("reference") or {}
    ref_note = (f"<p>reference: {_e(ref.get('label'))}" + ("" if ref.get("flags") else
                "; it records no flags (<code>tunectl report --reference PROFILE</code> compares a profile's)")
                + "</p>") if ref else ""
    return (
        "<section id='flags'><h2>Winner vs baseline and reference (results, differing flags)</h2>" + ref_note
        + (_table(r["flag_diff"], diff_cols) if r["flag_diff"] else "<p>No differences recorded.</p>")
        + "</section><section id='crashes'><h2>Crashes</h2>"
        + (_table(crashes, ["trial", "class", "signature", "phase", "level", "exception_line", "params"])
           if crashes else "<p>No crashes.</p>")
        + "</section><section id='finalists'><h2>Finalists and reruns</h2>"
        + (f"<p>each run's value, mean and interval: {_e(what)} (the study's objective)</p>" if fin else "")
        + (_table(fin, ["params", "search_trial", "runs", "ok_runs", "mean_output_throughput", "95% interval",
                        *(["pooled estimate"] if any("estimate" in g for g in r["finalists"]) else []),
                        "spread", "min_output_throughput", "max_output_throughput"])
           if fin else "<p>No finalists yet.</p>")
        + ("<p>pooled estimate: what the race ranked the configs by, each config's launches weighed against what the "
           "other configs' readings predict for it (<code>search.pool</code>); the number given for a config is the "
           "mean of its own launches.</p>" if any("estimate" in g for g in r["finalists"]) else "")
        + "</section><section id='all-trials'><h2>All trials</h2>"
        + "<p>key flags: the knobs where a trial differs from the baseline.</p>"
        + "<p>confirmed: the mean over a config's fresh launches where the finalists' race re-ran it (the "
          "winner's one number on each of its runs).</p>"
        + ("<p>machine: the GPUs a trial ran on (their id; not recorded by older versions): the trials ran on more "
           "than one, and one config can read up to 20% apart on two GPUs of one model.</p>"
           if mach else "")
        + _table(rows, ["trial", "role", "status", "key_flags", "output_throughput", "confirmed",
                        *(["capacity"] if any(t["capacity"] for t in rows) else []),
                        *(f"tok/s {w}" for w in labels), "peak_concurrency",
                        *(["accept_len"] if any(t.get("accept_len") is not None for t in rows) else []),
                        *(k for k in PER_TOKEN_COLUMNS if any(t.get(k) is not None for t in rows)),
                        "max_stable_concurrency", *mach, "crash_class",
                        "crashed_at", "exception_line", "log"],
                 "trials")
        + "</section>")


CSS = ("body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1300px;color:#222}"
       "h1{font-size:1.6em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:4px;"
       "margin-top:28px}table{border-collapse:collapse;font-size:.85em;width:100%}"
       "td,th{border:1px solid #e3e3e3;padding:3px 6px;"
       "text-align:left;vertical-align:top}th{background:#f6f6f6}pre.cmd{background:#f6f6f6;padding:8px;"
       "white-space:pre-wrap;word-break:break-all}section{margin-bottom:12px}")


def render(r: dict[str, Any], title: str = "") -> str:
    s = r["summary"]
    title = title or f"tunectl report: {s['study']}"
    body = "".join(embed.figure_html(k, t, f) for k, t, f in _figures(r))
    if r["importance"].get("note"):
        body += f"<section id='importance-note'><p>Parameter importance: {_e(r['importance']['note'])}</p></section>"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style>{embed.head_scripts()}</head><body>"
            f"<h1>{_e(title)}</h1><p class='stamp'>generated {stamp}</p>"
            f"<section id='summary'><h2>Summary</h2>{_summary_html(s)}</section>{body}{_tables_html(r)}"
            f"{embed.loader_script()}</body></html>\n")
