"""Schema validation of Kubernetes manifests (shared by the kustomize and Helm tests): Kubernetes' own kinds
with kubernetes-validate (strict: unknown fields are errors), the Prometheus-operator CRDs with the schemas
vendored in tests/fixtures/schemas."""

from __future__ import annotations

import json
from typing import Any

from helpers.paths import ROOT

SCHEMAS = ROOT / "tests" / "fixtures" / "schemas"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes still in wide use whose schemas kubernetes-validate ships
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor_v1.json",
               ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule_v1.json"}


def crd_schema(name: str) -> dict[str, Any]:
    """One vendored CRD schema."""
    schema: dict[str, Any] = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return schema


def json_schema_problems(schema: dict[str, Any], doc: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def schema_problems(doc: dict[str, Any]) -> list[str]:
    """Problems of one manifest against its schema."""
    import kubernetes_validate

    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        return json_schema_problems(crd_schema(CRD_SCHEMAS[key]), doc)
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def pod_monitor_problems(doc: dict[str, Any]) -> list[str]:
    """No PodMonitor CRD schema is vendored: its podMetricsEndpoints are judged with the vendored
    ServiceMonitor's endpoint schema (the fields our manifests set, port, path, interval, scheme, basicAuth and
    relabelings, are the same in both CRDs); apiVersion, selector and no other spec key by hand."""
    endpoint = crd_schema("servicemonitor_v1.json")["properties"]["spec"]["properties"]["endpoints"]
    spec_schema = {"type": "object", "required": ["podMetricsEndpoints", "selector"],
                   "properties": {"podMetricsEndpoints": endpoint,
                                  "selector": {"type": "object", "additionalProperties": False,
                                               "properties": {"matchLabels": {"type": "object"}}}},
                   "additionalProperties": False}
    problems = [] if doc.get("apiVersion") == "monitoring.coreos.com/v1" else ["apiVersion: not monitoring.coreos.com/v1"]
    return problems + json_schema_problems(spec_schema, doc.get("spec"))
