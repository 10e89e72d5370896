"""The committed Grafana dashboards against Grafana's published dashboard JSON schema.

The schema (tests/fixtures/schemas/grafana_dashboard_v0.json, vendored: CI is offline) is stricter than
what Grafana 11.6 loads in a handful of places; RELAXATIONS lists each one, and
test_every_relaxation_is_still_needed fails as soon as one is no longer needed (the generator changed,
or the schema was updated), so the list never hides more than it must. See the fixtures' README.

Works on the files in dashboards/ (what Grafana provisions; test_dashboards checks they match the
generator), so it imports nothing of the package.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator

from helpers.paths import ROOT

SCHEMA_FILE = ROOT / "tests" / "fixtures" / "schemas" / "grafana_dashboard_v0.json"
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
UPSTREAM: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(schema: dict[str, Any]) -> None:
        node: Any = schema["definitions"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return apply


def _prometheus_annotation(schema: dict[str, Any]) -> None:
    """A Prometheus annotation (the flag-change markers) keeps its query at the top level, as Grafana's
    Prometheus annotation editor writes it, and its target is that query ({expr, interval, refId, ...})."""
    schema["definitions"]["AnnotationQuery"]["properties"].update({
        "expr": {"type": "string"}, "step": {"type": "string"}, "tagKeys": {"type": "string"},
        "textFormat": {"type": "string"}, "titleFormat": {"type": "string"}, "useValueForTime": {"type": "boolean"}})
    schema["definitions"]["AnnotationTarget"].update({"additionalProperties": True, "required": []})


# Where the schema rejects JSON that Grafana 11.6 itself writes and loads (README, "Deviations").
RELAXATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    # -Infinity, the first threshold step's value, is serialised as null (the schema's own comment says so).
    "threshold-null": _set(("Threshold", "properties", "value"), {"type": ["number", "null"]}),
    # Matcher options are the matcher's argument: a field name (byName) or a type (byType), not only objects.
    "matcher-options-any": _set(("MatcherConfig", "properties", "options"), {}),
    # An override property's value is whatever the property takes: a string, a number, a list of mappings.
    "override-value-any": _set(("DynamicConfigValue", "properties", "value"), {}),
    # Query variables carry `definition` (the query as shown in the editor); Grafana's UI writes it.
    "variable-definition": _set(("VariableModel", "properties", "definition"), {"type": "string"}),
    # A Prometheus query variable's query object has string fields ({query, refId}), not nested objects.
    "variable-query-object": _set(("VariableModel", "properties", "query", "anyOf", 1, "additionalProperties"), {}),
    # `current: {}` means "nothing chosen yet": Grafana picks the default datasource / first option.
    "variable-current-empty": _set(("VariableOption", "required"), []),
    # Grafana fills the time picker's lists with its defaults when they are absent.
    "timepicker-defaults": _set(("TimePickerConfig", "required"), []),
    # A Prometheus annotation (the flag-change markers) keeps its query at the top level, as Grafana's
    # Prometheus annotation editor writes it: expr, step, title/text formats, tag keys.
    "annotation-prometheus-fields": lambda schema: _prometheus_annotation(schema),
}


def _validator(skip: str | None = None) -> Draft7Validator:
    schema = copy.deepcopy(UPSTREAM)
    for name, relax in RELAXATIONS.items():
        if name != skip:
            relax(schema)
    return Draft7Validator(schema)


def _errors(validator: Draft7Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(doc)]


def test_vendored_schema_is_a_valid_draft7_schema() -> None:
    Draft7Validator.check_schema(UPSTREAM)
    assert UPSTREAM["$ref"] == "#/definitions/Dashboard"
    assert UPSTREAM["definitions"]["Dashboard"]["additionalProperties"] is False


def test_both_dashboards_are_checked() -> None:
    """A glob that found nothing would make the parametrised test below vacuous."""
    assert [p.name for p in DASHBOARDS] == ["sglang-tuning-fleet.json", "sglang-tuning-server.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_matches_grafana_schema(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert _errors(_validator(), doc) == []


@pytest.mark.parametrize("name", sorted(RELAXATIONS))
def test_every_relaxation_is_still_needed(name: str) -> None:
    """Without this one relaxation, at least one dashboard fails: drop it from the list (and the README)
    the day it passes."""
    validator = _validator(skip=name)
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in DASHBOARDS]
    assert any(_errors(validator, doc) for doc in docs), f"relaxation {name!r} is no longer needed"


def _server() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "dashboards" / "sglang-tuning-server.json").read_text(encoding="utf-8"))
    return doc


def _first_leaf_panel(doc: dict[str, Any]) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in doc["panels"] if p["type"] != "row")
    return panel


def _break_unknown_top_key(doc: dict[str, Any]) -> None:
    doc["dashboardTitle"] = "typo of title"


def _break_schema_version_type(doc: dict[str, Any]) -> None:
    doc["schemaVersion"] = "39"


def _break_missing_templating(doc: dict[str, Any]) -> None:
    del doc["templating"]


def _break_panel_too_wide(doc: dict[str, Any]) -> None:
    _first_leaf_panel(doc)["gridPos"]["w"] = 25


def _break_panel_without_type(doc: dict[str, Any]) -> None:
    del _first_leaf_panel(doc)["type"]


def _break_row_without_panels(doc: dict[str, Any]) -> None:
    del next(p for p in doc["panels"] if p["type"] == "row")["panels"]


def _break_threshold_mode(doc: dict[str, Any]) -> None:
    panel = next(p for p in doc["panels"] if "thresholds" in p.get("fieldConfig", {}).get("defaults", {}))
    panel["fieldConfig"]["defaults"]["thresholds"]["mode"] = "relative"


def _break_variable_type(doc: dict[str, Any]) -> None:
    doc["templating"]["list"][0]["type"] = "dropdown"


def _break_datasource_ref(doc: dict[str, Any]) -> None:
    _first_leaf_panel(doc)["datasource"] = {"uid": "${datasource}", "name": "Prometheus"}


BREAKAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown top-level key": _break_unknown_top_key,
    "schemaVersion as a string": _break_schema_version_type,
    "no templating": _break_missing_templating,
    "panel wider than the grid": _break_panel_too_wide,
    "panel without type": _break_panel_without_type,
    "row without panels": _break_row_without_panels,
    "unknown thresholds mode": _break_threshold_mode,
    "unknown variable type": _break_variable_type,
    "datasource ref with an unknown key": _break_datasource_ref,
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_broken_dashboard_is_rejected(name: str) -> None:
    """The relaxed schema still rejects a broken dashboard (each breakage is one Grafana would mis-load
    or drop silently)."""
    doc = _server()
    validator = _validator()
    assert _errors(validator, doc) == []  # the breakage below is the only fault
    BREAKAGES[name](doc)
    assert _errors(validator, doc), f"{name} passed the schema"
