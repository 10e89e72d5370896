"""Issue 25's Done-when, end to end: a 0.5.23 server (the recorded /metrics moved by the stand-in) in a retraction
storm is restarted with `--schedule-conservativeness 1.3`; its retractions stop but its time to first token
doubles. The real exporter scrapes it and reads its log, a real Prometheus scrapes both with the SLO burn rules
loaded (rendered from the exporter's `slo:` config) and sends to a real Alertmanager. Then:
(a) the sidecar exports the TTFT quantiles, equal to `histogram_quantile` over the same scraped buckets;
(b) the TTFT burn alert fires with the check and flag in its annotations and reaches Alertmanager's receiver;
(c) the server dashboard's latency panel, evaluated by that Prometheus, shows the sidecar's number;
(d) `/api/changes` calls the change `worse` and states the trade (retractions cut, p95 TTFT doubled)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from integration.dashboard_queries import DASHBOARDS, concrete, queries
from integration.stack import Stack, TargetSpec, Timing, missing_binaries, wait_for
from integration.webhook import WebhookReceiver

pytestmark = pytest.mark.integration

# The exporter's window is 60 s: the retraction check judges an absence only over a minute of data, so the
# windows before and after the change each need one (changes.py compares whole windows).
TIMING = Timing(exporter_window_s=60)
SLO = "slo: {ttft_p95_seconds: 0.6, objective: 0.99}\n"
BEFORE_P95, AFTER_P95 = 0.39, 0.79  # TTFT 0.3 s then 0.7 s: PromQL's interpolation in (0.2, 0.4] and (0.6, 0.8]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, WebhookReceiver]]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Debian binaries not installed: {', '.join(missing)}")
    work = tmp_path_factory.mktemp("latency-e2e")
    config = work / "exporter.yaml"
    config.write_text(SLO, encoding="utf-8")
    webhook = WebhookReceiver().serve_in_thread()
    st = Stack(work / "stack", [TargetSpec("latency", "retraction_storm", "colon")], webhook.url, timing=TIMING,
               config=config)
    try:
        st.start()
        yield st, webhook
    finally:
        st.stop()
        webhook.close()


def _exporter_ttft(st: Stack) -> float | None:
    """The sidecar's `sglang_tuning_signal_seconds{signal="ttft_p95"}` as its /metrics says now."""
    t = st.target("latency")
    text = requests.get(f"http://{t.exporter_instance}/metrics", timeout=5).text
    m = re.search(r'^sglang_tuning_signal_seconds\{[^}]*signal="ttft_p95"[^}]*\} (\S+)$', text, re.M)
    return float(m[1]) if m else None


def _changes(st: Stack) -> list[dict[str, Any]]:
    t = st.target("latency")
    return list(requests.get(f"http://{t.exporter_instance}/api/changes", timeout=5).json()["changes"])


def _ttft_panel() -> str:
    dash = json.loads((DASHBOARDS / "sglang-tuning-server.json").read_text(encoding="utf-8"))
    # The latency panel: the sidecar's p95 quantiles (TTFT among them).
    (expr,) = [e for where, e in queries(dash) if where.startswith("panel 'Latency p95")]
    assert "ttft_p95" in expr, expr
    return concrete(expr)


def test_done_when(stack: tuple[Stack, WebhookReceiver]) -> None:
    st, webhook = stack
    t = st.target("latency")
    # Before: the storm's TTFT quantile over a whole window of the exporter (its first evaluation records an
    # empty window; the next one, a window later, holds the storm).
    assert wait_for(lambda: _exporter_ttft(st) == pytest.approx(BEFORE_P95, abs=0.01), 60), (
        f"no ttft_p95 {BEFORE_P95} on the exporter\n{st.describe('latency')}")
    assert wait_for(lambda: requests.get(f"http://{t.sglang_instance}/_standin/log", timeout=5).json() >= 150,
                    120), "the log has not run 75 s"
    requests.post(f"http://{t.sglang_instance}/_standin/restart", data="conservative_slow_ttft",
                  timeout=5).raise_for_status()

    # (d) the verdict, once a whole window after the restart is in.
    def judged() -> dict[str, Any] | None:
        found = [c for c in _changes(st) if c["flag"] == "--schedule-conservativeness"]
        return found[-1] if found and found[-1]["verdict"] != "inconclusive" else None
    change = wait_for(judged, 150, interval_s=2.0)
    assert change, f"no verdict on the change: {_changes(st)}\n{st.describe('latency')}"
    why = change["why"]
    assert change["verdict"] == "worse", why
    assert "retractions_frequent critical -> ok" in why, why
    # The quantiles move with where the windows fall in real time (0.39 -> 0.79 s, +102 or +103 %): the text
    # states the two p95s the sidecar saw and the rise between them.
    m = re.search(r"p95 TTFT ([\d.]+) s -> ([\d.]+) s \(\+(\d+) %\)", why)
    assert m, why
    before, after, rise = float(m.group(1)), float(m.group(2)), int(m.group(3))
    assert before == pytest.approx(BEFORE_P95, abs=0.02) and after == pytest.approx(AFTER_P95, abs=0.02), why
    assert rise >= 80 and abs(rise - (after / before - 1) * 100) <= 3, why
    assert "go back to --schedule-conservativeness 0.3" in why, why

    # (a) the sidecar's quantile now, and PromQL's over SGLang's buckets as Prometheus scraped them.
    sidecar = _exporter_ttft(st)
    assert sidecar == pytest.approx(AFTER_P95, abs=0.01)
    prom = st.query('histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket'
                    f'{{instance="{t.sglang_instance}"}}[40s])))')
    assert prom and float(prom[0]["value"][1]) == pytest.approx(sidecar, abs=0.01), prom

    # (c) the dashboard's TTFT panel, variables substituted, as that Prometheus evaluates it.
    panel = [r for r in st.query(_ttft_panel()) if r["metric"].get("instance") == t.exporter_instance
             and r["metric"].get("signal") == "ttft_p95"]
    assert panel and float(panel[0]["value"][1]) == pytest.approx(sidecar, abs=0.01), panel

    # (b) the fast TTFT burn: every request is now slower than the 0.6 s target, 100x the 1 % budget.
    def burning() -> list[dict[str, Any]]:
        return [a for a in st.firing() if a["labels"]["alertname"] == "SGLangSLOTTFTBurnFast"]
    fired = wait_for(burning, 60)
    assert fired, f"no burn alert; rules: {[r['name'] for r in st.rules() if 'SLO' in r['name']]}"
    ann = fired[0]["annotations"]
    assert (ann["check"], ann["flag"]) == ("ttft_long_prompts", "--chunked-prefill-size"), ann
    assert "Most likely: ttft_long_prompts (--chunked-prefill-size)" in ann["description"], ann
    paged = wait_for(lambda: [a for p, a in webhook.firing() if a["labels"].get("alertname") == "SGLangSLOTTFTBurnFast"
                              and p.endswith("/page")], 30)
    assert paged and paged[0]["annotations"]["flag"] == "--chunked-prefill-size", webhook.notifications()


def test_rendered_slo_rules_are_loaded(stack: tuple[Stack, WebhookReceiver]) -> None:
    """The stack's Prometheus runs the SLO group rendered from the exporter's config, every rule healthy."""
    st, _ = stack
    names = {Path(p).name for p in st.rule_files}
    assert "slo.rules.yaml" in names
    slo = [r for r in st.rules() if r["name"].startswith(("SGLangSLO", "instance:sglang_slo_"))]
    assert slo and all(r.get("health") == "ok" for r in slo), [(r["name"], r.get("lastError")) for r in slo]
