"""The `selector` render option (a mixin's `_config` selector): its matchers reach every rule expression,
recording rule, annotation lookup and dashboard query; groupings that keep a server apart keep its labels."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sglang_tuning_exporter.cli import main
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.render import dashboards as render_dashboards
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render.options import (
    OptionsError,
    RenderOptions,
    options_from_mapping,
    parse_selector,
)

TABLE = load_table()
SELECTOR = 'cluster="prod",namespace=~"llm-.*"'
OPTS = options_from_mapping({"selector": 'cluster="prod", namespace=~"llm-.*"'})
_KEYWORDS = {"by", "on", "without", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}


def unscoped_selectors(expr: str, selector: str) -> list[str]:
    """The vector selectors of a PromQL expression that lack `selector`: a `{...}` block without it, or a
    metric name with no braces at all."""
    bad = [b for b in re.findall(r"\{[^{}]*\}", expr) if selector not in b]
    rest = re.sub(r"[\w:]*\{[^{}]*\}", " ", expr)  # selectors with braces, judged above
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', " ", rest)  # string arguments (label_replace)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)  # ranges, subqueries
    rest = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", " ", rest)
    for m in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)(?!\w)\s*(\()?", rest):
        if m.group(2) is None and m.group(1).lower() not in _KEYWORDS:
            bad.append(m.group(1))
    return bad


def test_the_checker_finds_an_unscoped_selector() -> None:
    """The helper above can fail: a bare name and a block without the matchers are both reported."""
    assert unscoped_selectors('max by (instance) (rate(x_total[5m])) > 1', SELECTOR) == ["x_total"]
    assert unscoped_selectors('up{job="a"} and on (instance) y{' + SELECTOR + '}', SELECTOR) == ['{job="a"}']
    assert unscoped_selectors('label_replace(up{' + SELECTOR + '}, "h", "$1", "instance", "(.+)") > bool 0',
                              SELECTOR) == []


@pytest.mark.parametrize(("raw", "normalised"), [
    ('cluster="prod", namespace=~"llm-.*"', SELECTOR),
    ('{cluster="prod",namespace=~"llm-.*"}', SELECTOR),
    ('region!="eu" , zone!~"a|b"', 'region!="eu",zone!~"a|b"'),
    ("", ""),
])
def test_selector_is_normalised(raw: str, normalised: str) -> None:
    assert parse_selector(raw) == normalised


@pytest.mark.parametrize(("raw", "message"), [
    ("cluster=prod", "not a list of label matchers"),
    ('cluster="a" namespace="b"', "not a list of label matchers"),
    ('job="x"', "set by the renderer"),
    ('pod=~"a{2}"', "braces"),
    (["cluster"], "must be a string"),
])
def test_a_bad_selector_is_one_clear_problem(raw: Any, message: str) -> None:
    with pytest.raises(OptionsError) as exc:
        options_from_mapping({"selector": raw})
    (problem,) = exc.value.problems
    assert problem.startswith("selector: ") and message in problem


def test_cli_rejects_a_bad_selector_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--check", "--out", str(tmp_path), "--selector", "cluster=prod"]) == 2
    err = capsys.readouterr().err
    assert "selector:" in err and "cluster=prod" in err


def _rules(opts: RenderOptions) -> list[dict[str, Any]]:
    return [r for g in render_rules.rule_groups(TABLE, opts) for r in g["rules"]]


def test_every_rule_expression_carries_the_selector() -> None:
    """Alerts and recording rules of every group: no selector without the matchers."""
    rules = _rules(OPTS)
    assert any("record" in r for r in rules) and any("alert" in r for r in rules)
    for r in rules:
        assert unscoped_selectors(r["expr"], SELECTOR) == [], r.get("alert") or r.get("record")
    # and without the option, the same check finds selectors without it (the test can fail)
    assert any(unscoped_selectors(r["expr"], SELECTOR) for r in _rules(RenderOptions()))


def test_groupings_that_keep_a_server_apart_keep_the_selector_labels() -> None:
    """`by`/`on` lists naming instance (or the derived instance_host) also name cluster and namespace."""
    seen = 0
    for r in _rules(OPTS):
        for names in re.findall(r"\b(?:by|on) \(([^()]*)\)", r["expr"]):
            labels = [n.strip() for n in names.split(",")]
            if {"instance", "instance_host"} & set(labels):
                seen += 1
                assert {"cluster", "namespace"} <= set(labels), (r.get("alert") or r.get("record"), names)
    assert seen > 20


def test_annotation_lookups_carry_the_selector() -> None:
    """The suggested/current value lookups in the annotations query with the selector too, and match the
    selector's labels on the alert's own values (another cluster's server of the same instance lends none)."""
    lookups = [m for r in _rules(OPTS) if "alert" in r for v in r["annotations"].values()
               for m in re.findall(r"printf `([^`]*)`", v)]
    assert lookups and all(f"{{{SELECTOR},job=\"sglang-tuning-exporter\",cluster=%q,namespace=%q," in q
                           for q in lookups)
    args = [m for r in _rules(OPTS) if "alert" in r for v in r["annotations"].values()
            for m in re.findall(r"printf `[^`]*` ([^|]*)\|", v)]
    assert args and all(a.startswith("$labels.cluster $labels.namespace ") for a in args)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_rules_rendered_with_a_selector_pass_promtool(tmp_path: Path) -> None:
    assert main(["render", "--rules-only", "--out", str(tmp_path), "--selector", SELECTOR]) == 0
    files = sorted((tmp_path / "alerts").glob("*.rules.yaml"))
    assert len(files) == 5 and all(SELECTOR in f.read_text(encoding="utf-8") for f in files)
    proc = subprocess.run(["promtool", "check", "rules", *map(str, files)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _queries(node: Any) -> list[str]:
    if isinstance(node, list):
        return [q for n in node for q in _queries(n)]
    if not isinstance(node, dict):
        return []
    out = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
    q = node.get("query")
    if isinstance(q, str) and node.get("type") != "datasource":
        out.append(q)
    return out + [x for v in node.values() for x in _queries(v)]


def test_every_dashboard_query_carries_the_selector() -> None:
    """Panel targets, the flag-change annotation and every query variable."""
    for rel, text in render_dashboards.generate(TABLE, None, OPTS.selector).items():
        queries = _queries(json.loads(text))
        assert len(queries) > 20, rel
        for q in queries:
            promql = q.replace("$__rate_interval", "5m").replace("$__range", "1h")
            promql = re.sub(r"^label_values\((.*), \w+\)$", r"\1", promql)
            assert unscoped_selectors(promql, SELECTOR) == [], (rel, q)
            for names in re.findall(r"\b(?:by|on) \(([^()]*)\)", q):
                labels = names.split(", ")
                if "instance" in labels:
                    assert {"cluster", "namespace"} <= set(labels), (rel, q)


def test_dashboards_have_cluster_namespace_pod_variables_that_default_to_all() -> None:
    """`All` is `.*`, which also matches a series without the label (compose, a single cluster)."""
    for rel, text in render_dashboards.generate(TABLE).items():
        variables = {v["name"]: v for v in json.loads(text)["templating"]["list"]}
        for name in ("cluster", "namespace", "pod"):
            v = variables[name]
            assert v["includeAll"] and v["allValue"] == ".*" and v["current"]["value"] == ["$__all"], (rel, name)
            assert v["definition"].endswith(f", {name})")
        for q in _queries(json.loads(text)):
            if "sglang_tuning_check_level{" in q:
                assert 'cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"' in q


def test_dashboard_url_follows_the_grafana_url_option_and_opens_the_server_dashboard() -> None:
    """Every alert links the per-server dashboard (its uid) with the alert's scope and instance variables."""
    opts = options_from_mapping({"grafana_url": "https://grafana.example/"})
    server_uid = json.loads(render_dashboards.generate(TABLE)["dashboards/sglang-tuning-server.json"])["uid"]
    alerts = [r for r in _rules(opts) if "alert" in r]
    assert alerts
    for a in alerts:
        url = a["annotations"]["dashboard_url"]
        assert url.startswith(f"https://grafana.example/d/{server_uid}/"), url
        for var in ("cluster", "namespace", "pod", "instance"):
            assert f"{{{{ with $labels.{var} }}}}&var-{var}={{{{ . | urlquery }}}}{{{{ end }}}}" in url


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_dashboard_queries_with_a_selector_parse(tmp_path: Path) -> None:
    """Every panel query of the selector-scoped dashboards is valid PromQL (promtool, as recording rules)."""
    exprs = []
    for text in render_dashboards.generate(TABLE, None, OPTS.selector).values():
        for q in _queries(json.loads(text)):
            if q.startswith("label_values("):
                q = re.sub(r"^label_values\((.*), \w+\)$", r"\1", q)
            q = q.replace("$__rate_interval", "5m").replace("$__range", "1h")
            exprs.append(re.sub(r"\$\{?\w+\}?", ".*", q))
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": f"q:{i}", "expr": e}
                                                         for i, e in enumerate(exprs)]}]}
    path = tmp_path / "queries.yaml"
    path.write_text(json.dumps(rules), encoding="utf-8")
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_annotation_values_come_from_the_alerts_own_cluster(tmp_path: Path) -> None:
    """Two clusters under one regex selector, the same instance in both: the alert of cluster b names b's
    current and suggested value, not a's (promtool, the kv_underused case of alerts/tests/checks.test.yaml)."""
    import yaml

    assert main(["render", "--rules-only", "--out", str(tmp_path), "--selector", 'cluster=~"a|b"']) == 0
    shipped = yaml.safe_load((Path(__file__).parents[2] / "alerts" / "tests" / "checks.test.yaml").read_text(
        encoding="utf-8"))
    case = next(t for t in shipped["tests"] if t["name"].startswith("KV cache underused"))
    (expected,) = case["alert_rule_test"][-1]["exp_alerts"]
    expected["exp_labels"]["cluster"] = "b"
    expected["exp_annotations"]["dashboard_url"] = expected["exp_annotations"]["dashboard_url"].replace(
        "&var-instance=", "&var-cluster=b&var-instance=")
    series = []
    for cluster, ratio, suggested, current in (("a", "0", "0.2", "0.5"), ("b", "0.7", "0.65", "1")):
        for s in case["input_series"]:
            value = {"sglang_tuning_signal_ratio": ratio, "sglang_tuning_suggested_value": suggested,
                     "sglang_tuning_current_value": current,
                     "sglang_tuning_signal_amount": "60"}[s["series"].split("{")[0]]  # kv_samples
            series.append({"series": s["series"].replace("{", f'{{cluster="{cluster}",', 1),
                           "values": f"{value}x30"})
    test = {"rule_files": [str(tmp_path / "alerts" / "checks.rules.yaml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "15m", "alertname": "SGLangKVCacheUnderused", "exp_alerts": [expected]}]}]}
    path = tmp_path / "two-clusters.test.yaml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    proc = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
