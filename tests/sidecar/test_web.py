"""Tests for the HTTP layer: routes, status page content and escaping, and a real loopback server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from sglang_tuning_exporter.core.model import Finding, Observation, Rank
from sglang_tuning_exporter.sidecar.collector import BuildInfo, TuningCollector, make_registry
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sidecar.web import WebApp, start_http

BUILD = BuildInfo("0.0.0-test", "3.11")
HOSTILE = "<script>alert(1)</script>"


def _app(model: str = "Qwen/Qwen2.5-7B-Instruct", evaluated: bool = True) -> tuple[WebApp, LiveState]:
    st = LiveState(window_s=600, max_ranks=8, expire_after_s=600, enabled={"log": True, "metrics": True})
    st.set_server(version="0.5.23", model_name=model, args={"schedule_conservativeness": 1.0})
    st.add_observations([Observation(1.0, "num_queue_reqs", 0, Rank(dp=0))], now=1.0)
    st.record_source("log", ok=True, duration_s=0.001, now=1.0)
    st.record_source("metrics", ok=False, duration_s=0.5, now=1.0, detail="connection refused")
    if evaluated:
        st.set_evaluation(signals={Rank(dp=0): {"retractions_per_minute": 4.0}}, findings=[
            Finding("retractions_frequent", "critical", {"dp": 0}, "--schedule-conservativeness", "increase",
                    1.0, 1.3, "Requests are retracted often", "4.0 retractions/min over 600 s",
                    severity="critical", guide="~1 retraction per minute is OK", tradeoff="lower throughput"),
            Finding("queue_empty", "ok", {"dp": 0}, None, "send more requests", None, None, "", "")],
            document=lambda: {"profile": "p", "findings": [{"check": "retractions_frequent"}]}, now=2.0)
    snapshot = lambda: st.snapshot(3.0)  # noqa: E731
    app = WebApp(snapshot=snapshot, registry=make_registry(TuningCollector(snapshot, BUILD)),
                 ready=lambda: evaluated, build=BUILD)
    return app, st


def test_health_ready_and_unknown_paths() -> None:
    """/-/healthy is always 200; /-/ready waits for the first evaluation; unknown paths 404."""
    app, _ = _app(evaluated=False)
    assert app.handle("GET", "/-/healthy").status == 200
    assert app.handle("GET", "/-/ready").status == 503
    assert app.handle("GET", "/nope").status == 404
    assert app.handle("POST", "/metrics").status == 405
    ready, _ = _app(evaluated=True)
    assert ready.handle("GET", "/-/ready").status == 200


def test_metrics_endpoint_serves_our_registry() -> None:
    """/metrics is the Prometheus text format of our collector (query strings ignored)."""
    app, _ = _app()
    resp = app.handle("GET", "/metrics?x=1")
    assert resp.status == 200 and resp.content_type.startswith("text/plain")
    assert b"sglang_tuning_up 0.0" in resp.body
    assert b"sglang_tuning_check_status{" in resp.body


def test_findings_api_returns_the_document() -> None:
    """/api/findings returns the advisor's diagnose document as JSON."""
    app, _ = _app()
    resp = app.handle("GET", "/api/findings")
    assert resp.content_type == "application/json"
    doc = json.loads(resp.body)
    fresh = doc.pop("freshness")  # added by the sidecar: how fresh each source's figures are
    assert doc == {"profile": "p", "findings": [{"check": "retractions_frequent"}]}
    assert fresh["log"]["state"] == "waiting" and all(("state" in e and "note" in e) or e["state"] == "fresh"
                                                      for e in fresh.values())


def test_status_page_shows_checks_sources_and_links() -> None:
    """The page lists the firing check with flag and suggestion, sources and their health, links."""
    app, _ = _app()
    html = app.handle("GET", "/").body.decode()
    assert '<meta http-equiv="refresh"' in html
    assert "retractions_frequent" in html and "--schedule-conservativeness" in html
    assert "1.3" in html and "4.0 retractions/min over 600 s" in html
    assert html.index("retractions_frequent") < html.index("queue_empty")  # critical first
    assert "connection refused" in html and 'class="down"' in html
    assert 'href="/metrics"' in html and 'href="/api/findings"' in html
    assert "http://" not in html and "https://" not in html  # no external assets


def test_status_page_escapes_hostile_label_values() -> None:
    """A model name carrying markup is rendered as text."""
    app, _ = _app(model=HOSTILE)
    html = app.handle("GET", "/").body.decode()
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_real_loopback_server() -> None:
    """The threading server answers on 127.0.0.1 with an ephemeral port and shuts down cleanly."""
    app, _ = _app()
    server, thread = start_http(app, "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/healthy", timeout=5) as resp:
            assert resp.status == 200 and resp.read() == b"OK\n"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/missing", timeout=5)
            raise AssertionError("expected 404")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_plan_steps_show_values_as_every_other_format() -> None:
    """The page's plan spells a step's values as diagnose and the report do (guide/plan.plan_step_values):
    a whole float without `.0`, a missing proposal said in words."""
    app, st = _app()
    steps = [{"step": 1, "flag": "--chunked-prefill-size", "action": "decrease", "current": 8192.0, "to": None,
              "checks": ["prefill_oom"], "why": "prefill ran out of memory", "then": "watch OOMs"},
             {"step": 2, "flag": "--schedule-conservativeness", "action": "increase", "current": 1.0, "to": 1.3,
              "checks": ["retractions_frequent"], "why": "retractions", "then": "watch retractions"}]
    snap = st.snapshot(3.0)
    st.set_evaluation(signals={Rank(dp=0): {"retractions_per_minute": 4.0}}, findings=list(snap.findings),
                      document=lambda: {"profile": "p", "findings": [], "plan": steps}, now=2.0)
    page = app.handle("GET", "/").body.decode()
    assert "decrease <code class=\"flag\">--chunked-prefill-size</code>: 8192 &rarr; a value to measure first (see why)" \
        in page
    assert "increase <code class=\"flag\">--schedule-conservativeness</code>: 1 &rarr; 1.3" in page
