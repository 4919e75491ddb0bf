"""Plotly figures built from the dicts of data.py/tables.py/importance.py. No data access here."""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from tunectl.reports.data import fmt_params

STATUS_COLORS = {"ok": "#2a9d8f", "crashed": "#e63946", "pruned": "#adb5bd", "infra": "#f4a261",
                 "running": "#457b9d", "dry_run": "#ced4da"}
CLASS_COLORS = {"config_error": "#9d0208", "load_crash": "#e63946", "flaky": "#f4a261", "hang": "#6a4c93",
                "startup_timeout": "#bc6c25", "infra": "#adb5bd"}
LAYOUT = {"template": "plotly_white", "height": 420, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
          "legend": {"orientation": "h", "y": -0.2}}
CURVES_LAYOUT = {**LAYOUT, "height": 560, "legend": {"orientation": "v", "x": 0, "xanchor": "left", "y": -0.2,
                                                      "yanchor": "top"},
                 "margin": {**LAYOUT["margin"], "b": 40}}


def _log2_axis(fig: go.Figure, **kw: Any) -> None:
    fig.update_xaxes(type="log", dtick=0.30102999566, title_text="client concurrency", **kw)


# one look per curve, the same in every figure: a color a colour-blind reader can tell apart, a marker shape and a
# dash, so the top configs stay apart where their lines overlap
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#8c564b", "#000000")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "pentagon", "hexagon", "cross")
DASHES = ("solid", "dash", "dashdot", "longdash", "longdashdot", "solid", "dash", "dashdot")


def curve_styles(curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each curve's color, marker and dash: the baseline grey and dotted, the others each their own; the first
    (the winner) drawn thicker."""
    out, k = [], 0
    for i, c in enumerate(curves):
        if c["role"] == "baseline":
            out.append({"color": "#6c757d", "symbol": "circle-open", "dash": "dot", "width": 2})
            continue
        out.append({"color": PALETTE[k % len(PALETTE)], "symbol": SYMBOLS[k % len(SYMBOLS)],
                    "dash": DASHES[k % len(DASHES)], "width": 3.5 if i == 0 else 2})
        k += 1
    return out


def curve_names(curves: list[dict[str, Any]]) -> list[str]:
    """Legend entries that read apart where the lines overlap: trial, role, peak, and the knobs where a curve differs
    from the first one (the winner): "#13 search: 2,483 tok/s; vs #12: mem-fraction-static=0.88"."""
    first = curves[0] if curves else {}
    out = []
    for c in curves:
        text = f"{c['label']}: {max(c['output_throughput'], default=0.0):,.0f} tok/s"
        if c is not first and c["role"] != "baseline":
            mine, win = c.get("params") or {}, first.get("params") or {}
            moved = fmt_params({k: v for k, v in mine.items() if win.get(k) != v}) or "the same knobs"
            text += f"; vs #{first['trial']}: {moved if len(moved) <= 48 else moved[:47] + '…'}"
        out.append(text)
    return out


def _hover(c: dict[str, Any]) -> str:
    return f"{c['label']}<br>{fmt_params(c.get('params') or {}, '<br>')}"


def throughput_figure(tc: dict[str, Any]) -> go.Figure:
    fig = go.Figure()
    for c, st, name in zip(tc["curves"], curve_styles(tc["curves"]), curve_names(tc["curves"])):
        fig.add_trace(go.Scatter(x=c["concurrency"], y=c["output_throughput"], mode="lines+markers",
                                 name=name, hovertext=_hover(c),
                                 line={"dash": st["dash"], "color": st["color"], "width": st["width"]},
                                 marker={"symbol": st["symbol"], "color": st["color"], "size": 8}))
        if c["crashed_at"] and c["concurrency"]:
            fig.add_trace(go.Scatter(x=[c["crashed_at"]], y=[c["output_throughput"][-1]], mode="markers",
                                     marker={"symbol": "x", "size": 12, "color": "#e63946"}, showlegend=False,
                                     hovertext=f"{c['label']} crashed at c={c['crashed_at']}"))
    ref = tc.get("reference")
    if ref and ref.get("output_throughput"):
        text = f"{ref.get('label', 'reference')}: {ref['output_throughput']:,.0f} tok/s"
        fig.add_hline(y=ref["output_throughput"], line_dash="dash", line_color="#6c757d",
                      annotation_text=text,
                      annotation_position="top left")
    fig.update_layout(title="Output throughput vs concurrency (top configs by the objective; the first is the "
                            "winner, drawn thicker)", yaxis_title="output tok/s", **CURVES_LAYOUT)
    _log2_axis(fig)
    return fig


def _center_stat(curves: list[dict[str, Any]], metric: str) -> str:
    """median when the results have it, else mean (the virtual model reports mean and p99)."""
    has = any(v is not None for c in curves for v in c.get(f"median_{metric}_ms", []))
    return "median" if has else "mean"


def latency_figure(tc: dict[str, Any]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms)", "TPOT (ms)"))
    stats = {m: _center_stat(tc["curves"], m) for m in ("ttft", "tpot")}
    shown: set[str] = set()
    for c, st in zip(tc["curves"], curve_styles(tc["curves"])):
        color = st["color"]
        for col, metric in ((1, "ttft"), (2, "tpot")):
            for stat, dash in ((stats[metric], "solid"), ("p99", "dash")):
                ys = c.get(f"{stat}_{metric}_ms", [])
                if not any(v is not None for v in ys):
                    continue
                name = f"{c['label']} {stat}"
                fig.add_trace(go.Scatter(x=c["concurrency"], y=ys, mode="lines+markers", name=name,
                                         legendgroup=c["label"], showlegend=name not in shown,
                                         line={"color": color, "dash": dash},
                                         marker={"symbol": st["symbol"], "color": color}), row=1, col=col)
                shown.add(name)
    for col, metric in ((1, "ttft"), (2, "tpot")):
        keys = (f"{stats[metric]}_{metric}_ms", f"p99_{metric}_ms")
        if not any(v is not None for c in tc["curves"] for k in keys for v in c.get(k, [])):
            dom = (fig.layout.xaxis if col == 1 else fig.layout.xaxis2).domain
            fig.add_annotation(text=f"no {metric.upper()} in these results", showarrow=False, xref="paper",
                               yref="paper", x=(dom[0] + dom[1]) / 2, y=0.5)
    fig.update_layout(title=f"Latency vs concurrency (solid {stats['ttft']}, dashed p99)", **LAYOUT)
    _log2_axis(fig)
    fig.update_yaxes(type="log")
    return fig


def history_figure(rows: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    for status in sorted({r["status"] for r in rows}):
        sel = [r for r in rows if r["status"] == status]
        fig.add_trace(go.Scatter(
            x=[r["trial"] for r in sel], y=[r["output_throughput"] for r in sel], mode="markers", name=status,
            marker={"color": STATUS_COLORS.get(status, "#333"), "size": 10,
                    "symbol": "x" if status == "crashed" else "circle"},
            hovertext=[f"#{r['trial']} {r['role']} {r['crash_class'] or ''} {fmt_params(r['params'])}"
                       for r in sel]))
    fig.add_trace(go.Scatter(x=[r["trial"] for r in rows], y=[r["running_best"] for r in rows],
                             mode="lines", line={"shape": "hv", "color": "#264653"}, name="best so far"))
    fig.update_layout(title="Optimization history (x = crashed; value = its best stable level)",
                      xaxis_title="trial", yaxis_title="best output tok/s", **LAYOUT)
    return fig


def importance_figure(imp: dict[str, Any]) -> go.Figure:
    items = sorted(imp["values"].items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h",
                           marker_color="#457b9d"))
    fig.update_layout(title=f"Parameter importance ({imp['method']})", xaxis_title="share", **LAYOUT)
    return fig


def crash_map_figure(cm: dict[str, Any]) -> go.Figure:
    """One row per crashed trial, one x mark per crash (colored by class) at its level or at "startup"; the levels
    the trial passed before it as light dots."""
    rows = cm["rows"]
    fig = go.Figure()
    passed = [(r, lv) for r in rows for lv in r["passed"]]
    fig.add_trace(go.Scatter(x=[str(lv) for _, lv in passed], y=[r["label"] for r, _ in passed], mode="markers",
                             name="level passed", marker={"color": "#cfe8e3", "size": 9},
                             hovertext=[f"#{r['trial']} passed c={lv}" for r, lv in passed]))
    for cls in sorted({r["class"] for r in rows}):
        sel = [r for r in rows if r["class"] == cls]
        fig.add_trace(go.Scatter(
            x=[r["at"] for r in sel], y=[r["label"] for r in sel], mode="markers", name=cls,
            marker={"color": CLASS_COLORS.get(cls, "#333"), "symbol": "x", "size": 13},
            hovertext=[f"#{r['trial']} {r['signature']} at {r['at']}: {r['exception_line']}<br>"
                       f"{fmt_params(r['params'], '<br>')}" for r in sel]))
    fig.update_layout(title="Crash map: one row per crashed trial (its flags that differ from the baseline), "
                            "x = where it crashed", **LAYOUT)
    fig.update_layout(height=max(320, 26 * len(rows) + 170))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=cm["levels"],
                     title_text="client concurrency")
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=[r["label"] for r in rows][::-1])
    return fig


def pareto_figure(p: dict[str, Any]) -> go.Figure:
    pts, front = p["points"], p["front"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[q["p99_ttft_ms"] for q in pts], y=[q["output_throughput"] for q in pts],
                             mode="markers", name="trial x level", marker={"color": "#adb5bd", "size": 7},
                             hovertext=[f"{q['label']} c={q['concurrency']}" for q in pts]))
    fig.add_trace(go.Scatter(x=[q["p99_ttft_ms"] for q in front], y=[q["output_throughput"] for q in front],
                             mode="lines+markers", name="Pareto front",
                             line={"shape": "hv", "color": "#e76f51"},
                             hovertext=[f"{q['label']} c={q['concurrency']}" for q in front]))
    fig.update_layout(title="Pareto front: throughput vs p99 TTFT", xaxis_title="p99 TTFT (ms)",
                      yaxis_title="output tok/s", **LAYOUT)
    fig.update_xaxes(type="log")
    return fig


def per_token_figure(key: str, p: dict[str, Any]) -> go.Figure:
    """Throughput against a cost per token (joules, or dollars): the operating points and their front."""
    pts, front = p["points"], p["front"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[q[key] for q in pts], y=[q["output_throughput"] for q in pts],
                             mode="markers", name="trial x level", marker={"color": "#adb5bd", "size": 7},
                             hovertext=[f"{q['label']} c={q['concurrency']}" for q in pts]))
    fig.add_trace(go.Scatter(x=[q[key] for q in front], y=[q["output_throughput"] for q in front],
                             mode="lines+markers", name="Pareto front", line={"shape": "hv", "color": "#2a9d8f"},
                             hovertext=[f"{q['label']} c={q['concurrency']}" for q in front]))
    fig.update_layout(title=f"Pareto front: throughput vs {p['axis']}", xaxis_title=p["axis"],
                      yaxis_title="output tok/s", **LAYOUT)
    return fig
