"""The Helm chart `deploy/helm/sglang-tuning-exporter/`: the kustomize example's objects as templates with the
values people expect (images, the sidecar, ServiceMonitor/PodMonitor, PrometheusRule, dashboards for
Grafana's sidecar and the Grafana Operator, selector, web config), generated with everything else by `render`.

The rules and dashboards are the generated ones, stored in the chart's `files/`: one rule file per guide
profile and workload (the values pick one), the dashboards per profile. They are rendered with a placeholder
selector that the templates replace by the `selector` value (or drop), so a chart rendered with a selector
holds exactly what `render --selector` writes. The Go templates themselves are in `render/helmtemplates.py`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_tuning_exporter import __version__
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.config import SLO_BUCKETS
from sglang_tuning_exporter.render import dashboards as render_dashboards
from sglang_tuning_exporter.render import kubernetes as k8s
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render import slo
from sglang_tuning_exporter.render.expressions import keep_selector_labels, profile_of
from sglang_tuning_exporter.render.helmtemplates import HELPERS, TEMPLATES
from sglang_tuning_exporter.render.options import DEFAULT_GRAFANA_URL, RenderOptions
from sglang_tuning_exporter.sources import logtee

CHART = "sglang-tuning-exporter"
OUT_DIR = f"deploy/helm/{CHART}"
# The label the templates replace by the `selector` value; rendered like any selector (`{PH,job=...}`).
PLACEHOLDER_LABEL = "__chart_selector__"
PLACEHOLDER = f'{PLACEHOLDER_LABEL}=""'
# Groups whose rules do not depend on the profile or workload (stored once).
COMMON_GROUPS = ("sglang-tuning-exporter.recording", "sglang-tuning.health", "sglang-tuning.changes")
# The `selector` value: PromQL label matchers, as render's option accepts them (braces not supported).
SELECTOR_PATTERN = (r'^\s*([a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"([^"\\{}]|\\.)*"\s*(,\s*|$))*$')


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=False, ensure_ascii=False) + "\n"


def values(table: CheckTable, opts: RenderOptions) -> dict[str, Any]:
    """values.yaml: the kustomize example's choices as defaults."""
    sglang_repo, sglang_tag = k8s.SGLANG_IMAGE.rsplit(":", 1)
    return {
        "nameOverride": "", "fullnameOverride": "",
        "commonLabels": {},
        "guideProfile": profile_of(table, opts),
        "workload": opts.workload,
        "selector": "",
        "grafanaUrl": DEFAULT_GRAFANA_URL,
        "slo": {},
        "sglang": {
            "image": {"repository": sglang_repo, "tag": sglang_tag, "pullPolicy": "IfNotPresent"},
            "model": "Qwen/Qwen2.5-7B-Instruct", "extraArgs": "",
            "hfTokenSecret": "hf-token",
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "shmSizeLimit": "16Gi",
        },
        "exporter": {
            "image": {"repository": CHART, "tag": "", "pullPolicy": "IfNotPresent"},
            "extraArgs": [],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "webConfig": {"existingSecret": "", "key": "web-config.yml", "tls": False},
        },
        "log": {"maxBytes": k8s.LOG_MAX_BYTES, "backups": k8s.LOG_BACKUPS, "sizeLimit": k8s.LOG_VOLUME_LIMIT},
        "replicas": 1,
        "podLabels": {}, "podAnnotations": {}, "nodeSelector": {}, "tolerations": [], "affinity": {},
        "service": {"type": "ClusterIP"},
        "serviceMonitor": {"enabled": True, "labels": {"release": k8s.DEFAULT_RELEASE}, "interval": "15s",
                           "basicAuth": {}},
        "podMonitor": {"enabled": False, "labels": {"release": k8s.DEFAULT_RELEASE}, "interval": "15s",
                       "basicAuth": {}},
        "prometheusRule": {"enabled": True, "labels": {"release": k8s.DEFAULT_RELEASE}},
        "grafanaDashboards": {
            "enabled": True, "labels": {"grafana_dashboard": "1"},
            "annotations": {"grafana_folder": k8s.DASHBOARD_FOLDER},
            "grafanaOperator": {"enabled": False, "folder": k8s.DASHBOARD_FOLDER,
                                "instanceSelector": {"matchLabels": {"dashboards": "grafana"}},
                                "allowCrossNamespaceImport": False},
        },
    }


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props, **extra}


_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_MAP = {"type": "object"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_IMAGE = _obj({"repository": _STR, "tag": _STR, "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}})
_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h))+$"}


def schema(table: CheckTable) -> dict[str, Any]:
    """values.schema.json: every key typed, unknown keys rejected (a typo fails `helm install`)."""
    monitor = _obj({"enabled": _BOOL, "labels": _LABELS, "interval": _DURATION, "basicAuth": _MAP})
    return _obj({
        "nameOverride": _STR, "fullnameOverride": _STR, "commonLabels": _LABELS,
        "guideProfile": {"enum": list(table.profiles)},
        "workload": {"enum": list(table.workloads)},
        "selector": {"type": "string", "pattern": SELECTOR_PATTERN},
        "grafanaUrl": {"type": "string", "pattern": "^https?://"},
        "slo": _obj({**{t: {"enum": list(bounds)} for t, bounds in SLO_BUCKETS.items()},
                     "objective": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
                    dependencies={"objective": {"anyOf": [{"required": [t]} for t in SLO_BUCKETS]}}),
        "sglang": _obj({"image": _IMAGE, "model": _STR, "extraArgs": _STR, "hfTokenSecret": _STR,
                        "resources": _MAP, "shmSizeLimit": _STR}),
        "exporter": _obj({"image": _IMAGE, "extraArgs": {"type": "array", "items": _STR}, "resources": _MAP,
                          "securityContext": _MAP,
                          "webConfig": _obj({"existingSecret": _STR, "key": _STR, "tls": _BOOL})}),
        "log": _obj({"maxBytes": {"type": "integer", "minimum": 1}, "backups": {"type": "integer", "minimum": 0},
                     "sizeLimit": _STR}),
        "replicas": {"type": "integer", "minimum": 0},
        "podLabels": _LABELS, "podAnnotations": _LABELS, "nodeSelector": _LABELS,
        "tolerations": {"type": "array"}, "affinity": _MAP,
        "service": _obj({"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}}),
        "serviceMonitor": monitor, "podMonitor": monitor,
        "prometheusRule": _obj({"enabled": _BOOL, "labels": _LABELS}),
        "grafanaDashboards": _obj({
            "enabled": _BOOL, "labels": _LABELS, "annotations": _LABELS,
            "grafanaOperator": _obj({"enabled": _BOOL, "folder": _STR, "instanceSelector": _MAP,
                                     "allowCrossNamespaceImport": _BOOL})}),
    }, **{"$schema": "http://json-schema.org/draft-07/schema#"})


def chart_yaml() -> dict[str, Any]:
    return {"apiVersion": "v2", "name": CHART, "version": __version__, "appVersion": __version__,
            "description": "SGLang with the sglang-tuning-exporter sidecar, its alert rules and dashboards "
                           "(generated by `sglang-tuning-exporter render`)",
            "type": "application", "kubeVersion": ">=1.25.0-0",
            "keywords": ["sglang", "prometheus", "grafana", "llm"]}


def rule_files(table: CheckTable, opts: RenderOptions) -> dict[str, str]:
    """`files/rules/common.json` and `files/rules/<profile>/<workload>.json`, with the placeholder selector."""
    out: dict[str, str] = {}
    base = replace(opts, selector=PLACEHOLDER, grafana_url=DEFAULT_GRAFANA_URL)
    for profile in table.profiles:
        for workload in table.workloads:
            groups = render_rules.rule_groups(table, replace(base, profile=profile, workload=workload))
            own = [g for g in groups if g["name"] not in COMMON_GROUPS]
            out[f"files/rules/{profile}/{workload}.json"] = _json({"groups": own})
            if "files/rules/common.json" not in out:  # the same for every profile and workload: written once
                out["files/rules/common.json"] = _json({"groups": [g for g in groups if g["name"] in COMMON_GROUPS]})
    return out


def slo_files(table: CheckTable, opts: RenderOptions) -> dict[str, str]:
    """`files/rules/<profile>/slo.json`: every SLO target's rules by target, its numbers as placeholders
    (render/slo.py) that the template fills from the `slo` value, with the placeholder selector."""
    base = replace(opts, selector=PLACEHOLDER, grafana_url=DEFAULT_GRAFANA_URL)
    out = {}
    for profile in table.profiles:
        by_target: dict[str, list[dict[str, Any]]] = {t: [] for t in slo.SLO_HISTOGRAMS}
        for target, body, _ in slo.rules(table, replace(base, profile=profile), slo.PLACEHOLDERS):
            # as rules.groups does with a selector: the groupings that keep a server apart keep its labels
            by_target[target].append({**body, "expr": keep_selector_labels(body["expr"], PLACEHOLDER)})
        out[f"files/rules/{profile}/slo.json"] = _json(by_target)
    return out


def dashboard_files(table: CheckTable) -> dict[str, str]:
    """`files/dashboards/<profile>/<name>.json` (each profile's guide bands), with the placeholder selector."""
    out = {}
    for profile in table.profiles:
        for path, text in render_dashboards.generate(table, profile, PLACEHOLDER).items():
            out[f"files/dashboards/{profile}/{Path(path).name}"] = text
    return out


def generate(table: CheckTable, opts: RenderOptions) -> dict[str, str]:
    """The chart as `{relative path: text}`."""
    files: dict[str, str] = {
        "Chart.yaml": k8s.dump(chart_yaml()),
        "values.yaml": k8s.dump(values(table, opts)),
        "values.schema.json": json.dumps(schema(table), indent=2) + "\n",
        ".helmignore": "# Generated by `sglang-tuning-exporter render`.\n*.orig\n*.tmp\n",
        "templates/_helpers.tpl": HELPERS,
        "files/logtee.py": Path(logtee.__file__).read_text(encoding="utf-8"),
    }
    files.update({f"templates/{name}": text for name, text in TEMPLATES.items()})
    files.update(rule_files(table, opts))
    files.update(slo_files(table, opts))
    files.update(dashboard_files(table))
    return {f"{OUT_DIR}/{name}": text for name, text in sorted(files.items())}
