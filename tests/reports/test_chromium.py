"""The HTML report in a real headless Chromium with the network off: no console errors, no request leaves the
machine, every figure renders an svg, and the screenshot's plot areas are not blank."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from tunectl.reports.data import load_study
from tunectl.reports.render import compute, render

from tests.reports.cdp import CHROMIUM, inspect_page
from tunectl.store import StudyStore

pytestmark = [pytest.mark.chromium, pytest.mark.slow,
              pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="needs Debian's chromium")]
Image = pytest.importorskip("PIL.Image")
ImageStat = pytest.importorskip("PIL.ImageStat")

EXPECTED = {"glm5-search": {"fig-throughput", "fig-latency", "fig-history", "fig-importance", "fig-crashmap",
                            "fig-pareto"},
            "sweep-1": {"fig-throughput", "fig-latency", "fig-pareto"},
            "in-progress": {"fig-throughput", "fig-latency", "fig-history", "fig-pareto"}}


def _not_blank(img, p: dict) -> tuple[float, float]:
    """(pixel std-dev, share of non-white pixels) inside one figure's box."""
    box = img.crop((int(p["x"]), int(p["y"]), int(p["x"] + p["w"]), int(p["y"] + p["h"]))).convert("L")
    hist = box.histogram()
    inked = 1 - sum(hist[245:]) / max(1, sum(hist))
    return ImageStat.Stat(box).stddev[0], inked


@pytest.mark.parametrize("study", sorted(EXPECTED))
def test_report_renders_offline_without_errors(results_root, tmp_path, study):
    data = load_study(StudyStore(study, results_root))
    page = tmp_path / "report.html"
    page.write_text(render(compute(data)))
    shot = tmp_path / f"{study}.png"
    got = inspect_page(page, tmp_path / "chromium-profile", shot)

    assert got["errors"] == []
    assert got["external_requests"] == []
    assert {p["id"] for p in got["plots"]} == EXPECTED[study]
    for p in got["plots"]:
        assert p["svg"] and p["w"] > 300 and p["h"] > 200, p
        assert p["points"] + p["lines"] > 0, f"{p['id']} has no drawn traces"
    img = Image.open(shot)
    for p in got["plots"]:
        std, inked = _not_blank(img, p)
        assert std > 8 and inked > 0.01, (p["id"], std, inked)
    keep = os.environ.get("TUNECTL_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)


def test_the_check_sees_errors_and_requests_that_try_to_leave(tmp_path):
    """Negative control: a CDN script, a thrown error and a console.error are all caught."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head>"
                    "<script src='https://cdn.plot.ly/plotly-2.35.2.min.js'></script>"
                    "</head><body><div class='js-plotly-plot' id='fig-x'></div>"
                    "<script>console.error('boom'); Plotly.newPlot('fig-x', [])</script></body></html>")
    got = inspect_page(page, tmp_path / "chromium-profile", tmp_path / "bad.png", wait_s=2)
    assert any("cdn.plot.ly" in u for u in got["external_requests"])
    assert any("boom" in e for e in got["errors"]) and any("Plotly" in e for e in got["errors"])
    assert [p["svg"] for p in got["plots"]] == [False]
