"""Dashboards generated from the checks table: committed JSON, panel lint, metric names, PromQL syntax."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from helpers.lookups import exposed_names
from helpers.netutil import free_port, stop_process
from helpers.paths import FIXTURES, ROOT
from helpers.promql_lint import (
    AGGREGATIONS,
    FUNCTIONS,
    KEYWORDS,
    PromQLLintError,
    known_names,
    matchers,
    metric_names,
    range_durations,
    sglang_names,
    unknown_metrics,
)
from sglang_tuning_exporter.core.catalog import RANK_LABELS
from sglang_tuning_exporter.guide.checks import CheckTable, load_table
from sglang_tuning_exporter.render import dashboards as render_dashboards
from sglang_tuning_exporter.render.grafana import SCHEMA_VERSION

SCAN = FIXTURES / "sglang-metric-names.txt"
VARIABLES = ("datasource", "cluster", "namespace", "pod", "job", "instance", "model_name", "dp_rank")

TABLE = load_table()
GENERATED = render_dashboards.generate(TABLE)
DASHBOARDS: dict[str, dict[str, Any]] = {path: json.loads(text) for path, text in GENERATED.items()}
PANELS = [(path, p) for path, d in DASHBOARDS.items() for p in d["panels"] if p["type"] != "row"]
TARGETS = [(path, p, t) for path, p in PANELS for t in p["targets"]]


def _pid(item: tuple[Any, ...]) -> str:
    path, panel = item[0], item[1]
    return f"{Path(path).stem}:{panel['id']}:{panel['title']}"


def test_committed_dashboards_match_generator(update_golden: bool) -> None:
    """dashboards/*.json are exactly what the generator writes (rewrite with --update-golden)."""
    for rel, text in GENERATED.items():
        path = ROOT / rel
        if update_golden:
            path.write_text(text, encoding="utf-8")
        assert path.read_text(encoding="utf-8") == text, f"{rel} drifted: run `sglang-tuning-exporter render`"


def test_output_is_deterministic_with_sorted_keys() -> None:
    """Two runs give identical text, keys sorted, no numeric dashboard id, stable uids."""
    assert render_dashboards.generate(load_table()) == GENERATED
    for rel, text in GENERATED.items():
        doc = json.loads(text)
        assert json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n" == text
        assert "id" not in doc, rel
        assert doc["uid"] in (render_dashboards.SERVER_UID, render_dashboards.FLEET_UID)
        assert doc["schemaVersion"] == SCHEMA_VERSION


def test_panel_ids_unique_and_grid_does_not_overlap() -> None:
    """Panel ids are unique per dashboard and no two panels overlap on the 24-column grid."""
    for rel, doc in DASHBOARDS.items():
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), rel
        cells: set[tuple[int, int]] = set()
        for p in doc["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (rel, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, (rel, p["title"])
            cells |= mine


def test_variables_present_and_datasource_never_hard_coded() -> None:
    """Every dashboard has the five variables; the datasource one is of type datasource."""
    for rel, doc in DASHBOARDS.items():
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert tuple(variables) == VARIABLES, rel
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for name in VARIABLES[1:]:
            assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def _datasources(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict):
            found.append(ds)
        for value in node.values():
            found += _datasources(value)
    elif isinstance(node, list):
        for value in node:
            found += _datasources(value)
    return found


def test_every_datasource_reference_is_the_variable() -> None:
    """No panel, target or variable names a concrete datasource uid (only Grafana's built-in annotations)."""
    for rel, doc in DASHBOARDS.items():
        refs = _datasources({"panels": doc["panels"], "templating": doc["templating"]})
        assert refs, rel
        assert all(ds == {"type": "prometheus", "uid": "${datasource}"} for ds in refs), rel


@pytest.mark.parametrize("item", PANELS, ids=_pid)
def test_panel_has_unit_and_useful_description(item: tuple[str, dict[str, Any]]) -> None:
    """Unit set; description says what healthy looks like and which flag (or knob) moves it."""
    _, panel = item
    assert panel["fieldConfig"]["defaults"].get("unit"), "unit missing"
    description = panel.get("description", "")
    assert "Healthy" in description, "description must say what healthy looks like"
    assert re.search(r"--[a-z][a-z-]+|\bflag\b", description), "description must name the flag that moves it"
    assert panel["type"] in ("timeseries", "stat", "table", "state-timeline")
    assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert panel["targets"], "panel has no query"


@pytest.mark.parametrize("item", TARGETS, ids=_pid)
def test_query_uses_variables_and_rate_interval(item: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    """Every selector filters by job and instance (SGLang's also by model and DP rank); ranges are `$__rate_interval`."""
    _, _, tgt = item
    expr = tgt["expr"]
    assert tgt["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    for sel in matchers(expr):
        assert sel.get("job") == ("=~", "$job") and sel.get("instance") == ("=~", "$instance"), sel
        name = sel.get("__name__", ("", ""))[1]
        if name.startswith("(ray_)?sglang[:_]"):
            assert sel.get("model_name") == ("=~", "$model_name") and sel.get("dp_rank") == ("=~", "$dp_rank")
    ranges = range_durations(expr)
    assert all(r == "$__rate_interval" for r in ranges), ranges
    if re.search(r"\b(rate|irate|increase|deriv|delta)\(", expr):
        assert ranges, "a rate without a range"


def _rank_metric(name: str) -> bool:
    from sglang_tuning_exporter.core.catalog import BY_NAME
    spec = BY_NAME.get(name)
    return bool(spec and set(RANK_LABELS) <= set(spec.labels))


def test_rank_metric_selectors_carry_model_and_dp_rank() -> None:
    """Every selector of one of our per-rank metrics also filters by `$model_name` and `$dp_rank`."""
    checked = 0
    for _, _, tgt in TARGETS:
        for metric in metric_names(tgt["expr"]).metrics:
            if not _rank_metric(metric):
                continue
            for m in re.finditer(re.escape(metric) + r"\{([^}]*)\}", tgt["expr"]):
                assert 'model_name=~"$model_name"' in m.group(1) and 'dp_rank=~"$dp_rank"' in m.group(1)
                checked += 1
    assert checked > 20


KNOWN = known_names(SCAN, ROOT / "alerts")


@pytest.mark.parametrize("item", TARGETS, ids=_pid)
def test_query_metrics_exist(item: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    """Every metric a panel queries is exported by us (catalog or recording rules) or by SGLang."""
    _, _, tgt = item
    assert unknown_metrics(tgt["expr"], KNOWN) == []


def test_variable_queries_use_known_metrics() -> None:
    """`label_values(...)` variable queries select metrics that exist."""
    for rel, doc in DASHBOARDS.items():
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"]["query"])
            assert m, var["query"]
            assert m.group(2) == var["name"], rel
            assert unknown_metrics(m.group(1), KNOWN) == [], (rel, var["name"])


def test_lint_fails_on_a_metric_nobody_exports() -> None:
    """The lint reports a misspelt metric, an unknown `__name__` alternative, and accepts both spellings."""
    assert unknown_metrics('rate(sglang_tuning_retraction_total{job="x"}[5m])', KNOWN) == [
        "sglang_tuning_retraction_total"]
    assert unknown_metrics('{__name__=~"sglang[:_]token_usage|sglang[:_]tokens_usage"}', KNOWN) == [
        "__name__=~'sglang[:_]tokens_usage'"]
    assert unknown_metrics("sglang:token_usage + sglang_token_usage", KNOWN) == []
    assert unknown_metrics("sglang:num_requests_running", KNOWN) == ["sglang:num_requests_running"]
    # The SLO recording rules are known because the renderer names them, not by their prefix.
    assert unknown_metrics("instance:sglang_slo_ttft_burn_rate:rate6h", KNOWN) == []
    assert unknown_metrics("instance:sglang_slo_e2e_burn_rate:rate1h + instance:sglang_slo_ttft_burn_rate:rate2h",
                           KNOWN) == ["instance:sglang_slo_e2e_burn_rate:rate1h",
                                      "instance:sglang_slo_ttft_burn_rate:rate2h"]


def test_tokenizer_tells_metrics_from_labels_functions_and_keywords() -> None:
    """Labels in matchers and grouping clauses, functions, keywords, strings and variables are not metrics."""
    expr = ('histogram_quantile(0.9, sum by (le, instance) (rate(a_bucket{job=~"$job", x="or"}[$__rate_interval])))'
            ' / on (instance) group_left (model_name) b > bool 1 or vector(0) unless c[5m:1m] offset 1h'
            ' and {__name__="d"} * topk(3, e)')
    names = metric_names(expr)
    assert names.metrics == {"a_bucket", "b", "c", "d", "e"}
    with pytest.raises(PromQLLintError):
        metric_names("not_a_function(foo)")
    with pytest.raises(PromQLLintError):
        metric_names("foo{a=\"b\"")


_NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,12}(:[a-z0-9_]{1,8})?", fullmatch=True).filter(
    lambda n: n not in FUNCTIONS | AGGREGATIONS | KEYWORDS and not n.startswith("__"))
_LABEL = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda n: not n.startswith("__"))
_VALUE = st.text(alphabet='abc xyz_.,{}[]()"\\', max_size=8)


@st.composite
def _selector(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(_NAME)
    matchers = draw(st.lists(st.tuples(_LABEL, st.sampled_from(["=", "!=", "=~", "!~"]), _VALUE), max_size=3))
    body = ", ".join(f'{label}{op}{json.dumps(value)}' for label, op, value in matchers)
    return name, f"{name}{{{body}}}" if matchers or draw(st.booleans()) else name


@given(st.lists(_selector(), min_size=1, max_size=4), st.sampled_from(["rate", "increase", "deriv"]),
       st.lists(_LABEL, min_size=1, max_size=3))
@settings(max_examples=examples(150), deadline=None)
def test_tokenizer_finds_exactly_the_selected_metrics(selectors: list[tuple[str, str]], fn: str,
                                                      by: list[str]) -> None:
    """Random selectors with tricky label values, combined by functions, grouping and operators."""
    parts = [f"sum by ({', '.join(by)}) ({fn}({sel}[$__rate_interval]))" for _, sel in selectors]
    expr = " / on (instance) group_left (model_name) ".join(parts) + " > bool 0.5"
    assert metric_names(expr).metrics == {name for name, _ in selectors}
    assert range_durations(expr) == ["$__rate_interval"] * len(selectors)


def test_sglang_names_expand_types_and_spellings() -> None:
    """Counters gain `_total` once, histograms `_bucket/_sum/_count`, and both spellings exist."""
    names = sglang_names(SCAN)
    assert {"sglang:num_retracted_requests_total", "sglang_num_retracted_requests_total",
            "sglang:num_bootstrap_failed_reqs_total", "sglang:e2e_request_latency_seconds_bucket",
            "sglang_token_usage"} <= names
    assert "sglang:num_retracted_requests_total_total" not in names
    assert not exposed_names() & names


def test_fixture_scan_matches_shared_reference(shared_dir: Path) -> None:
    """The fixture's SGLang names are the reference scan's (refresh the fixture when the scan changes)."""
    scan = shared_dir / "reference" / "sglang-fixtures" / "metrics-by-release-static-scan.txt"
    assert sglang_names(SCAN) == sglang_names(scan)


def _panel(doc: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in doc["panels"] if p["title"] == title)


def _steps(panel: dict[str, Any]) -> list[float | None]:
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_thresholds_are_the_default_profiles_numbers() -> None:
    """Queue band, token usage, retractions/min and the memory band come from the default profile."""
    server = DASHBOARDS["dashboards/sglang-tuning-server.json"]
    prof = TABLE.profiles[TABLE.default_profile()]
    assert _steps(_panel(server, "Queue (#queue-req)")) == [None, *prof.queue_band]
    checks = TABLE.by_id()
    assert _steps(_panel(server, "Retractions per minute"))[1] == \
        checks["retractions_frequent"].thresholds_for(prof.name)["warning"]
    mem = _steps(_panel(server, "Available GPU memory after startup"))
    gib = render_dashboards.GIB
    assert mem[0] is None and [v / gib for v in mem[1:] if v is not None] == [1.0, 5.0, 8.0, 10.0]
    assert _steps(_panel(server, "KV-cache token usage"))[1] == 0.9


def test_thresholds_follow_the_table_not_the_code() -> None:
    """Changing the table (another profile, another retraction threshold) changes the dashboards."""
    older = render_dashboards.generate(TABLE, profile="older-md")
    queue = _panel(json.loads(older["dashboards/sglang-tuning-server.json"]), "Queue (#queue-req)")
    assert _steps(queue) == [None, *TABLE.profiles["older-md"].queue_band]

    def bump(check: Any) -> Any:
        """The retraction check with a warning threshold of 3/min."""
        if check.id != "retractions_frequent":
            return check
        thresholds = {p: {**levels, "warning": 3.0} for p, levels in check.thresholds.items()}
        return dataclasses.replace(check, thresholds=thresholds)

    edited = CheckTable(checks=[bump(c) for c in TABLE.checks], profiles=TABLE.profiles,
                        non_checks=TABLE.non_checks, workloads=TABLE.workloads, defaults=TABLE.defaults)
    server = json.loads(render_dashboards.generate(edited)["dashboards/sglang-tuning-server.json"])
    assert _steps(_panel(server, "Retractions per minute"))[1] == 3.0
    with pytest.raises(ValueError, match="unknown guide profile"):
        render_dashboards.generate(TABLE, profile="nope")


def test_table_without_a_needed_check_is_a_clear_error() -> None:
    """A table lacking a check the dashboards draw fails with its id, not a KeyError."""
    edited = CheckTable(checks=[c for c in TABLE.checks if c.id != "kv_underused"], profiles=TABLE.profiles,
                        non_checks=TABLE.non_checks, workloads=TABLE.workloads, defaults=TABLE.defaults)
    with pytest.raises(ValueError, match="kv_underused"):
        render_dashboards.generate(edited)


def _promql_for_promtool(expr: str) -> str:
    """Grafana variables replaced by values Prometheus accepts ("All": `.*`, which matches a missing label)."""
    return (expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
            .replace("$cluster", ".*").replace("$namespace", ".*").replace("$pod", ".*")
            .replace("$job", ".*").replace("$instance", ".*").replace("$model_name", ".*")
            .replace("$dp_rank", ".*"))


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses every panel query (as recording rules), variables substituted."""
    rules = [{"record": f"dashboard:query_{i}:check", "expr": _promql_for_promtool(tgt["expr"])}
             for i, (_, _, tgt) in enumerate(TARGETS)]
    path = tmp_path / "queries.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


# --- the queries compute the right thing (promtool evaluates them over synthetic series) -----------

OURS = 'job="sglang-tuning-exporter", model_name="m", dp_rank="0", pp_rank="0", moe_ep_rank=""'
NATIVE = 'job="sglang", model_name="m", engine_type="unified", pp_rank="0"'


def _expr(dashboard: str, title: str, ref: str = "A") -> str:
    panel = _panel(DASHBOARDS[f"dashboards/{dashboard}.json"], title)
    expr = next(t["expr"] for t in panel["targets"] if t["refId"] == ref)
    return f"round({_promql_for_promtool(expr)}, 0.001)"


def _sample(labels: str, value: float) -> dict[str, Any]:
    return {"labels": "{" + labels + "}", "value": value}


PROMTOOL_CASES: list[tuple[str, str, str, list[dict[str, Any]]]] = [
    # ours per TP rank collapses to one series; SGLang's colon and underscore spellings fill in for servers
    # without a sidecar; a per-priority series is not double-counted.
    ("sglang-tuning-server", "Queue (#queue-req)", "A", [
        _sample('dp_rank="0", instance="s1", model_name="m", pp_rank="0"', 150),
        _sample('instance="s2", model_name="m", pp_rank="0"', 7),
        _sample('instance="s3", model_name="m", pp_rank="0"', 9)]),
    # TP ranks of one replica repeat the same retractions: counted once (max), never summed.
    ("sglang-tuning-server", "Retractions per minute", "A", [
        _sample('dp_rank="0", instance="s1", model_name="m", pp_rank="0"', 2),
        _sample('instance="s2", model_name="m", pp_rank="0"', 3)]),
    # headroom: the least across TP ranks
    ("sglang-tuning-server", "Available GPU memory after startup", "A", [
        _sample('dp_rank="0", instance="s1", model_name="m", pp_rank="0"', 5 * 1024**3),
        _sample('instance="s2", model_name="m", pp_rank="0"', 6.5 * 1024**3)]),
    ("sglang-tuning-server", "Decode CUDA-graph coverage", "A", [
        _sample('dp_rank="0", instance="s1", model_name="m", pp_rank="0"', 0.9),
        _sample('instance="s2", model_name="m", pp_rank="0"', 0.75)]),
    ("sglang-tuning-server", "Prefix-cache hit ratio", "A", [
        _sample('dp_rank="0", instance="s1", model_name="m", pp_rank="0"', 0.25),
        _sample('instance="s2", model_name="m"', 0.5)]),
    ("sglang-tuning-server", "Active findings and flag changes", "C", [
        _sample('check="retractions_frequent", dp_rank="0", flag="--schedule-conservativeness", '
                'instance="s1", model_name="m"', 1)]),
    ("sglang-tuning-fleet", "Servers with a critical finding", "A", [_sample("", 1)]),
    ("sglang-tuning-fleet", "Servers with a warning", "A", [_sample("", 1)]),
    ("sglang-tuning-server", "Guide signals over the sidecar's window", "A", [
        _sample('instance="s1", signal="available_gpu_mem (GiB)"', 4),
        _sample('instance="s1", signal="retractions (/min)"', 3),
        _sample('instance="s1", signal="kv_underused_ratio"', 0.5)]),
]


def _input_series() -> list[dict[str, str]]:
    s1, s2, s3 = 'instance="s1"', 'instance="s2"', 'instance="s3"'
    series = [
        (f'sglang_tuning_queue_requests{{{OURS}, {s1}, tp_rank="0"}}', "150+0x20"),
        (f'sglang_tuning_queue_requests{{{OURS}, {s1}, tp_rank="1"}}', "150+0x20"),
        (f'sglang:num_queue_reqs{{{NATIVE}, {s2}, tp_rank="0"}}', "7+0x20"),
        (f'sglang:num_queue_reqs{{{NATIVE}, {s2}, tp_rank="0", priority="1"}}', "3+0x20"),
        (f'sglang_num_queue_reqs{{{NATIVE}, {s3}, tp_rank="0"}}', "9+0x20"),
        (f'sglang_tuning_retractions_total{{{OURS}, {s1}, tp_rank="0"}}', "0+2x20"),
        (f'sglang_tuning_retractions_total{{{OURS}, {s1}, tp_rank="1"}}', "0+2x20"),
        (f'sglang:num_retracted_requests_total{{{NATIVE}, {s2}, tp_rank="1"}}', "0+3x20"),
        (f'sglang:num_retracted_requests_total{{{NATIVE}, {s2}, tp_rank="0"}}', "0+3x20"),
        (f'sglang_tuning_available_gpu_memory_bytes{{{OURS}, {s1}, tp_rank="0"}}', f"{5 * 1024**3}+0x20"),
        (f'sglang_tuning_available_gpu_memory_bytes{{{OURS}, {s1}, tp_rank="1"}}', f"{7 * 1024**3}+0x20"),
        (f'sglang:startup_available_gpu_memory_gb{{{NATIVE}, {s2}, tp_rank="1"}}', "9+0x20"),
        (f'sglang:startup_available_gpu_memory_gb{{{NATIVE}, {s2}, tp_rank="0"}}', "6.5+0x20"),
        (f'sglang_tuning_decode_samples_total{{{OURS}, {s1}, tp_rank="0", cuda_graph="true"}}', "0+9x20"),
        (f'sglang_tuning_decode_samples_total{{{OURS}, {s1}, tp_rank="0", cuda_graph="false"}}', "0+1x20"),
        (f'sglang_tuning_decode_samples_total{{{OURS}, {s1}, tp_rank="1", cuda_graph="true"}}', "0+9x20"),
        (f'sglang_tuning_decode_samples_total{{{OURS}, {s1}, tp_rank="1", cuda_graph="false"}}', "0+1x20"),
        (f'sglang_tuning_decode_samples_total{{{OURS}, {s1}, tp_rank="0", cuda_graph="unknown"}}', "0+5x20"),
        (f'sglang:cuda_graph_passes_total{{{NATIVE}, {s2}, tp_rank="0", mode="decode_cuda_graph"}}', "0+3x20"),
        (f'sglang:cuda_graph_passes_total{{{NATIVE}, {s2}, tp_rank="0", mode="decode_none"}}', "0+1x20"),
        (f'sglang:cuda_graph_passes_total{{{NATIVE}, {s2}, tp_rank="0", mode="prefill_cuda_graph"}}', "0+50x20"),
        (f'sglang_tuning_prefill_tokens_total{{{OURS}, {s1}, tp_rank="0", source="cached"}}', "0+100x20"),
        (f'sglang_tuning_prefill_tokens_total{{{OURS}, {s1}, tp_rank="0", source="new"}}', "0+300x20"),
        (f'sglang:cached_tokens_total{{job="sglang", model_name="m", {s2}, cache_source="device"}}', "0+50x20"),
        (f'sglang:prompt_tokens_total{{job="sglang", model_name="m", {s2}}}', "0+100x20"),
        # s1: one critical check with a flag, one ok check whose current value must not be listed
        (f'sglang_tuning_check_level{{{OURS}, {s1}, tp_rank="0", check="retractions_frequent"}}', "2+0x20"),
        (f'sglang_tuning_check_level{{{OURS}, {s1}, tp_rank="0", check="kv_underused"}}', "0+0x20"),
        # s2: a check only at warning whose highest possible level is critical: the deprecated check_status
        # said severity="critical"; the level says warning, so s2 is no "server with a critical finding".
        (f'sglang_tuning_check_level{{{OURS}, {s2}, tp_rank="0", check="gpu_mem_headroom_low"}}', "1+0x20"),
        (f'sglang_tuning_check_status{{{OURS}, {s2}, tp_rank="0", check="gpu_mem_headroom_low", '
         'severity="critical"}', "1+0x20"),
        # signals by unit: bytes shown in GiB, per second per minute, ratios as they are; the least replica
        # for the headroom (a check pages on it when low), the most for the rest
        (f'sglang_tuning_signal_bytes{{{OURS}, {s1}, tp_rank="0", signal="available_gpu_mem"}}', f"{6 * 1024**3}+0x20"),
        (f'sglang_tuning_signal_bytes{{{OURS}, {s1}, tp_rank="1", signal="available_gpu_mem"}}', f"{4 * 1024**3}+0x20"),
        (f'sglang_tuning_signal_per_second{{{OURS}, {s1}, tp_rank="0", signal="retractions"}}', "0.05+0x20"),
        (f'sglang_tuning_signal_ratio{{{OURS}, {s1}, tp_rank="0", signal="kv_underused_ratio"}}', "0.25+0x20"),
        (f'sglang_tuning_signal_ratio{{{OURS}, {s1}, tp_rank="1", signal="kv_underused_ratio"}}', "0.5+0x20"),
        (f'sglang_tuning_current_value{{{OURS}, {s1}, tp_rank="0", check="retractions_frequent", '
         'flag="--schedule-conservativeness"}', "1+0x20"),
        (f'sglang_tuning_current_value{{{OURS}, {s1}, tp_rank="0", check="kv_underused", '
         'flag="--schedule-conservativeness"}', "1+0x20"),
    ]
    return [{"series": s, "values": v} for s, v in series]


def _promtool_test(tmp_path: Path, cases: list[tuple[str, str, str, list[dict[str, Any]]]]
                   ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "none.rules.yaml").write_text("groups: []\n", encoding="utf-8")
    tests = [{"interval": "1m", "input_series": _input_series(), "promql_expr_test": [
        {"expr": _expr(dash, title, ref), "eval_time": "10m", "exp_samples": samples}
        for dash, title, ref, samples in cases]}]
    path = tmp_path / "dashboards.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": ["none.rules.yaml"], "evaluation_interval": "1m",
                                    "tests": tests}, sort_keys=False), encoding="utf-8")
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=60, check=False, cwd=tmp_path)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_panel_queries_compute_the_guide_signals(tmp_path: Path) -> None:
    """promtool evaluates key panels over synthetic series: ours first, both SGLang spellings, units, ratios."""
    proc = _promtool_test(tmp_path, PROMTOOL_CASES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_panel_query_check_detects_a_wrong_value(tmp_path: Path) -> None:
    """The promtool harness fails when a panel computes something else (the check can fail)."""
    dash, title, ref, samples = PROMTOOL_CASES[0]
    wrong = [*samples[:-1], _sample('instance="s3", model_name="m"', 8)]
    proc = _promtool_test(tmp_path, [(dash, title, ref, wrong)])
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr


# --- live: the real sidecar on the demo log, scraped by a real Prometheus, answers the panels --------

LIVE_RATE = "30s"
# Panels the recorded demo log must fill (it has decode/prefill lines, retractions, startup memory,
# a CUDA-graph capture and firing checks); OOM panels stay empty: the demo has no OOM.
MUST_HAVE_DATA = {
    "sglang-tuning-server": {
        "Active findings and flag changes", "Check status over time", "Guide signals over the sidecar's window",
        "Queue (#queue-req)", "KV-cache token usage", "Retractions per minute",
        "Available GPU memory after startup", "Decode CUDA-graph coverage",
        "Decode batch size vs captured CUDA-graph max", "Running requests vs --max-running-requests",
        "Generation throughput", "Prefix-cache hit ratio", "Sources", "Seconds since the last log line",
        "Log lines read"},
    "sglang-tuning-fleet": {
        "Servers with a critical finding", "Servers reporting", "Firing checks by server",
        "Check status matrix (now)", "Top offenders", "Suggested flag changes", "Firing checks by check",
        "Retractions per minute, worst servers"},
}




def _query(base: str, expr: str) -> list[dict[str, Any]]:
    import urllib.parse
    import urllib.request
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus (Debian package) not installed")
def test_live_panels_have_data_from_the_demo_log(tmp_path: Path) -> None:
    """Real `serve` on the demo log, scraped by real Prometheus: every query runs, demo-fed panels have data."""
    import sys
    recorded = ROOT / "examples" / "recorded.log"
    log = tmp_path / "sglang.log"
    log.write_text(recorded.read_text(encoding="utf-8"), encoding="utf-8")
    exporter_port, prom_port = free_port(), free_port()
    serve = ("import argparse, sys\nfrom sglang_tuning_exporter.sidecar import serve\n"
             "p = argparse.ArgumentParser(); serve.add_arguments(p)\nsys.exit(serve.run(p.parse_args()))")
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "sglang-tuning-exporter",
                                  "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-c", serve, f"--web.listen-address=127.0.0.1:{exporter_port}",
             f"--sglang.log-file={log}", "--from-start"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.err").open("wb")))
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.err").open("wb")))
        base = f"http://127.0.0.1:{prom_port}"
        # Rates need several samples per series inside the range.
        _wait(lambda: any(float(r["value"][1]) >= 4 for r in _query(
            base, 'count_over_time(sglang_tuning_decode_samples_total{cuda_graph="true"}[1m])')),
            45, "four scrapes of the sidecar")
        with_data: set[tuple[str, str]] = set()
        values: dict[tuple[str, str], list[float]] = {}
        for path, doc in DASHBOARDS.items():
            stem = Path(path).stem
            for panel in doc["panels"]:
                for tgt in panel.get("targets", []):
                    # Every query must run; a panel has data when one of its targets returns series.
                    result = _query(base, _promql_for_promtool(tgt["expr"]).replace("5m", LIVE_RATE))
                    if result:
                        with_data.add((stem, panel["title"]))
                        values.setdefault((stem, panel["title"]), []).extend(
                            float(r["value"][1]) for r in result)
            for var in doc["templating"]["list"]:
                if var["type"] == "query":
                    selector = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
                    assert selector
                    expr = _promql_for_promtool(selector.group(1))
                    assert _query(base, f"count({expr})"), f"variable {var['name']} has no series"
        missing = {(stem, title) for stem, titles in MUST_HAVE_DATA.items() for title in titles} - with_data
        assert not missing, sorted(missing)
        # The demo has no OOM: the counters are exported at 0 (so a first OOM shows in increase()),
        # and the panel must read 0 everywhere.
        oom = values.get(("sglang-tuning-server", "Out-of-memory events"), [])
        assert oom and all(v == 0 for v in oom), oom
        assert _query(base, _promql_for_promtool(
            _panel(DASHBOARDS["dashboards/sglang-tuning-fleet.json"],
                   "Servers with a critical finding")["targets"][0]["expr"]))[0]["value"][1] == "1"
        # A log-only sidecar (no --sglang.url) is not a failing scrape.
        assert _query(base, _promql_for_promtool(
            _panel(DASHBOARDS["dashboards/sglang-tuning-fleet.json"],
                   "Sidecars that cannot scrape SGLang")["targets"][0]["expr"]))[0]["value"][1] == "0"
    finally:
        for proc in procs:
            stop_process(proc)


# --- flag changes as annotations (issue 16) ----------------------------------------------------------


def _annotation(doc: dict[str, Any]) -> dict[str, Any]:
    (a,) = [a for a in doc["annotations"]["list"] if a.get("name") == "Flag changes"]
    return a


@pytest.mark.parametrize("path", sorted(DASHBOARDS))
def test_flag_changes_annotation_reads_the_server_arg_series(path: str) -> None:
    """Both dashboards mark flag changes from `sglang_tuning_server_arg`, with the datasource variable and the
    dashboard's job/instance filters, tagged with the argument that changed."""
    a = _annotation(DASHBOARDS[path])
    assert a["enable"] and a["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert a["expr"] == a["target"]["expr"]
    assert metric_names(a["expr"]).metrics == {"sglang_tuning_server_arg"}
    assert "sglang_tuning_server_arg" in exposed_names()
    assert range_durations(a["expr"]) == ["$__rate_interval"]
    (m,) = matchers(a["expr"])
    assert m["job"] == ("=~", "$job") and m["instance"] == ("=~", "$instance")
    assert "arg" in a["tagKeys"].split(",")


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_flag_changes_annotation_fires_only_around_a_change(tmp_path: Path) -> None:
    """promtool evaluates the annotation over a server restarted at minute 6 with another
    --schedule-conservativeness: one event for that arg while the change is in the window, none for the arg
    that kept its value, none once the change has left the window."""
    expr = _promql_for_promtool(_annotation(DASHBOARDS["dashboards/sglang-tuning-server.json"])["expr"])
    labels = 'instance="s1", job="sglang-tuning-exporter"'
    series = [{"series": f'sglang_tuning_server_arg{{{labels}, arg="schedule_conservativeness"}}',
               "values": "1x5 1.3x14"},
              {"series": f'sglang_tuning_server_arg{{{labels}, arg="mem_fraction_static"}}', "values": "0.88x20"}]
    (tmp_path / "none.rules.yaml").write_text("groups: []\n", encoding="utf-8")
    cases = [{"expr": expr, "eval_time": "8m",
              "exp_samples": [_sample(f'{labels}, arg="schedule_conservativeness"', 1)]},
             {"expr": expr, "eval_time": "4m", "exp_samples": []},
             {"expr": expr, "eval_time": "19m", "exp_samples": []}]
    doc = {"rule_files": ["none.rules.yaml"], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}]}
    (tmp_path / "annotation.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    proc = subprocess.run(["promtool", "test", "rules", "annotation.test.yaml"], capture_output=True, text=True,
                          timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sglang_selectors_read_every_spelling() -> None:
    """Each selector of SGLang's own metrics matches `sglang:x`, `sglang_x` and Ray Serve's `ray_sglang_x`."""
    regexes = {m for _, _, tgt in TARGETS for m in re.findall(r'__name__=~"([^"]*sglang\[:_\][^"]*)"', tgt["expr"])}
    assert regexes
    for rx in regexes:
        for alternative in rx.split("|"):
            m = re.search(r"sglang\[:_\]([a-z0-9_]+)$", alternative)
            if m is None:
                continue
            for spelling in ("sglang:", "sglang_", "ray_sglang_"):
                assert re.fullmatch(alternative, spelling + m.group(1)), (alternative, spelling)
