"""How the report carries its charts in one offline file, small: plotly.js once, gzip-compressed and base64-encoded
(the browser unpacks it with its own DecompressionStream), and each figure as compact JSON (numbers rounded to
what a reader sees, the shared plotly template written once), drawn by one loader script at the end of the page.

A browser without DecompressionStream (older than Chrome 80, Firefox 113, Safari 16.4) shows a line saying so in
each chart's place; the tables still read."""
from __future__ import annotations

import base64
import functools
import gzip
import html
import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

CONFIG = {"displaylogo": False, "responsive": True}
TEMPLATE = "plotly_white"

LOADER = """(async () => {
  const figs = Array.from(document.querySelectorAll('script.fig-data'));
  const say = text => figs.forEach(f => { document.getElementById(f.dataset.div).textContent = text; });
  if (typeof DecompressionStream === 'undefined') {
    say('this browser cannot unpack the charts (needs DecompressionStream: Chrome 80+, Firefox 113+, Safari 16.4+)');
    return;
  }
  const b64 = document.getElementById('plotly-gz').textContent.trim();
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const code = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
  const s = document.createElement('script');
  s.text = code;
  document.head.appendChild(s);
  const shared = JSON.parse(document.getElementById('plotly-template').textContent);
  const config = JSON.parse(document.getElementById('plotly-config').textContent);
  for (const f of figs) {
    const fig = JSON.parse(f.textContent);
    fig.layout.template = shared;
    Plotly.newPlot(f.dataset.div, fig.data, fig.layout, config);
  }
})();"""


@functools.lru_cache(maxsize=1)
def plotly_bundle() -> str:
    """plotly.js, gzip-compressed and base64-encoded (4.8 MB of JavaScript in about 2 MB of text)."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode("ascii")


def _round(v: Any) -> Any:
    """Numbers as a reader sees them: 5 significant digits (2,483.4 tok/s; 0.0123 s); lists and dicts walked."""
    if isinstance(v, float):
        return float(f"{v:.5g}")
    if isinstance(v, list):
        return [_round(x) for x in v]
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    return v


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element: no "<" at all (JSON.parse reads "\\u003c"), so neither "</script>" nor
    "<!--" then "<script" (which keeps the element open past its end tag) can come from data."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")


@functools.lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    return json.loads(pio.to_json(go.Figure(layout={"template": TEMPLATE})))["layout"]["template"]


def figure_html(key: str, title: str, fig: Any) -> str:
    """A figure's section: an empty div the loader draws into, and its data (template left out: written once)."""
    doc = json.loads(pio.to_json(fig, validate=False))
    doc.get("layout", {}).pop("template", None)
    doc["data"] = _round(doc.get("data", []))         # the layout keeps its own numbers (log-axis ticks)
    return (f'<section id="{key}"><h2>{html.escape(title)}</h2>'
            f'<div id="fig-{key}" class="fig" style="height:{int(doc["layout"].get("height") or 420)}px"></div>'
            f'<script type="application/json" class="fig-data" data-div="fig-{key}">{_script_json(doc)}</script>'
            "</section>")


def head_scripts() -> str:
    """In <head>: the compressed plotly.js, the shared template and the chart config (data, not code)."""
    return (f'<script type="text/plain" id="plotly-gz">{plotly_bundle()}</script>'
            f'<script type="application/json" id="plotly-template">{_script_json(_template())}</script>'
            f'<script type="application/json" id="plotly-config">{_script_json(CONFIG)}</script>')


def loader_script() -> str:
    """At the end of <body>: unpack plotly.js, then draw every figure."""
    return f"<script>{LOADER}</script>"
