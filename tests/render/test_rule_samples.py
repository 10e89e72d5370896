"""The exporter-side alert rules judge a check only where the sidecar would: with at least the check's
`min_samples` behind its signal (catalog.SAMPLE_COUNT_OF names the count), and once per DP replica whatever
the TP degree. Checked by the real promtool on the hand-written cases of alerts/tests/checks.test.yaml."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.lookups import all_alerts
from helpers.paths import ROOT
from sglang_tuning_exporter.core.catalog import SAMPLE_COUNT_OF, SIGNAL_UNITS
from sglang_tuning_exporter.guide.checks import Check, load_table
from sglang_tuning_exporter.render import command as render_command
from sglang_tuning_exporter.render.expressions import exporter_signal_expr
from sglang_tuning_exporter.render.options import RenderOptions

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")
TABLE = load_table()
CASES = ROOT / "alerts" / "tests" / "checks.test.yaml"
GATED = {c.alert: c for c in TABLE.checks if c.signal in SAMPLE_COUNT_OF}


def _count_label(check: Check) -> str:
    """The `signal` label of the check's sample count on /metrics (sglang_tuning_signal_amount)."""
    family, label, _ = SIGNAL_UNITS[SAMPLE_COUNT_OF[check.signal]]
    assert family == "signal_amount"
    return label


def _with_count(case: dict[str, Any], label: str, count: int) -> tuple[list[dict[str, Any]], int]:
    """The case's input series with every `label` count set to `count`; how many were changed."""
    out, changed = [], 0
    for s in case["input_series"]:
        if s["series"].startswith("sglang_tuning_signal_amount{") and f'signal="{label}"' in s["series"]:
            steps = re.findall(r"x(\d+)", str(s["values"]))
            s = {**s, "values": f"{count}x{steps[-1] if steps else 30}"}
            changed += 1
        out.append(s)
    return out, changed


def _promtool(tests: list[dict[str, Any]], tmp_path: Path, rule_file: Path) -> subprocess.CompletedProcess[str]:
    doc = {"rule_files": [str(rule_file)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "samples.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return subprocess.run([str(PROMTOOL), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=180, check=False)


def test_every_gated_expression_reads_its_count() -> None:
    """Each check with a sample count compares that count with its min_samples in the rule."""
    opts = RenderOptions()
    for c in GATED.values():
        expr = exporter_signal_expr(c, TABLE, opts)
        assert f'sglang_tuning_signal_amount{{job="sglang-tuning-exporter",signal="{_count_label(c)}"}} ' \
               f">= {c.min_samples}" in expr, c.id
        # The exporter "has" the signal (native alerts silenced) whatever its count.
        assert _count_label(c) not in exporter_signal_expr(c, TABLE, opts, judged=False), c.id


def test_config_min_samples_reaches_the_rule(tmp_path: Path) -> None:
    """A `checks.<id>.min_samples` of the config raises the gate of the rendered rule."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("checks:\n  queue_empty: {min_samples: 40}\n", encoding="utf-8")
    table, opts = render_command.apply_config(TABLE, str(cfg), RenderOptions())
    rules = [r for r in all_alerts(table, opts) if r["labels"]["check"] == "queue_empty"
             and r["labels"]["source"] == "exporter"]
    assert rules and all('signal="queue_samples"} >= 40' in r["expr"] for r in rules)


@pytest.mark.integration
@needs_promtool
def test_few_samples_keep_every_check_alert_silent(tmp_path: Path) -> None:
    """Every firing case of a check with a sample count: with min_samples - 1 samples the alert stays silent
    (the sidecar says unknown), with exactly min_samples it fires as before."""
    doc = yaml.safe_load(CASES.read_text(encoding="utf-8"))
    tests: list[dict[str, Any]] = []
    covered: set[str] = set()
    for case in doc["tests"]:
        for t in case.get("alert_rule_test") or []:
            check = GATED.get(t["alertname"])
            if check is None or not t.get("exp_alerts"):
                continue
            label = _count_label(check)
            few, changed = _with_count(case, label, check.min_samples - 1)
            assert changed, f"{case['name']}: no {label} series for {t['alertname']}"
            enough, _ = _with_count(case, label, check.min_samples)
            base = {k: v for k, v in case.items() if k not in ("input_series", "alert_rule_test", "name")}
            tests.append({**base, "name": f"{case['name']} / {t['alertname']}: {check.min_samples - 1} {label}",
                          "input_series": few, "alert_rule_test": [{**copy.deepcopy(t), "exp_alerts": []}]})
            tests.append({**base, "name": f"{case['name']} / {t['alertname']}: {check.min_samples} {label}",
                          "input_series": enough, "alert_rule_test": [copy.deepcopy(t)]})
            covered.add(t["alertname"])
    assert covered == set(GATED) & {r["alert"] for r in all_alerts(TABLE)}
    run = _promtool(tests, tmp_path, ROOT / "alerts" / "checks.rules.yaml")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


OOM_PHASE = re.compile(r'sglang_tuning_oom_events_total\{phase="([a-z_]+)"\}')


@pytest.mark.integration
@needs_promtool
def test_oom_checks_alert_once_for_a_tp2_server(tmp_path: Path) -> None:
    """Both TP ranks of one replica log (and count) the same out-of-memory error: one alert per level."""
    labels = 'job="sglang-tuning-exporter",instance="gpu-a:9470",model_name="qwen",dp_rank="0",pp_rank="0"'
    tests = []
    checks = [c for c in TABLE.checks if OOM_PHASE.search(str(c.promql["exporter"]))]
    assert "startup_headroom_oom" in {c.id for c in checks}
    for c in checks:
        m = OOM_PHASE.search(str(c.promql["exporter"]))
        assert m
        series = [{"series": f'sglang_tuning_oom_events_total{{{labels},tp_rank="{tp}",moe_ep_rank="",'
                             f'phase="{m.group(1)}"}}', "values": "0 1x20"} for tp in (0, 1)]
        levels = len(c.thresholds_for(TABLE.default_profile(), "throughput"))
        tests.append({"name": f"{c.id}: TP=2", "interval": "1m", "input_series": series,
                      "promql_expr_test": [{"expr": f'count(ALERTS{{alertname="{c.alert}",alertstate="firing"}})',
                                            "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": levels}]}]})
    run = _promtool(tests, tmp_path, ROOT / "alerts" / "checks.rules.yaml")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
