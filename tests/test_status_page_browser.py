"""The status page in real headless Debian chromium: it renders, shows a firing check with its flag,
and a hostile label value stays text."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_tuning_exporter.collector import BuildInfo, TuningCollector, make_registry
from sglang_tuning_exporter.model import Finding, Observation, Rank
from sglang_tuning_exporter.state import LiveState
from sglang_tuning_exporter.web import WebApp, start_http

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = "<script>alert(1)</script>"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed (apt-get install chromium)"),
]


@pytest.fixture
def page_url() -> Iterator[str]:
    """A loopback server whose state has a firing check and a hostile model name."""
    st = LiveState(window_s=600, max_ranks=8, expire_after_s=600, enabled={"log": True, "metrics": True})
    st.set_server(version="0.5.23", model_name=HOSTILE, args={"schedule_conservativeness": 1.0})
    st.add_observations([Observation(1.0, "num_queue_reqs", 12, Rank(dp=0))], now=1.0)
    st.record_source("log", ok=True, duration_s=0.002, now=1.0)
    st.record_source("metrics", ok=False, duration_s=1.0, now=1.0, detail="connection refused")
    st.set_evaluation(signals={Rank(dp=0): {"retractions_per_minute": 4.0}}, findings=[
        Finding("retractions_frequent", "critical", {"dp": 0}, "--schedule-conservativeness", "increase", 1.0, 1.3,
                "Requests are retracted often", "4 retractions/min over 10 min", severity="critical")],
        document=None, now=1.0)
    snapshot = lambda: st.snapshot(2.0)  # noqa: E731
    build = BuildInfo("test", "3")
    app = WebApp(snapshot=snapshot, registry=make_registry(TuningCollector(snapshot, build)), ready=lambda: True,
                 build=build)
    server, thread = start_http(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def test_status_page_renders_in_chromium(page_url: str, tmp_path: Path) -> None:
    """The DOM chromium builds shows the firing check and flag; the hostile name is text, not a script."""
    proc = _chromium(tmp_path, "--dump-dom", page_url)
    dom = proc.stdout
    assert "SGLang tuning status" in dom, proc.stderr[-2000:]
    assert "retractions_frequent" in dom and "--schedule-conservativeness" in dom
    assert 'class="status critical"' in dom
    assert "<script" not in dom  # the page has no scripts, and the hostile value did not become one
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom


def test_status_page_screenshot(page_url: str, tmp_path: Path) -> None:
    """A screenshot is produced (the page lays out without external assets)."""
    shot = tmp_path / "status.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900", page_url)
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 5000
