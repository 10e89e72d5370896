"""Latency SLOs (issue 25, part 3): the config's `slo:` rendered as multi-window, multi-burn-rate alerts over
SGLang's histograms, checked by the real promtool: the fast burn pages with the check and flag to try."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from conformance.promql import concrete
from helpers.lookups import anchors
from helpers.paths import ROOT
from helpers.promql_lint import metric_names
from helpers.tsdb import PROMTOOL, build_blocks, missing_prometheus, running_prometheus
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import ConfigError, parse_config
from sglang_tuning_exporter.render import dashboards as render_dashboards
from sglang_tuning_exporter.render import slo
from sglang_tuning_exporter.render.options import RenderOptions
from sglang_tuning_exporter.render.rules import group_yaml, groups

TABLE = load_table()
SLO = {"ttft_p95_seconds": 2.0, "itl_p95_seconds": 0.1, "objective": 0.99}


def slo_rules(tmp_path: Path) -> Path:
    (group,) = [g for g in groups(TABLE, RenderOptions(slo=SLO)) if g.file == "slo.rules.yaml"]
    out = tmp_path / "slo.rules.yaml"
    out.write_text(group_yaml(group), encoding="utf-8")
    return out


def test_config_slo_is_validated() -> None:
    assert parse_config({"slo": SLO}, TABLE).slo == SLO
    with pytest.raises(ConfigError) as e:
        parse_config({"slo": {"ttft_p95_seconds": 1.5, "objective": 1.2, "p99": 3}}, TABLE)
    text = "\n".join(e.value.problems)
    assert "bucket bounds" in text and "slo.objective" in text and "unknown key 'p99'" in text


def test_no_slo_no_group() -> None:
    assert not [g for g in groups(TABLE, RenderOptions()) if g.file == "slo.rules.yaml"]


def test_burn_pairs_and_annotations(tmp_path: Path) -> None:
    rules = yaml.safe_load(slo_rules(tmp_path).read_text())["groups"][0]["rules"]
    alerts = {(r["alert"], r["labels"]["severity"]): r for r in rules if "alert" in r}
    assert set(alerts) == {("SGLangSLOTTFTBurnFast", "critical"), ("SGLangSLOTTFTBurnSlow", "warning"),
                           ("SGLangSLOITLBurnFast", "critical"), ("SGLangSLOITLBurnSlow", "warning")}
    fast = alerts[("SGLangSLOTTFTBurnFast", "critical")]
    assert "rate1h > 0.144" in fast["expr"] and "rate5m > 0.144" in fast["expr"]
    assert (fast["annotations"]["check"], fast["annotations"]["flag"]) == ("ttft_long_prompts", "--chunked-prefill-size")
    slow = alerts[("SGLangSLOITLBurnSlow", "warning")]
    assert "rate6h > 0.06" in slow["expr"] and "rate30m > 0.06" in slow["expr"]
    assert slow["annotations"]["flag"] == "--max-running-requests"
    records = {r["record"] for r in rules if "record" in r}
    assert "instance:sglang_slo_ttft_slow_ratio:rate5m" in records and len(records) == 16
    burn = {r["record"]: r["expr"] for r in rules if "record" in r}["instance:sglang_slo_itl_burn_rate:rate1h"]
    assert burn == "instance:sglang_slo_itl_slow_ratio:rate1h / 0.01"


def _series(slow_per_min: int) -> list[dict[str, str]]:
    # 100 requests a minute; `slow_per_min` of them slower than the 2 s bucket.
    labels = 'job="sglang",instance="gpu-a:30000",model_name="qwen"'
    return [
        {"series": f'sglang:time_to_first_token_seconds_bucket{{{labels},le="2.0"}}',
         "values": f"0+{100 - slow_per_min}x90"},
        {"series": f'sglang:time_to_first_token_seconds_count{{{labels}}}', "values": "0+100x90"},
    ]


@pytest.mark.integration
def test_fast_burn_pages_with_the_flag_under_promtool(tmp_path: Path) -> None:
    rules = slo_rules(tmp_path)
    fast = {"eval_time": "20m", "alertname": "SGLangSLOTTFTBurnFast"}
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [
        {"name": "20 % of requests slower than 2 s: 20x the 1 % budget", "interval": "1m",
         "input_series": _series(20),
         "alert_rule_test": [{**fast, "eval_time": "1m", "exp_alerts": []}, {**fast, "exp_alerts": [{
             "exp_labels": {"job": "sglang", "instance": "gpu-a:30000", "model_name": "qwen", "severity": "critical",
                            "check": "slo_ttft", "source": "sglang"},
             "exp_annotations": {
                 "summary": "SGLang is burning its TTFT SLO error budget 14.4x too fast",
                 "description": "20% of requests on gpu-a:30000 were slower than 2.0 s (TTFT) over 1h and 5m; the "
                                "objective (99 % within 2.0 s) allows 1 %. Most likely: ttft_long_prompts "
                                "(--chunked-prefill-size); rule out latency_queue_dominates (client side) first.",
                 "runbook_url": RenderOptions().runbook_url + "#sglangslottftburnfast",
                 "dashboard_url": "http://localhost:3000/d/sglang-tuning-server/sglang-tuning-server"
                                  "?from=now-3h&to=now&var-instance=gpu-a%3A30000",
                 "check": "ttft_long_prompts", "flag": "--chunked-prefill-size", "action": "increase",
                 "suggested_value": "see the exporter's finding for ttft_long_prompts",
                 "guide": "If long prompts dominate: Increase --chunked-prefill-size; Enable Piecewise CUDA Graph"},
         }]}]},
        {"name": "0.5 % slower: within the budget, silent", "interval": "1m",
         "input_series": [{**s, "values": s["values"].replace("0+80x", "0+99.5x").replace("0+100x", "0+100x")}
                          for s in _series(20)],
         "alert_rule_test": [fast, {**fast, "alertname": "SGLangSLOTTFTBurnSlow"}]},
    ]}
    tests["tests"][1]["alert_rule_test"] = [{**t, "exp_alerts": []} for t in tests["tests"][1]["alert_rule_test"]]
    test_file = tmp_path / "slo.test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    run = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def _recent_history(folder: Path, now: float) -> list[Path]:
    """The last 70 minutes of one SGLang's TTFT histogram, scraped every 15 s: 100 requests a minute, 20 of
    them slower than 2 s."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = 'job="sglang",instance="gpu-a:30000",model_name="qwen"'
    start = int(now) - 70 * 60
    steps = range(0, 70 * 4 + 1)
    out = folder / "ttft.om"
    with out.open("w") as f:
        for head, per_min in ((f'sglang:time_to_first_token_seconds_bucket{{{labels},le="2.0"}}', 80),
                              (f'sglang:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}}', 100),
                              (f"sglang:time_to_first_token_seconds_count{{{labels}}}", 100)):
            for k in steps:
                f.write(f"{head} {k * per_min / 4} {start + k * 15}\n")
        f.write("# EOF\n")
    return [out]


def _slo_row_targets() -> list[tuple[str, dict[str, Any]]]:
    """(panel title, target) of the SLO burn row of both generated dashboards."""
    out = []
    for text in render_dashboards.generate(TABLE).values():
        row = None
        for p in json.loads(text)["panels"]:
            if p["type"] == "row":
                row = p["title"]
            elif row == "SLO burn":
                out += [(p["title"], t) for t in p["targets"]]
    return out


def test_dashboards_draw_the_slo_row_without_an_slo() -> None:
    """The row is always there (the burn rates carry the objective); with no SLO rules loaded it says so."""
    targets = _slo_row_targets()
    assert len(targets) == 4 + 4 + 2 + 2 + 4
    names = {n for _, t in targets for n in metric_names(t["expr"]).metrics}
    assert names <= slo.record_names() and {n.split(":")[1] for n in names} == {
        "sglang_slo_ttft_burn_rate", "sglang_slo_itl_burn_rate"}
    for text in render_dashboards.generate(TABLE).values():
        for p in json.loads(text)["panels"]:
            if any(t in targets for t in [(p["title"], x) for x in p.get("targets", [])]):
                assert p["fieldConfig"]["defaults"]["noValue"] == slo.NO_SLO
    rendered = {r["record"] for g in groups(TABLE, RenderOptions(slo=SLO)) for r in g.rules
                for r in [r.body] if "record" in r and r["record"].startswith("instance:sglang_slo_")}
    assert rendered == slo.record_names()


@pytest.mark.integration
def test_fast_burn_fires_in_a_real_prometheus_with_the_flag(tmp_path: Path) -> None:
    """End to end: the rendered rules loaded by a real Prometheus over a backfilled hour of 20 % slow TTFT."""
    reason = missing_prometheus()
    if reason:
        pytest.skip(reason)
    (group,) = [g for g in groups(TABLE, RenderOptions(slo=SLO, override_for_s=0.0)) if g.file == "slo.rules.yaml"]
    rules = tmp_path / "slo.rules.yaml"
    rules.write_text(group_yaml(group), encoding="utf-8")
    build_blocks(_recent_history(tmp_path / "om", time.time()), tmp_path / "data")
    with running_prometheus(tmp_path / "data", rule_files=[rules], evaluation_interval="1s") as url:
        deadline = time.monotonic() + 60
        firing: list[dict[str, object]] = []
        while time.monotonic() < deadline and not firing:
            alerts = requests.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            firing = [a for a in alerts if a["labels"]["alertname"] == "SGLangSLOTTFTBurnFast"
                      and a["state"] == "firing"]
            if not firing:
                time.sleep(0.5)  # a real Prometheus evaluating its rules every second
        assert firing, "the fast burn never fired"
        notes = firing[0]["annotations"]
        assert isinstance(notes, dict)
        assert (notes["flag"], notes["check"]) == ("--chunked-prefill-size", "ttft_long_prompts")
        assert notes["description"].startswith("20% of requests on gpu-a:30000 were slower than 2.0 s")
        ratio = requests.get(f"{url}/api/v1/query", timeout=10,
                             params={"query": "instance:sglang_slo_ttft_slow_ratio:rate1h"}).json()
        assert float(ratio["data"]["result"][0]["value"][1]) == pytest.approx(0.2, abs=0.01)
        # The dashboards' SLO row over the same Prometheus: the burn the alert compares with 14.4, i.e. its
        # $value (the 1h slow share) over the 1 % budget, for every window; no ITL histogram, no ITL series.
        burn = float(str(firing[0]["value"])) / 0.01
        assert burn == pytest.approx(20, abs=1)
        seen = 0
        for title, tgt in _slo_row_targets():
            got = requests.get(f"{url}/api/v1/query", timeout=10,
                               params={"query": concrete(tgt["expr"], {})}).json()["data"]["result"]
            values = [float(r["value"][1]) for r in got]
            if "sglang_slo_itl_" in tgt["expr"]:
                assert values == [], (title, tgt["expr"])
                continue
            expected = 1 - burn if tgt["expr"].startswith("1 - ") else burn
            assert values == [pytest.approx(expected, rel=0.02)], (title, tgt["expr"])
            seen += 1
        assert seen == 4 + 1 + 1 + 2  # server: 4 windows and the budget; fleet: the top 10 and the 1h/6h table


def test_every_burn_alert_names_its_check_and_flag_and_has_a_runbook_section() -> None:
    """Every SLO kind and severity: the annotations name the check most likely responsible, its flag and
    direction (as the table has them), and the committed runbook (rendered without an slo:) has the section
    the alert's runbook_url points at."""
    by_id = TABLE.by_id()
    committed = anchors((ROOT / "alerts" / "runbook.md").read_text(encoding="utf-8"))
    alerts = [r for g in groups(TABLE, RenderOptions(slo=SLO)) for r in (x.body for x in g.rules) if "alert" in r
              and r["labels"]["check"].startswith("slo_")]
    assert len(alerts) == len(slo.SLO_HISTOGRAMS) * len(slo.BURN_PAIRS)
    for r in alerts:
        target = next(t for t in slo.SLO_HISTOGRAMS if r["labels"]["check"] == f"slo_{slo.kind(t)}")
        check = by_id[slo.SLO_HISTOGRAMS[target][2]]
        notes = r["annotations"]
        assert (notes["check"], notes["flag"], notes["action"]) == (check.id, check.flag, check.action)
        assert f"Most likely: {check.id} ({check.flag})" in notes["description"]
        assert notes["runbook_url"].split("#")[1] in committed, r["alert"]
