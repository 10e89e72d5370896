"""The Helm chart deploy/helm/sglang-tuning-exporter, rendered and linted with Helm v4's own library
(helm-python-sdk, no binary): every object validates, the PrometheusRule holds exactly the alerts of
alerts/*.rules.yaml, the selector value reaches every rule and dashboard query, values are schema-checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.k8s_schemas import pod_monitor_problems, schema_problems
from helpers.paths import ROOT
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.render import dashboards as render_dashboards
from sglang_tuning_exporter.render import helmchart
from sglang_tuning_exporter.render import kubernetes as render_kubernetes
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render.options import RenderOptions, parse_selector

try:
    import helm_python as helm
except ImportError:
    if os.environ.get("CI"):  # .ci/run installs the test extra: missing there is a failure, not a skip
        raise
    pytest.skip("helm-python-sdk (the test extra) is not installed", allow_module_level=True)

CHART_DIR = ROOT / helmchart.OUT_DIR
TABLE = load_table()
SELECTOR = 'cluster="prod",namespace=~"llm-.*"'
ALL_ON: dict[str, Any] = {
    "podMonitor": {"enabled": True},
    "selector": SELECTOR,
    "commonLabels": {"team": "llm"},
    "exporter": {"webConfig": {"existingSecret": "exporter-web", "tls": True}},
    "serviceMonitor": {"basicAuth": {"username": {"name": "exporter-scrape", "key": "user"},
                                     "password": {"name": "exporter-scrape", "key": "password"}}},
    "grafanaDashboards": {"grafanaOperator": {"enabled": True}},
    "grafanaUrl": "https://grafana.example",
}


def _render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm.Chart.load(str(CHART_DIR))
    out = chart.render(values, name="demo", namespace="llm")
    # libyaml's safe loader: the same documents, read at collection time several times faster
    return [d for text in out.values() for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]


DEFAULT = _render()
EVERYTHING = _render(ALL_ON)


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_committed_chart_matches_the_generator() -> None:
    """deploy/helm/ is what `render` writes (render --check covers the same files)."""
    files = helmchart.generate(TABLE, RenderOptions())
    for rel, text in files.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, f"{rel} drifted: run `sglang-tuning-exporter render`"
    on_disk = {str(p.relative_to(ROOT)) for p in CHART_DIR.rglob("*") if p.is_file()}
    assert on_disk == set(files), "stale files in the chart directory"


SLO = {"ttft_p95_seconds": 2.0, "itl_p95_seconds": 0.1, "objective": 0.99}


@pytest.mark.parametrize("values", [None, ALL_ON, {"slo": SLO}, {**ALL_ON, "slo": SLO}],
                         ids=["defaults", "all-on", "slo", "all-on-slo"])
def test_helm_lint_is_clean(values: dict[str, Any] | None) -> None:
    """`helm lint --strict` (Helm's library): no error, no warning (info: only the missing icon)."""
    report = helm.lint(str(CHART_DIR), values, strict=True, namespace="llm", kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_and_all_on_kinds() -> None:
    kinds = sorted(d["kind"] for d in DEFAULT)
    assert kinds == ["ConfigMap", "ConfigMap", "ConfigMap", "Deployment", "PrometheusRule", "Service",
                     "ServiceMonitor"]
    assert sorted(d["kind"] for d in EVERYTHING) == sorted(
        [*kinds, "PodMonitor", "GrafanaDashboard", "GrafanaDashboard"])
    off = _render({"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False},
                   "grafanaDashboards": {"enabled": False}})
    assert sorted(d["kind"] for d in off) == ["ConfigMap", "Deployment", "Service"]


@pytest.mark.parametrize("docs", [DEFAULT, EVERYTHING], ids=["defaults", "all-on"])
def test_every_object_validates(docs: list[dict[str, Any]]) -> None:
    """Core kinds against Kubernetes 1.30 (strict), ServiceMonitor/PrometheusRule against the operator's
    CRDs, PodMonitor and GrafanaDashboard by their documented shape."""
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for doc in docs:
        name = f"{doc['kind']} {doc['metadata']['name']}"
        if doc["kind"] == "PodMonitor":
            assert pod_monitor_problems(doc) == [], name
        elif doc["kind"] == "GrafanaDashboard":
            # grafana-operator v5: grafana.integreatly.org/v1beta1, spec.instanceSelector picks the Grafana,
            # spec.configMapRef {name, key} reads the dashboard JSON from a ConfigMap.
            assert doc["apiVersion"] == "grafana.integreatly.org/v1beta1"
            spec = doc["spec"]
            assert set(spec) == {"instanceSelector", "folder", "allowCrossNamespaceImport", "configMapRef"}
            assert spec["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
            ref = spec["configMapRef"]
            assert set(ref) == {"name", "key"} and ref["key"] in configmaps[ref["name"]]["data"], name
            json.loads(configmaps[ref["name"]]["data"][ref["key"]])
        else:
            assert schema_problems(doc) == [], name
        assert len(doc["metadata"]["name"]) <= 63


def _groups(docs: list[dict[str, Any]]) -> dict[str, Any]:
    rule = _one(docs, "PrometheusRule")
    by_name = {g["name"]: g for g in rule["spec"]["groups"]}
    assert len(by_name) == len(rule["spec"]["groups"])
    return by_name


def test_prometheus_rule_holds_exactly_the_alerts_of_the_rule_files() -> None:
    """Default values: the same groups, rules and annotations as alerts/*.rules.yaml."""
    shipped: list[dict[str, Any]] = []
    for path in sorted((ROOT / "alerts").glob("*.rules.yaml")):
        shipped += yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    assert _groups(DEFAULT) == {g["name"]: g for g in shipped}


# A chart render per workload and profile: make test-fast renders the default profile's, the full run every one.
@pytest.mark.parametrize("profile", [pytest.param(p, marks=() if p == TABLE.default_profile() else pytest.mark.slow)
                                     for p in TABLE.profiles])
def test_every_profile_and_workload_picks_its_rules(profile: str) -> None:
    """guideProfile/workload values select the rule groups `render --guide-profile --workload` writes."""
    for workload in TABLE.workloads:
        docs = _render({"guideProfile": profile, "workload": workload, "grafanaDashboards": {"enabled": False}})
        expected = render_rules.rule_groups(TABLE, RenderOptions(profile=profile, workload=workload))
        assert _groups(docs) == {g["name"]: g for g in expected}, (profile, workload)
        sidecar = _containers(docs)["tuning-exporter"]
        assert {f"--guide-profile={profile}", f"--workload={workload}"} <= set(sidecar["args"])


def test_selector_value_equals_render_with_the_selector_option() -> None:
    """The chart's `selector` gives the rules and dashboards `render --selector` writes, byte for byte."""
    opts = RenderOptions(selector=parse_selector(SELECTOR), grafana_url="https://grafana.example")
    assert _groups(EVERYTHING) == {g["name"]: g for g in render_rules.rule_groups(TABLE, opts)}
    expected = {Path(p).name: t for p, t in render_dashboards.generate(TABLE, None, opts.selector).items()}
    maps = [d for d in EVERYTHING if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    assert {k: v for m in maps for k, v in m["data"].items()} == expected
    text = json.dumps([d for d in EVERYTHING if d["kind"] in ("PrometheusRule", "ConfigMap")])
    assert helmchart.PLACEHOLDER_LABEL not in text


@pytest.mark.parametrize("slo", [SLO, {"ttft_p95_seconds": 20, "objective": 0.995}, {"itl_p95_seconds": 0.002}],
                         ids=["both", "ttft-995", "itl-default-objective"])
def test_slo_value_equals_render_with_the_config_slo(slo: dict[str, float]) -> None:
    """The chart's `slo` gives the SLO group `render --config` writes from the same `slo:` (numbers filled into
    the stored placeholders by the template), alone and with a selector; the dashboards do not change."""
    docs = _render({"slo": slo})
    assert _groups(docs) == {g["name"]: g for g in render_rules.rule_groups(TABLE, RenderOptions(slo=slo))}
    assert "sglang-tuning.slo" in _groups(docs)
    both = _render({**ALL_ON, "slo": slo})
    opts = RenderOptions(selector=parse_selector(SELECTOR), grafana_url="https://grafana.example", slo=slo)
    assert _groups(both) == {g["name"]: g for g in render_rules.rule_groups(TABLE, opts)}
    assert "__slo_" not in json.dumps(_one(both, "PrometheusRule"))
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    assert {k: v for m in maps for k, v in m["data"].items()} == {
        p.name: p.read_text(encoding="utf-8") for p in (ROOT / "dashboards").glob("*.json")}


def test_default_dashboards_are_the_committed_ones() -> None:
    maps = [d for d in DEFAULT if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    got = {k: v for m in maps for k, v in m["data"].items()}
    assert got == {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "dashboards").glob("*.json")}
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_chart_rules_with_a_selector_pass_promtool(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    spec = _one(_render({**ALL_ON, "slo": SLO}), "PrometheusRule")["spec"]
    assert "sglang-tuning.slo" in {g["name"] for g in spec["groups"]}
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert SELECTOR in path.read_text(encoding="utf-8")
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("values", "where"), [
    ({"serviceMonitor": {"enabeld": True}}, "enabeld"),
    ({"workload": "batch"}, "workload"),
    ({"guideProfile": "nope"}, "guideProfile"),
    ({"selector": "cluster=prod"}, "selector"),
    ({"selector": 'pod=~"a{2}"'}, "selector"),
    ({"log": {"maxBytes": "big"}}, "maxBytes"),
    ({"grafanaUrl": "grafana:3000"}, "grafanaUrl"),
    ({"slo": {"ttft_p95_seconds": 1.5}}, "ttft_p95_seconds"),
    ({"slo": {"itl_p95_seconds": 0.1, "objective": 1.2}}, "objective"),
    ({"slo": {"objective": 0.99}}, "slo"),
    ({"slo": {"e2e_p95_seconds": 5}}, "e2e_p95_seconds"),
])
def test_values_schema_rejects_a_bad_value(values: dict[str, Any], where: str) -> None:
    chart = helm.Chart.load(str(CHART_DIR))
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    dep = _one(docs, "Deployment")
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def test_sidecar_is_the_kustomize_sidecar_non_root_read_only() -> None:
    """The log handoff (logtee, rotation, emptyDir) and the sidecar's flags are the kustomize example's; the
    sidecar runs as non-root on a read-only root filesystem."""
    kust = {c["name"]: c for c in render_kubernetes.deployment(render_kubernetes.SGLANG_IMAGE, "x")
            ["spec"]["template"]["spec"]["containers"]}
    got = _containers(DEFAULT)
    assert " ".join(got["sglang"]["args"][0].split()) == " ".join(kust["sglang"]["args"][0].split())
    assert got["sglang"]["volumeMounts"] == kust["sglang"]["volumeMounts"]
    assert set(kust["tuning-exporter"]["args"]) <= set(got["tuning-exporter"]["args"])
    sc = got["tuning-exporter"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    cm = _one([d for d in DEFAULT if d["metadata"]["name"].endswith("-logtee")], "ConfigMap")
    assert cm["data"]["logtee.py"] == render_kubernetes.logtee_config_map()["data"]["logtee.py"]
    volumes = {v["name"]: v for v in _one(DEFAULT, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["logtee"]["configMap"]["name"] == cm["metadata"]["name"]
    assert volumes["sglang-logs"]["emptyDir"]["sizeLimit"] == render_kubernetes.LOG_VOLUME_LIMIT


def test_web_config_secret_is_mounted_and_scraped_over_tls_with_basic_auth() -> None:
    sidecar = _containers(EVERYTHING)["tuning-exporter"]
    assert "--web.config.file=/etc/sglang-tuning-exporter/web/web-config.yml" in sidecar["args"]
    volumes = {v["name"]: v for v in _one(EVERYTHING, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["web-config"] == {"name": "web-config", "secret": {"secretName": "exporter-web"}}
    assert sidecar["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    mon = _one(EVERYTHING, "ServiceMonitor")
    ours = next(e for e in mon["spec"]["endpoints"] if e["port"] == "tuning-metrics")
    assert ours["scheme"] == "https" and ours["basicAuth"]["password"]["key"] == "password"


def test_monitors_select_the_pods_and_set_the_rule_jobs() -> None:
    """ServiceMonitor (via the Service) and PodMonitor select the Deployment's pods; both set the job names
    the rules match; extra labels (the release label kube-prometheus-stack selects on) are values."""
    pod_labels = _one(EVERYTHING, "Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = _one(EVERYTHING, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        mon = _one(EVERYTHING, kind)
        target = svc["metadata"]["labels"] if kind == "ServiceMonitor" else pod_labels
        assert mon["spec"]["selector"]["matchLabels"].items() <= target.items(), kind
        jobs = {e["port"]: e["relabelings"][0]["replacement"] for e in mon["spec"][key]}
        assert jobs == {"tuning-metrics": render_kubernetes.EXPORTER_JOB, "http": render_kubernetes.SGLANG_JOB}
        assert mon["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert mon["metadata"]["labels"]["team"] == "llm"
    text = json.dumps(_one(EVERYTHING, "PrometheusRule"))
    assert set(re.findall(r'\bjob=\\"([^"\\]+)\\"', text)) == {render_kubernetes.EXPORTER_JOB,
                                                               render_kubernetes.SGLANG_JOB}
