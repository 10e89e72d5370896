"""Grafana JSON building blocks shared by the dashboards: PromQL selectors with the dashboard variables,
panels (timeseries, stat, table, state timeline), the template variables, the grid layout and the
dashboard envelope. Nothing here knows a guide number or a particular panel; `dashboards` composes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 39  # Grafana 11.x; newer Grafana migrates it on load
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["sglang", "sglang-tuning"]
# The per-server dashboard's uid: the dashboards declare it, the alerts' dashboard_url links to it.
SERVER_UID = "sglang-tuning-server"

# Every per-rank selector carries the dashboard variables; SGLang's scheduler labels are join keys.
# The Kubernetes scope of a kube-prometheus mixin: `cluster`, `namespace`, `pod` variables, "All" (`.*`) by
# default, which also matches a series without the label (a compose stack, a single cluster's Prometheus).
SCOPE_SEL = 'cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod", '
RANK_SEL = SCOPE_SEL + 'job=~"$job", instance=~"$instance", model_name=~"$model_name", dp_rank=~"$dp_rank"'
HOST_SEL = SCOPE_SEL + 'job=~"$job", instance=~"$instance"'
# One series per DP replica (and pipeline stage): TP/EP ranks of a replica repeat the same values, so they are
# aggregated away with max (min for memory headroom), never summed (docs/signals.md, "PromQL: the same meaning").
BY = "instance, model_name, dp_rank, pp_rank"
RATE = "[$__rate_interval]"

Json = dict[str, Any]


# --- PromQL helpers -----------------------------------------------------------------------------


def ours(metric: str, extra: str = "") -> str:
    """Selector of one of our per-rank metrics with the dashboard variables."""
    return f"sglang_tuning_{metric}{{{extra}{RANK_SEL}}}"


def sglang(name: str, extra: str = "") -> str:
    """Selector of an SGLang metric in every spelling (`sglang:x`, escaped `sglang_x`, Ray Serve's `ray_sglang_x`)."""
    return f'{{__name__=~"(ray_)?sglang[:_]{name}", {extra}{RANK_SEL}}}'


def per_rank(expr: str, op: str = "max") -> str:
    """Aggregate to one series per server and DP replica (TP ranks repeat the same numbers: max, or min
    for headroom; never sum)."""
    return f"{op} by ({BY}) ({expr})"


def rate_per_replica(selector: str, split: str = "") -> str:
    """Per-replica rate of a counter: max over the TP ranks that repeat it; a `split` label (cuda_graph, mode,
    source) is a real partition of the events, summed after the TP ranks are folded."""
    if not split:
        return f"max by ({BY}) (rate({selector}{RATE}))"
    return f"sum by ({BY}) (max by ({BY}, {split}) (rate({selector}{RATE})))"


def ratio(numerator: str, denominator: str, split: str = "") -> str:
    """Per-replica ratio of two counter rates (numerator and denominator aggregated apart)."""
    return f"{rate_per_replica(numerator, split)} / {rate_per_replica(denominator, split)}"


def tokenizer_rate(selector: str) -> str:
    """Rate of an SGLang tokenizer counter: one process per server, no TP ranks; the sum adds its
    is_streaming / cache_source splits."""
    return f"sum by ({BY}) (rate({selector}{RATE}))"


PRIORITY_TOTAL = 'priority="", '  # under priority scheduling the total is the priority="" series


# --- panel builders -----------------------------------------------------------------------------


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> Json:
    """One Prometheus query of a panel."""
    t: Json = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t.update({"format": "table", "instant": True, "range": False})
    else:
        t.update({"range": True})
    return t


def steps(base: str, *points: tuple[float, str]) -> Json:
    """Absolute thresholds: a base colour then (value, colour) steps."""
    out: list[Json] = [{"color": base, "value": None}]
    out += [{"color": color, "value": value} for value, color in points]
    return {"mode": "absolute", "steps": out}


STATUS_MAPPINGS: list[Json] = [{"type": "value", "options": {
    "-1": {"color": "text", "index": 0, "text": "unknown"},
    "0": {"color": "green", "index": 1, "text": "ok"},
    "1": {"color": "orange", "index": 2, "text": "warning"},
    "2": {"color": "red", "index": 3, "text": "critical"},
}}]
STATUS_STEPS = steps("text", (0, "green"), (1, "orange"), (2, "red"))


@dataclass(frozen=True, slots=True)
class Cell:
    """A panel and its size on the 24-column grid."""

    panel: Json
    w: int = 12
    h: int = 8


def timeseries(title: str, description: str, unit: str, targets: Sequence[Json], *,
               thresholds: Json | None = None, style: str = "off", minimum: float | None = None,
               maximum: float | None = None, bars: bool = False, no_value: str | None = None) -> Json:
    """A timeseries panel; `style` draws thresholds (`line+area`, `dashed`, ...); `no_value` replaces
    Grafana's "No data"."""
    custom: Json = {"drawStyle": "bars" if bars else "line", "fillOpacity": 60 if bars else 10,
                    "lineWidth": 1, "showPoints": "never", "spanNulls": False,
                    "thresholdsStyle": {"mode": style}}
    defaults: Json = {"custom": custom, "unit": unit,
                      "thresholds": thresholds or steps("green")}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if no_value is not None:
        defaults["noValue"] = no_value
    return {"type": "timeseries", "title": title, "description": description, "datasource": DATASOURCE,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table",
                                   "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": list(targets)}


def stat(title: str, description: str, unit: str, targets: Sequence[Json], *, thresholds: Json,
         mappings: list[Json] | None = None, color_mode: str = "background", no_value: str | None = None) -> Json:
    """A stat panel coloured by thresholds (last value)."""
    defaults: Json = {"unit": unit, "thresholds": thresholds, "mappings": mappings or [],
                      "color": {"mode": "thresholds"}}
    if no_value is not None:
        defaults["noValue"] = no_value
    return {"type": "stat", "title": title, "description": description, "datasource": DATASOURCE,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"colorMode": color_mode, "graphMode": "none", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "value_and_name",
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            "targets": list(targets)}


def table_panel(title: str, description: str, unit: str, targets: Sequence[Json],
                transformations: Sequence[Json], *, overrides: Sequence[Json] = (),
                sort_by: str | None = None) -> Json:
    """A table of instant queries, shaped by Grafana transformations."""
    options: Json = {"cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""},
                     "showHeader": True}
    if sort_by:
        options["sortBy"] = [{"desc": True, "displayName": sort_by}]
    return {"type": "table", "title": title, "description": description, "datasource": DATASOURCE,
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": steps("green"),
                                         "custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
                            "overrides": list(overrides)},
            "options": options, "targets": list(targets), "transformations": list(transformations)}


def state_timeline(title: str, description: str, targets: Sequence[Json]) -> Json:
    """A state timeline of check statuses (-1 unknown, 0 ok, 1 warning, 2 critical)."""
    return {"type": "state-timeline", "title": title, "description": description, "datasource": DATASOURCE,
            "fieldConfig": {"defaults": {"unit": "none", "mappings": STATUS_MAPPINGS,
                                         "thresholds": STATUS_STEPS, "color": {"mode": "thresholds"},
                                         "custom": {"fillOpacity": 80, "lineWidth": 0}},
                            "overrides": []},
            "options": {"alignValue": "left", "mergeValues": True, "rowHeight": 0.9, "showValue": "never",
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "single", "sort": "none"}},
            "targets": list(targets)}


def rename_override(field: str, display: str, *, unit: str | None = None,
                    status: bool = False) -> Json:
    """Table column override: display name, optional unit, optional status colouring."""
    props: list[Json] = [{"id": "displayName", "value": display}]
    if unit:
        props.append({"id": "unit", "value": unit})
    if status:
        props += [{"id": "mappings", "value": STATUS_MAPPINGS},
                  {"id": "thresholds", "value": STATUS_STEPS},
                  {"id": "custom.cellOptions", "value": {"type": "color-background"}}]
    return {"matcher": {"id": "byName", "options": field}, "properties": props}


# --- variables ----------------------------------------------------------------------------------


def _query_var(name: str, label: str, query: str, *, hide: int = 0) -> Json:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "definition": query, "query": {"query": query, "refId": f"var-{name}"},
            "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [], "regex": "", "hide": hide, "skipUrlSync": False}


# Series present on any server we can show: our check level (the deprecated check_status for sidecars of
# the previous release), or SGLang's own scheduler gauge.
_ANY_SERVER = ('{__name__=~"sglang_tuning_check_level|sglang_tuning_check_status|sglang[:_]num_running_reqs", '
               + SCOPE_SEL + 'job=~"$job"')
# build_info: every sidecar has it (`up` only those with --sglang.url)
_ANY_TARGET = '{__name__=~"sglang_tuning_build_info|sglang[:_]num_running_reqs"'


def variables(*, per_rank_vars: bool = True) -> list[Json]:
    """`datasource`, `cluster`, `namespace`, `pod`, `job`, `instance`, `model_name` and (per rank) `dp_rank`,
    chained in that order."""
    out: list[Json] = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
         "regex": "", "skipUrlSync": False},
        _query_var("cluster", "Cluster", f"label_values({_ANY_TARGET}}}, cluster)"),
        _query_var("namespace", "Namespace", f'label_values({_ANY_TARGET}, cluster=~"$cluster"}}, namespace)'),
        _query_var("pod", "Pod", f'label_values({_ANY_TARGET}, cluster=~"$cluster", namespace=~"$namespace"}}, pod)'),
        _query_var("job", "Job", f"label_values({_ANY_TARGET}, {SCOPE_SEL.rstrip(', ')}}}, job)"),
        _query_var("instance", "Instance", f"label_values({_ANY_SERVER}}}, instance)"),
        _query_var("model_name", "Model",
                   f'label_values({_ANY_SERVER}, instance=~"$instance"}}, model_name)'),
    ]
    if per_rank_vars:
        out.append(_query_var(
            "dp_rank", "DP rank",
            f'label_values({_ANY_SERVER}, instance=~"$instance", model_name=~"$model_name"}}, dp_rank)'))
    return out


# --- layout -------------------------------------------------------------------------------------


def layout(rows: Sequence[tuple[str, Sequence[Cell]]]) -> list[Json]:
    """Place rows of cells left to right on the 24-wide grid; ids follow the order (stable)."""
    panels: list[Json] = []
    y = 0
    next_id = 1
    for title, cells in rows:
        panels.append({"type": "row", "title": title, "id": next_id, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id += 1
        y += 1
        x = 0
        row_h = 0
        for cell in cells:
            if x + cell.w > 24:
                x, y, row_h = 0, y + row_h, 0
            panel = dict(cell.panel)
            panel["id"] = next_id
            panel["gridPos"] = {"h": cell.h, "w": cell.w, "x": x, "y": y}
            next_id += 1
            panels.append(panel)
            x += cell.w
            row_h = max(row_h, cell.h)
        y += row_h
    return panels


# A restart with other flags (or a live server-info change) moves a `sglang_tuning_server_arg` series: one
# annotation per changed argument, so a step in a panel can be read against the change that caused it.
# `$__rate_interval` (at least four scrapes) rather than `$__interval`: a window shorter than two scrapes
# would never see the value move.
FLAG_CHANGES_EXPR = f"changes(sglang_tuning_server_arg{{{HOST_SEL}}}[$__rate_interval]) > 0"


def flag_changes_annotation() -> Json:
    """The Grafana (Prometheus) annotation marking flag changes."""
    return {"datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": "orange",
            "name": "Flag changes", "expr": FLAG_CHANGES_EXPR, "step": "$__rate_interval",
            "titleFormat": "--{{arg}} changed", "textFormat": "{{instance}}: server argument {{arg}} took another "
            "value (restart with other flags); see `GET /api/changes` for the verdict",
            "tagKeys": "instance,arg", "useValueForTime": False,
            "target": {"expr": FLAG_CHANGES_EXPR, "refId": "flag-changes", "interval": "", "legendFormat": ""}}


def dashboard(uid: str, title: str, description: str, panels: list[Json], templating: list[Json],
              links: list[Json]) -> Json:
    """The dashboard envelope (no numeric id: Grafana assigns it; uid is stable)."""
    return {"annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                      "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                      "name": "Annotations & Alerts", "type": "dashboard"},
                                     flag_changes_annotation()]},
            "description": description, "editable": True, "fiscalYearStartMonth": 0, "graphTooltip": 1,
            "links": links, "panels": panels, "refresh": "30s", "schemaVersion": SCHEMA_VERSION,
            "tags": TAGS, "templating": {"list": templating},
            "time": {"from": "now-3h", "to": "now"}, "timepicker": {}, "timezone": "",
            "title": title, "uid": uid, "version": 1, "weekStart": ""}


def link(title: str, uid: str) -> Json:
    """A dashboard link to another dashboard by uid, keeping the time range and variables."""
    return {"title": title, "type": "link", "url": f"/d/{uid}?${{__url_time_range}}&${{__all_variables}}",
            "icon": "dashboard", "targetBlank": False, "tooltip": "", "asDropdown": False,
            "includeVars": False, "keepTime": False, "tags": []}



def dump(obj: Json) -> str:
    """Deterministic JSON text (sorted keys, two-space indent, final newline)."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
