"""The status page in real headless Debian chromium: it renders, shows a firing check with its flag,
and a hostile label value stays text."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.paths import ROOT
from sglang_tuning_exporter.core.model import Finding, Observation, Rank
from sglang_tuning_exporter.sidecar.collector import BuildInfo, TuningCollector, make_registry
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sidecar.web import WebApp, start_http

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = "<script>alert(1)</script>"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
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


# --------------------------------------------------------------------------------- sources down, phone width
DOCS_IMG = ROOT / "docs" / "img"
# Measures, inside the browser, the status page laid out in a frame of the given width: the page's
# own scroll width, and the right edge of the first plan flag and of the first finding's flag.
PROBE = """<!DOCTYPE html><html><body><iframe id="f" src="/" style="width:{w}px;height:900px;border:0"></iframe>
<script>
document.getElementById('f').onload = function () {{
  var d = this.contentDocument, out = document.createElement('pre');
  var first = function (sel) {{ var e = d.querySelector(sel); return e ? Math.round(e.getBoundingClientRect().right) : -1; }};
  var top = function (sel) {{ var e = d.querySelector(sel); return e ? Math.round(e.getBoundingClientRect().top) : -1; }};
  out.id = 'probe';
  out.textContent = 'scroll=' + d.documentElement.scrollWidth + ' plan_flag=' + first('#plan .flag') +
      ' finding_flag=' + first('.finding .flag') + ' banner_top=' + top('#blind') + ' ok_top=' + top('#ok') +
      ' ok_height=' + Math.round(d.getElementById('ok').getBoundingClientRect().height);
  document.body.appendChild(out);
}};
</script></body></html>"""


@pytest.fixture
def blind_app() -> Iterator[tuple[str, WebApp]]:
    """SGLang's /metrics unreachable, a short log: two findings, a plan, most checks blind."""
    from sglang_tuning_exporter.core.model import ServerState
    from sglang_tuning_exporter.guide.advisor import evaluate, findings_document
    from sglang_tuning_exporter.guide.checks import load_table
    from sglang_tuning_exporter.sidecar.web import Response

    table = load_table()
    server = ServerState("0.5.23", {"mem_fraction_static": 0.8, "schedule_conservativeness": 1.0,
                                    "enable_metrics": True}, "Qwen/Qwen2.5-7B-Instruct")
    signals = {Rank(): {"available_gpu_mem_gb": 13.5, "gpu_mem_total_gb": 80.0, "retractions_per_minute": 4.0,
                        "oom_prefill_count": 0.0, "oom_decode_count": 0.0, "oom_unknown_count": 0.0,
                        "oom_startup_count": 0.0, "queue_samples": 3.0, "decode_samples": 3.0, "kv_samples": 3.0}}
    findings = evaluate(table, signals, server)
    st = LiveState(window_s=600, max_ranks=8, expire_after_s=600, enabled={"log": True, "metrics": True})
    st.set_server(version=server.version, model_name=server.model_name, args=dict(server.args))
    st.record_source("log", ok=True, duration_s=0.002, now=1.0)
    st.record_source("metrics", ok=False, duration_s=1.0, now=1.0,
                     detail="http://127.0.0.1:30000/metrics: connection refused")
    st.set_evaluation(signals=signals, findings=findings, now=1.0, document=lambda: findings_document(
        findings=findings, signals=signals, server=server, profile=None, workload=None, table=table))
    snapshot = lambda: st.snapshot(2.0)  # noqa: E731
    build = BuildInfo("test", "3")
    app = WebApp(snapshot=snapshot, registry=make_registry(TuningCollector(snapshot, build)), ready=lambda: True,
                 build=build)
    page = app.handle

    def handle(method: str, target: str) -> Response:
        if target.startswith("/probe/"):
            width = int(target.rsplit("/", 1)[1])
            return Response(200, "text/html; charset=utf-8", PROBE.format(w=width).encode())
        return page(method, target)

    app.handle = handle  # type: ignore[method-assign]
    server_, thread = start_http(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server_.server_address[1]}", app
    finally:
        server_.shutdown()
        server_.server_close()
        thread.join(timeout=5)


def _probe(tmp_path: Path, base: str, width: int) -> dict[str, int]:
    proc = _chromium(tmp_path, "--dump-dom", "--virtual-time-budget=5000", f"{base}/probe/{width}")
    text = proc.stdout.split('<pre id="probe">', 1)[-1].split("</pre>", 1)[0]
    assert "scroll=" in text, proc.stderr[-2000:]
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split())}


@pytest.mark.parametrize("width", [1200, 390])
def test_sources_down_lead_the_page_and_it_fits_the_width(blind_app: tuple[str, WebApp], tmp_path: Path,
                                                          width: int, update_golden: bool) -> None:
    """Metrics down is said at the top (above every check), the plan's and the findings' flags are on
    screen at desktop and phone width, and the ok checks take a line or two, not a row each."""
    base, app = blind_app
    m = _probe(tmp_path, base, width)
    assert m["scroll"] <= width, m  # no horizontal scrolling of the page itself
    assert 0 < m["plan_flag"] <= width and 0 < m["finding_flag"] <= width, m
    assert 0 <= m["banner_top"] < 200 and m["banner_top"] < m["ok_top"], m
    # Compact: the ok checks as chips, a line or two at desktop width; on a phone, where one long check name
    # fills a line, at most a short line each (small type), never a tall row with its evidence.
    chips = app.status_page().count('class="chip finding-ok"')
    assert chips >= 5 and m["ok_height"] < (120 if width > 600 else 22 * chips), (chips, m)
    shot = tmp_path / "status.png"
    _chromium(tmp_path, f"--screenshot={shot}", f"--window-size={width},{1400 if width > 600 else 1600}",
              "--hide-scrollbars", f"{base}/")
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if update_golden:  # the README's and docs' screenshots
        name = "status-page.png" if width > 600 else "status-page-phone.png"
        shutil.copyfile(shot, DOCS_IMG / name)


def test_blind_page_names_the_blind_checks(blind_app: tuple[str, WebApp]) -> None:
    """The banner names the source, why it is down, and the checks without a verdict; the verdict line
    never reads as healthy."""
    _, app = blind_app
    html = app.status_page()
    banner = html.split('id="blind"', 1)[1].split("</div>", 1)[0]
    assert "metrics source down" in banner and "connection refused" in banner
    assert "<code>queue_overloaded</code>" in banner and "<code>retractions_frequent</code>" not in banner
    assert html.index('id="blind"') < html.index('id="plan"') < html.index('id="checks"')
    assert "could not be judged" in html.split('id="verdict"', 1)[1].split("</p>", 1)[0]


def test_status_page_tables_fit_a_phone(blind_app: tuple[str, WebApp], tmp_path: Path) -> None:
    """At 390 px nothing of the status page sticks out to the right: every table, the plan and the findings
    fit or scroll inside their own box (issue #24)."""
    from helpers.browser import layout

    _, app = blind_app
    got = layout(tmp_path, app.status_page(), 390)
    assert got["scroll"] <= 390 and got["outside"] == [], got
    assert got["tables"] >= 1
