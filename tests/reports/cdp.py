"""A small DevTools-protocol client for the report check: headless Debian chromium, network off, a fresh
profile; loads a file:// page and returns console errors, exceptions, requests that tried to leave the
machine, each plot div's state, and a full-page screenshot."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         # network off: every proxied request goes to a closed port, every name resolves to nothing
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--remote-debugging-port=0", "--window-size=1400,1000"]
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome:", "devtools:")
PLOTS_JS = """JSON.stringify(Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => {
  const r = d.getBoundingClientRect();
  return {id: d.id, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
          svg: d.querySelector('svg.main-svg') !== null,
          points: d.querySelectorAll('.point, .bars path').length,
          lines: d.querySelectorAll('.scatterlayer .js-line').length};
}))"""


class Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float = 30) -> dict[str, Any]:
        self.next_id += 1
        my = self.next_id
        await self.ws.send_json({"id": my, "method": method, "params": params or {}})
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    async def pump(self, seconds: float) -> None:
        try:
            while True:
                msg = await self.ws.receive_json(timeout=seconds)
                self.events.append(msg)
        except asyncio.TimeoutError:
            return

    async def evaluate(self, expr: str) -> Any:
        res = await self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        return res["result"].get("value")


def start(profile_dir: Path, tmp: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "TMPDIR": tmp})
    port_file = profile_dir / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.is_file() and port_file.read_text().strip():
            return proc, int(port_file.read_text().split()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError("chromium did not open its DevTools port within 60 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Our own chromium only: its process group, recorded at start."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def _inspect(port: int, url: str, shot: Path, wait_s: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            s = Session(ws)
            for domain in ("Page", "Runtime", "Log", "Network"):
                await s.call(f"{domain}.enable")
            await s.call("Page.navigate", {"url": url})
            plots = await _wait_plots(s, wait_s)
            await s.pump(0.5)
            size = json.loads(await s.evaluate(
                "JSON.stringify([document.documentElement.scrollWidth,"
                " document.documentElement.scrollHeight])"))
            img = await s.call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}}, timeout=60)
            shot.write_bytes(base64.b64decode(img["data"]))
            return {"plots": plots, **_problems(s.events)}


async def _wait_plots(s: Session, wait_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + wait_s
    plots: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        ready = await s.evaluate("document.readyState")
        plots = json.loads(await s.evaluate(PLOTS_JS) or "[]") if ready == "complete" else []
        if plots and all(p["svg"] for p in plots):
            return plots
        await s.pump(0.2)
    return plots


def _problems(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    errors, leaks = [], []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            errors.append(d.get("exception", {}).get("description") or d.get("text") or json.dumps(d)[:500])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            errors.append(p["entry"].get("text", ""))
        elif m == "Network.requestWillBeSent" and not p["request"]["url"].startswith(LOCAL_SCHEMES):
            leaks.append(p["request"]["url"])
    return {"errors": errors, "external_requests": leaks}


def inspect_page(html_file: Path, profile_dir: Path, shot: Path, wait_s: float = 30) -> dict[str, Any]:
    # Chromium leaves its singleton-socket folder in TMPDIR; a short one of our own (a socket path is at most 107
    # bytes, too few for pytest's tmp_path) that goes with the browser.
    with tempfile.TemporaryDirectory(prefix="tc-cdp-") as tmp:
        proc, port = start(profile_dir, tmp)
        try:
            return asyncio.run(_inspect(port, html_file.resolve().as_uri(), shot, wait_s))
        finally:
            stop(proc)
