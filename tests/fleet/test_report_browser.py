"""The html fleet report opened in real headless chromium: it renders, the SVG charts are there, nothing runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_tuning_exporter.core.model import Finding
from sglang_tuning_exporter.fleet import formats as report_formats
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet.report import FleetReport, InstanceReport

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
END = 1_793_491_200.0
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">:9470"


def _report() -> FleetReport:
    """Two mis-tuned servers with chart data (one with a hostile name), one healthy, plus drift."""
    def f(check: str, status: str, flag: str | None, action: str) -> Finding:
        return Finding(check=check, status=status, rank={}, flag=flag, action=action, current=1.0, suggested=1.3,
                       summary="s", evidence="retractions_per_minute=6 over the last 1440 min", tradeoff="t")

    pts = [(END - 86400 + 720 * k, float(k % 17)) for k in range(121)]
    return FleetReport(
        prometheus="http://127.0.0.1:9090", start=END - 86400, end=END, queries=31, profile="docs-2025",
        workload="throughput", selector="",
        instances=(InstanceReport("10.0.0.1:9470", "m", "0.5.23", {}, (f("retractions_frequent", "ok", None, "x"),)),
                   InstanceReport("10.9.0.1:9470", "m", "0.5.23", {},
                                  (f("retractions_frequent", "critical", "--schedule-conservativeness", "increase"),)),
                   InstanceReport(HOSTILE, "m", "0.5.23", {}, (f("queue_empty", "warning", None, "client"),))),
        drift=(fleet.Drift("m", "mem_fraction_static", {"0.88": ["10.0.0.1:9470"], "0.8": [HOSTILE]}),),
        checks=("queue_empty", "retractions_frequent"),
        charts={name: {"queue": pts, "token_usage": [(t, v / 17) for t, v in pts], "retractions_per_minute": pts}
                for name in ("10.9.0.1:9470", HOSTILE)})


def test_html_report_renders_in_chromium(tmp_path: Path) -> None:
    """chromium --dump-dom shows the sections, one status bar plus three sparklines per mis-tuned server."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (Debian package chromium)")
    page = tmp_path / "report.html"
    page.write_text(report_formats.render(_report(), "html"), encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90)
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert "<h1>SGLang fleet tuning report</h1>" in dom
    for section in ("summary", "mistuned", "drift", "matrix"):
        assert f'id="{section}"' in dom
    assert len(re.findall(r"<svg\b", dom)) == 1 + 3 * 2
    assert len(re.findall(r"<polyline\b", dom)) == 3 * 2
    # The hostile instance name is text, not an element: no <img>, and its onerror never ran.
    assert "<img" not in dom and "<title>SGLang fleet tuning report</title>" in dom
    assert "&lt;img src=x" in dom


def test_html_report_fits_a_phone(tmp_path: Path) -> None:
    """At 390 px the page does not scroll sideways: the status bar shrinks to the width and every table
    (the instance x check matrix too) scrolls inside its own box (issue #24: cut off at the right)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (Debian package chromium)")
    from helpers.browser import layout

    for width in (390, 1200):
        got = layout(tmp_path, report_formats.render(_report(), "html"), width)
        assert got["scroll"] <= width and got["outside"] == [], (width, got)
        assert got["tables"] >= 4
