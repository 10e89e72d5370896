"""Unit tests of the fleet report: PromQL plan, folding answers, drift, flags and output formats (no I/O)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.paths import FIXTURES, ROOT
from sglang_tuning_exporter.cli import main
from sglang_tuning_exporter.core.exit_codes import UsageError
from sglang_tuning_exporter.core.model import Finding, Rank
from sglang_tuning_exporter.fleet import formats as report_formats
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet import report
from sglang_tuning_exporter.fleet.promapi import Sample
from sglang_tuning_exporter.fleet.report import (
    FleetReport,
    InstanceReport,
    evaluate_fleet,
    natural_key,
    parse_duration,
    parse_time,
)
from sglang_tuning_exporter.pipeline.signals import SignalParams

GOLDEN = FIXTURES / "report"
END = 1_793_491_200.0


def window(length: float = 7 * 86400, selector: str = "") -> fleet.Window:
    """A review window ending at END."""
    return fleet.Window(start=END - length, end=END, step_s=300, selector=selector)


# ------------------------------------------------------------------------------------------ selector, plan


def test_parse_selector_accepts_matchers() -> None:
    """Braces optional; every operator kept; escaped quotes kept."""
    assert fleet.parse_selector('{job="sglang", cluster=~"eu-.*"}') == 'job="sglang",cluster=~"eu-.*"'
    assert fleet.parse_selector('env!="dev"') == 'env!="dev"'
    assert fleet.parse_selector('{a="x\\"y"}') == 'a="x\\"y"'
    assert fleet.parse_selector(None) == "" and fleet.parse_selector("{}") == ""


@pytest.mark.parametrize("bad", ['{job="x"', 'job=x', '{job="x"} or up', '{__name__="up"}', '{job="x" env="y"}'])
def test_parse_selector_rejects_garbage(bad: str) -> None:
    """Anything that is not a matcher list is a SelectorError (usage error), never injected into PromQL."""
    with pytest.raises(fleet.SelectorError):
        fleet.parse_selector(bad)


def test_series_with_colon_names_and_matchers() -> None:
    """Names with a colon take matchers too; user matchers are appended."""
    assert fleet.series("sglang:num_queue_reqs", 'job="a"', 'priority=""') == 'sglang:num_queue_reqs{priority="",job="a"}'
    assert fleet.series("x", "") == "x{}"


def test_plan_size_is_fixed_and_every_query_groups_by_instance() -> None:
    """The plan has the same number of queries for any window or selector, each aggregated per instance."""
    a = fleet.plan(window()) + fleet.identity_queries(window())
    b = fleet.plan(window(3600, 'job="x"')) + fleet.identity_queries(window(3600, 'job="x"'))
    assert len(a) == len(b) and [q.key for q in a] == [q.key for q in b]
    for q in a:
        assert "by (instance" in q.expr, q.key
    assert all('job="x"' in q.expr for q in b)


def test_plan_reads_both_sglang_spellings_and_our_metrics() -> None:
    """Queue signals read sglang_tuning_*, sglang:* and sglang_* (priority total series only)."""
    q = {p.key: p.expr for p in fleet.plan(window())}
    expr = q["queue_empty_ratio"]
    assert "sglang_tuning_queue_requests{}" in expr
    assert 'sglang:num_queue_reqs{priority=""}' in expr and 'sglang_num_queue_reqs{priority=""}' in expr
    assert expr.index("sglang_tuning_queue_requests") < expr.index("sglang:num_queue_reqs")  # ours wins
    assert "[168h:5m]" in expr
    assert "sglang:num_retracted_requests_total" in q["retractions_per_minute"]
    assert "sglang_total_retracted_reqs" in q["retractions_per_minute"]


def test_plan_takes_signal_definitions_from_params() -> None:
    """The queue band edge, the usage that counts as good and the capped share come from SignalParams."""
    q = {p.key: p.expr for p in fleet.plan(window(), SignalParams(queue_band=(50, 500), usage_good=0.85,
                                                                  capped_fraction=0.9))}
    assert "> bool 500" in q["queue_over_band_ratio"]
    assert "< bool 0.85" in q["kv_underused_ratio"]
    assert ">= bool 0.9 *" in q["running_capped_ratio"]


def test_chart_queries_are_few_and_coarse() -> None:
    """At most three range queries, step range/120 (at least 60 s)."""
    assert len(fleet.chart_queries(window())) == 3
    assert fleet.chart_step(window()) == 5040.0
    assert fleet.chart_step(window(3600)) == 60.0


# ------------------------------------------------------------------------------------------ collect, drift


def s(value: float, **labels: str) -> Sample:
    """A sample with labels."""
    return Sample(labels=labels, value=value)


def test_collect_folds_answers_per_instance_and_rank() -> None:
    """Signals per (instance, dp rank); OOMs and sidecar signals fan out; args, info and models attach."""
    data = fleet.collect({
        "queue_empty_ratio": [s(0.7, instance="a:1"), s(0.1, instance="b:1", dp_rank="1"),
                              s(float("nan"), instance="c:1")],
        "oom": [s(2, instance="a:1", phase="decode")],
        "sidecar_signals": [s(0.9, instance="a:1", signal="queue_empty_ratio"),
                            s(0.4, instance="a:1", signal="gen_throughput_mean")],
        "args": [s(0.8, instance="a:1", arg="mem_fraction_static"), s(4096, instance="a:1", arg="chunked_prefill_size")],
        "info": [s(1, instance="a:1", version="0.5.23", model_name="m", schedule_policy="lpm")],
        "models": [s(1, instance="b:1", model_name="m2")],
        "native": [s(1, instance="b:1"), s(1, instance="d:1")],
    })
    a = data["a:1"]
    assert a.signals[Rank()]["queue_empty_ratio"] == 0.9  # the sidecar's windowed signal wins (what its alerts read)
    assert a.signals[Rank()]["gen_throughput_mean"] == 0.4
    assert a.signals[Rank()]["oom_decode_count"] == 2
    assert a.args == {"mem_fraction_static": 0.8, "chunked_prefill_size": 4096, "schedule_policy": "lpm"}
    assert (a.version, a.model_name) == ("0.5.23", "m")
    assert data["b:1"].signals[Rank(dp=1)]["queue_empty_ratio"] == 0.1 and data["b:1"].model_name == "m2"
    assert data["c:1"].signals[Rank()]["queue_empty_ratio"] is None
    # SGLang's own metrics reach Prometheus: --enable-metrics is on, on every rank.
    assert data["b:1"].signals[Rank(dp=1)]["metrics_enabled"] == 1.0
    assert data["d:1"].signals == {Rank(): {"metrics_enabled": 1.0}}
    assert "metrics_enabled" not in a.signals[Rank()]


@pytest.mark.parametrize("order", [0, 1])
def test_a_real_release_beats_a_floor_whatever_the_series_order(order: int) -> None:
    """Over a range a sidecar may export a floor (`>=0.5.7`, before server info answered) and then the
    release: the report shows the release, and its JSON keeps `version` a release or null."""
    infos = [s(1, instance="a:1", version=">=0.5.7"), s(1, instance="a:1", version="0.5.23")]
    data = fleet.collect({"info": infos if order else infos[::-1]})
    assert data["a:1"].version == "0.5.23"
    floors = [s(1, instance="b:1", version=">=0.4.7"), s(1, instance="b:1", version=">=0.5.7")]
    only_floor = fleet.collect({"info": floors if order else floors[::-1]})
    assert only_floor["b:1"].version == ">=0.5.7"  # the higher floor, in either order
    doc = report.InstanceReport("b:1", None, ">=0.5.7", {}, ()).to_json_dict()
    assert (doc["version"], doc["version_floor"]) == (None, "0.5.7")
    assert "version_floor" not in report.InstanceReport("a:1", None, "0.5.23", {}, ()).to_json_dict()


def inst(name: str, model: str | None, **args: float | str) -> fleet.InstanceData:
    """Instance data with args."""
    return fleet.InstanceData(instance=name, model_name=model, args=dict(args))


def test_drift_names_outliers_per_model() -> None:
    """One server at 0.80 beside five at 0.88 is drift; other models and ignored args are not."""
    group = [inst(f"10.0.0.{i}:9470", "m", mem_fraction_static=0.88, port=30000 + i) for i in range(5)]
    group.append(inst("10.0.0.9:9470", "m", mem_fraction_static=0.8, port=1))
    other = [inst("x:1", "other", mem_fraction_static=0.5), inst("y:1", None, mem_fraction_static=0.1)]
    drift = fleet.find_drift(group + other)
    assert [d.to_json_dict() for d in drift] == [{
        "model_name": "m", "arg": "mem_fraction_static",
        "values": {"0.88": [f"10.0.0.{i}:9470" for i in range(5)], "0.8": ["10.0.0.9:9470"]}}]
    assert list(drift[0].values.values())[1:] == [["10.0.0.9:9470"]]  # off the most common value


def test_drift_ignores_servers_missing_the_arg() -> None:
    """A server that does not report an arg is not a second value."""
    drift = fleet.find_drift([inst("a", "m", schedule_policy="lpm"), inst("b", "m", schedule_policy="lpm"),
                              inst("c", "m")])
    assert drift == []


def test_derive_signals_adds_ceiling_ratio() -> None:
    """cuda_graph_ceiling_ratio = captured / max_running_requests, as signals.py computes it."""
    d = fleet.InstanceData("a", signals={Rank(): {"cuda_graph_max_bs_captured": 64.0, "max_running_requests": 512.0}})
    assert fleet.derive_signals(d)[Rank()]["cuda_graph_ceiling_ratio"] == 0.125
    assert fleet.derive_signals(fleet.InstanceData("b")) == {Rank(): {}}


# ------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("1d12h", 129600), ("90m", 5400), ("1w", 604800),
                                               ("30s", 30)])
def test_parse_duration(text: str, seconds: float) -> None:
    """Prometheus-style durations."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "7", "7days", "-1d", "0s", "d7"])
def test_parse_duration_rejects(bad: str) -> None:
    """Bad durations are usage errors."""
    with pytest.raises(UsageError):
        parse_duration(bad)


def test_parse_time_forms() -> None:
    """RFC 3339 (Z or offset), unix seconds, and now."""
    assert parse_time("2026-11-01T00:00:00Z", 0) == END
    assert parse_time("2026-11-01T01:00:00+01:00", 0) == END
    assert parse_time(str(END), 0) == END and parse_time(None, 42.0) == 42.0
    with pytest.raises(UsageError):
        parse_time("yesterday", 0)


def test_natural_sort() -> None:
    """Instances sort by their numbers."""
    assert sorted(["10.0.0.10:1", "10.0.0.2:1", "a"], key=natural_key) == ["10.0.0.2:1", "10.0.0.10:1", "a"]


@pytest.mark.parametrize(("argv", "message"), [
    ([], "--prometheus.url is required"),
    (["--prometheus.url", "prometheus:9090"], "is not an http:// or https:// URL"),
    (["--prometheus.url", "http://p", "--range", "week"], "not a duration"),
    (["--prometheus.url", "http://p", "--selector", "job=sglang"], "expected label"),
    (["--prometheus.url", "http://p", "--prometheus.header", "NoColon"], "invalid --prometheus.header"),
    (["--prometheus.url", "http://p", "--prometheus.password-file", "/nonexistent/pw"], "cannot read password file"),
    (["--prometheus.url", "http://p", "--prometheus.ca-file", "/nonexistent/ca"], "no such file"),
    (["--prometheus.url", "http://p", "--guide-profile", "nope"], "unknown --guide-profile"),
    (["--prometheus.url", "http://p", "--server-arg", "novalue"], "KEY=VALUE"),
])
def test_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad flags: exit 2 with a message naming the problem, before any query is sent."""
    monkeypatch.delenv("SGLANG_TUNING_PROMETHEUS_URL", raising=False)
    assert main(["report", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_usage_errors_all_listed(capsys: pytest.CaptureFixture[str]) -> None:
    """Several bad flags at once: exit 2 and every problem is listed, each naming its flag."""
    code = main(["report", "--prometheus.url", "notaurl", "--range", "banana", "--prometheus.header", "bad",
                 "--guide-profile", "nope", "--server-arg", "novalue", "--prometheus.concurrency", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for message in ("is not an http:// or https:// URL", "--range: not a duration", "invalid --prometheus.header",
                    "unknown --guide-profile", "KEY=VALUE", "--prometheus.concurrency"):
        assert message in err
    assert err.count("report: ") == 6


def test_bearer_and_basic_together_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Basic auth and a bearer token at once is a usage error."""
    tok = tmp_path / "tok"
    tok.write_text("abc\n")
    assert main(["report", "--prometheus.url", "http://p", "--prometheus.username", "u",
                 "--prometheus.bearer-token-file", str(tok)]) == 2
    assert "not both" in capsys.readouterr().err


def test_env_mirror_sets_url(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLANG_TUNING_PROMETHEUS_URL fills --prometheus.url (validated like the flag)."""
    monkeypatch.setenv("SGLANG_TUNING_PROMETHEUS_URL", "ftp://nope")
    assert main(["report"]) == 2
    assert "ftp://nope" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ formats


def finding(check: str, status: str, flag: str | None = "--schedule-conservativeness", action: str = "increase",
            current: object = 1.0, suggested: object = 1.3, rank: dict[str, int] | None = None,
            evidence: str = "measured") -> Finding:
    """A finding as the advisor makes them."""
    return Finding(check=check, status=status, rank=rank or {}, flag=flag, action=action, current=current,
                   suggested=suggested, summary="s", evidence=evidence, tradeoff="t")


def sample_report() -> FleetReport:
    """A small fleet: one critical server (hostile name), one ok, one without data, plus drift."""
    bad_name = '<script>alert("x")</script>:9470'
    return FleetReport(
        prometheus="http://prom:9090", start=END - 86400, end=END, queries=31, profile="docs-2025",
        workload="throughput", selector='job="sglang"',
        instances=(
            InstanceReport("10.0.0.2:9470", "m|odel", "0.5.23", {"mem_fraction_static": 0.88},
                           (finding("retractions_frequent", "ok"), finding("queue_empty", "ok", flag=None,
                                                                           action="raise submission rate"))),
            InstanceReport(bad_name, "m|odel", "0.5.23", {"mem_fraction_static": 0.8},
                           (finding("retractions_frequent", "critical", rank={"dp": 1},
                                    evidence="6 per minute | <b>bold</b>"),
                            finding("retractions_frequent", "ok", rank={"dp": 0}),
                            finding("queue_empty", "warning", flag=None, action="raise submission rate",
                                    current=None, suggested=None))),
            InstanceReport("10.0.0.10:9470", None, None, {},
                           (finding("retractions_frequent", "unknown"), finding("queue_empty", "unknown"))),
        ),
        drift=(fleet.Drift("m|odel", "mem_fraction_static", {"0.88": ["10.0.0.2:9470"], "0.8": [bad_name]}),),
        checks=("queue_empty", "retractions_frequent"),
        charts={bad_name: {"queue": [(END - 100, 1.0), (END, 3.0)], "token_usage": []}})


def test_instance_status_is_worst_known() -> None:
    """critical > warning > ok; unknown only when no check had data."""
    r = sample_report()
    assert [i.status for i in r.instances] == ["ok", "critical", "unknown"]
    assert r.by_status() == {"ok": 1, "warning": 0, "critical": 1, "unknown": 1}


def test_common_findings_count_servers_once() -> None:
    """A check firing on two ranks of one server counts one server."""
    common = sample_report().common_findings()
    assert [(c["check"], c["servers"], c["worst"]) for c in common] == [
        ("queue_empty", 1, "warning"), ("retractions_frequent", 1, "critical")]


def test_json_follows_interfaces() -> None:
    """Top-level keys, summary, per-instance findings and drift as interfaces.md shows them."""
    doc = json.loads(report_formats.render(sample_report(), "json"))
    assert {"prometheus", "range", "queries", "summary", "instances", "drift"} <= set(doc)
    assert doc["queries"] == 31 and doc["summary"]["instances"] == 3
    assert doc["range"] == {"start": "2026-10-31T00:00:00Z", "end": "2026-11-01T00:00:00Z"}
    first = doc["instances"][1]["findings"][0]
    assert {"check", "status", "flag", "action", "current", "suggested", "evidence", "rank"} <= set(first)
    assert doc["drift"][0]["values"]["0.8"] == ['<script>alert("x")</script>:9470']


def test_markdown_golden(update_golden: bool) -> None:
    """The markdown of a small fleet (with latencies and an SLO) matches the reviewed golden file."""
    text = report_formats.render(latency_report(), "markdown")
    path = GOLDEN / "fleet-report.md"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


def test_markdown_escapes_table_cells() -> None:
    """A pipe in a model name or evidence cannot break a table row."""
    text = report_formats.render(sample_report(), "markdown")
    assert "m\\|odel" in text and "6 per minute \\| " in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert all(len(re.findall(r"(?<!\\)\|", r)) == len(re.findall(r"(?<!\\)\|", rows[0])) for r in rows)


def test_html_escapes_everything_and_loads_nothing() -> None:
    """Hostile label values are escaped; no script, no external URL; SVG charts inline."""
    text = report_formats.render(sample_report(), "html")
    assert "<script>" not in text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert "<b>bold</b>" not in text
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert text.count("<svg") >= 3  # status bar + queue + token usage sparklines
    assert "token usage: no data" in text
    assert "default-src 'none'" in text


def test_sparkline_scales_points_into_the_box() -> None:
    """Points map into the SVG box; the label shows min and max."""
    svg = report_formats.sparkline_svg([(0, 0.0), (10, 5.0), (20, 10.0)], "q", width=108, height=40)
    coords = re.search(r'points="([^"]+)"', svg)
    assert coords is not None
    xs = [float(p.split(",")[0]) for p in coords.group(1).split()]
    ys = [float(p.split(",")[1]) for p in coords.group(1).split()]
    assert xs == [4.0, 54.0, 104.0] and ys[0] == 36.0 and ys[2] == 18.0
    assert "q: 0 – 10" in svg
    flat = report_formats.sparkline_svg([(0, 6.0), (10, 6.0)], "r", width=108, height=40)
    assert 'points="4.0,27.0 104.0,27.0"' in flat


def test_server_arg_overrides_reach_the_advice_not_the_drift() -> None:
    """--server-arg changes what the advisor sees; the servers' real args (and so drift) stay as reported."""
    from sglang_tuning_exporter.fleet.report import evaluate_fleet

    seen: list[dict[str, object]] = []

    def fake(signals: object, d: fleet.InstanceData, window_s: float) -> list[Finding]:
        seen.append(dict(d.args))
        return [finding("retractions_frequent", "ok")]

    data = {"b:1": inst("b:1", "m", mem_fraction_static=0.8), "a:1": inst("a:1", "m", mem_fraction_static=0.88)}
    reports = evaluate_fleet(data, fake, {"mem_fraction_static": 0.9}, 3600.0)
    assert [r.instance for r in reports] == ["a:1", "b:1"]
    assert seen == [{"mem_fraction_static": 0.9}, {"mem_fraction_static": 0.9}]
    assert data["b:1"].args == {"mem_fraction_static": 0.8}
    assert len(fleet.find_drift(data.values())) == 1


def test_the_recorded_series_the_report_prefers_are_rendered() -> None:
    """fleet's preferred recording-rule names are records of alerts/recording.rules.yaml (one source)."""
    import yaml

    from sglang_tuning_exporter.fleet import queries as fleet
    rules = yaml.safe_load((ROOT / "alerts" / "recording.rules.yaml")
                           .read_text(encoding="utf-8"))
    records = {r["record"] for g in rules["groups"] for r in g["rules"]}
    assert {fleet.RULE_RETRACTIONS, fleet.RULE_DECODE_SAMPLES, fleet.RULE_PREFILL_TOKENS} <= records


# ------------------------------------------------------------------------------------- no data is not health
@pytest.mark.parametrize("keep", [(), (2,)])
def test_nothing_judged_exits_1_with_one_line(keep: tuple[int, ...], monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No matching series, or only unknown instances: exit 1 and one line on stderr, never 'all ok'."""
    import dataclasses

    full = sample_report()
    only = dataclasses.replace(full, instances=tuple(full.instances[i] for i in keep))
    monkeypatch.setattr(report, "build_report", lambda *a, **k: only)
    code = main(["report", "--prometheus.url", "http://prom:9090", "--output", str(tmp_path / "r.md")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert ("nothing to judge" in err[0]) if not keep else ("all 1 instances" in err[0] and "unknown" in err[0])
    assert (tmp_path / "r.md").exists() == bool(keep)  # an empty report is not written
    if keep:
        assert "No check fired on any server" not in (tmp_path / "r.md").read_text()


def test_unknown_reasons_name_the_prometheus_data_read() -> None:
    """A check the report cannot judge says which Prometheus series were missing or too few, never the log's
    "Decode lines" or "batch lines" it did not read (issue #24)."""
    import argparse

    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    guide = report.load_guide(parser.parse_args([]))
    d = fleet.InstanceData(instance="a:1", signals={Rank(): {"graph_samples": 0.0, "queue_samples": 1.0}})
    findings = guide.evaluate(fleet.derive_signals(d), d, 600.0)
    unknown = {f.check: f.evidence for f in findings if f.status == "unknown"}
    assert {"cuda_graph_uncovered", "queue_empty", "gpu_mem_headroom_high", "decode_oom"} <= set(unknown)
    for check, why in unknown.items():
        assert "Prometheus" in why, (check, why)
        assert not re.search(r"\blines?\b|\bin the input\b|none was read", why), (check, why)
    assert unknown["cuda_graph_uncovered"].startswith("0 decode passes counted by CUDA-graph use in Prometheus")


def test_a_yes_no_fact_is_never_averaged_over_a_long_range() -> None:
    """Over a week, `running_cap_by_mamba` 1 for part of it is still a fact (the latest value), not 0.4:
    a mean would turn the rules' guard off and let the report advise raising --max-running-requests."""
    from sglang_tuning_exporter.fleet.queries import sidecar_signals_expr

    expr = sidecar_signals_expr("", 7 * 86400.0, 600.0)
    flags = [part for part in expr.split(" or ") if "sglang_tuning_signal_flag" in part]
    assert flags and all("last_over_time(" in p and "avg_over_time(" not in p for p in flags), flags
    assert "avg_over_time(sglang_tuning_signal_ratio" in expr  # ratios are still the mean of the windows


# ------------------------------------------------------------------------------------------ latency (issue #25)
SLO = {"ttft_p95_seconds": 2.0, "itl_p95_seconds": 0.1, "objective": 0.99}


def latency_report() -> FleetReport:
    """The sample fleet with latencies and an SLO: the hostile-named server burns its TTFT budget 12x."""
    import dataclasses

    from sglang_tuning_exporter.fleet.latency import latency_of, rank

    full = {"ttft_p95_seconds": 0.8123, "itl_p95_seconds": 0.04, "e2e_p95_seconds": 12.5,
            "queue_time_p95_seconds": 0.2}
    given = {"10.0.0.2:9470": ({"dp=0": full, "dp=1": {**full, "ttft_p95_seconds": 0.9}},
                               {"ttft_p95_seconds": 0.003, "itl_p95_seconds": 0.001}),
             '<script>alert("x")</script>:9470': ({"all": {"ttft_p95_seconds": 3.2, "itl_requests": 0.0}},
                                                  {"ttft_p95_seconds": 0.12}),
             "10.0.0.10:9470": ({}, {})}
    base = sample_report()
    insts = {i.instance: dataclasses.replace(i, latency=latency_of(*given[i.instance], SLO)) for i in base.instances}
    order, why = rank(list(insts), {n: i.latency for n, i in insts.items()}, SLO)
    return dataclasses.replace(base, instances=tuple(insts[n] for n in order), order=why, slo=dict(SLO))


def test_latency_is_the_worst_rank_and_unknown_says_why() -> None:
    """p95 per server is its worst rank's; a latency not in Prometheus is unknown with the reason (none
    exported, or 0 requests behind it)."""
    by = {i.instance: i.latency for i in latency_report().instances}
    ok = by["10.0.0.2:9470"]
    assert ok.p95 == {"ttft_p95_seconds": 0.9, "itl_p95_seconds": 0.04, "e2e_p95_seconds": 12.5,
                      "queue_time_p95_seconds": 0.2} and ok.unknown_why == {}
    hot = by['<script>alert("x")</script>:9470']
    assert hot.unknown_why["itl_p95_seconds"].startswith("0 requests in Prometheus' itl latency series")
    assert "sglang_tuning_signal_seconds" in hot.unknown_why["e2e_p95_seconds"]
    assert (hot.burn("ttft_p95_seconds"), hot.burn("itl_p95_seconds"), hot.worst_burn) == (12.0, None, 12.0)
    assert (ok.burn("ttft_p95_seconds"), ok.burn("itl_p95_seconds"), ok.worst_burn) == (0.3, 0.1, 0.3)
    assert by["10.0.0.10:9470"].worst_burn is None


def test_servers_rank_by_worst_burn_or_stay_in_name_order_with_the_reason() -> None:
    from sglang_tuning_exporter.fleet.latency import Latency, rank

    lat = {"a": Latency({}, slow_ratio={"ttft_p95_seconds": 0.01}, budget=0.01),
           "b": Latency({}, slow_ratio={"ttft_p95_seconds": 0.2, "itl_p95_seconds": 0.05}, budget=0.01),
           "c": Latency({}, slow_ratio={"ttft_p95_seconds": None}, budget=0.01)}
    order, why = rank(["a", "b", "c"], lat, SLO)
    assert order == ["b", "a", "c"] and why["by"] == "slo_burn" and "objective 99 %" in why["why"]
    order, why = rank(["a", "b", "c"], lat, {})
    assert order == ["a", "b", "c"] and why["by"] == "instance" and "no slo: in --config" in why["why"]
    order, why = rank(["c", "a"], {"c": lat["c"]}, SLO)
    assert order == ["c", "a"] and why["by"] == "instance" and "no server's SLO burn is known" in why["why"]


def test_latency_in_every_format() -> None:
    """JSON (schema-valid), Markdown and HTML carry the p95 columns, the burn and the order's reason."""
    from helpers.schemas import assert_valid

    r = latency_report()
    doc = json.loads(report_formats.render(r, "json"))
    assert_valid(doc, "report")
    assert doc["order"]["by"] == "slo_burn" and doc["slo"] == SLO
    first = doc["instances"][0]
    assert first["instance"] == '<script>alert("x")</script>:9470'
    assert first["latency"]["slo"]["ttft_p95_seconds"] == {"target": 2.0, "slow_ratio": 0.12, "burn": 12.0}
    assert first["latency"]["worst_burn"] == 12.0 and first["latency"]["e2e_p95_seconds"] is None
    md = report_formats.render(r, "markdown")
    section = md.split("## Latency", 1)[1].split("## Mis-tuned servers", 1)[0]
    assert "Order: servers ordered by their worst SLO burn" in section
    assert "| p95 TTFT | p95 ITL | p95 E2E | p95 queue time | SLO burn |" in section
    assert "| `10.0.0.2:9470` | 0.9 s | 0.04 s | 12.5 s | 0.2 s | 0.3 (p95 TTFT) |" in section
    assert "| 3.2 s | unknown | unknown | unknown | 12 (p95 TTFT) |" in section
    page = report_formats.render(r, "html")
    assert 'id="latency"' in page and "12 (p95 TTFT)" in page and "<script>alert" not in page


def test_a_fleet_without_latency_says_so_in_one_line_not_a_table_of_unknowns() -> None:
    md = report_formats.render(sample_report(), "markdown")
    section = md.split("## Latency", 1)[1].split("## Mis-tuned servers", 1)[0]
    assert "No latency known on any of the 3 servers" in section and "| p95 TTFT |" not in section


def test_a_merged_row_names_sglangs_target_in_every_format() -> None:
    """A sidecar's row with its SGLang target merged in (fleet/pairing.py) says so after the model; hostile
    text stays inert."""
    import dataclasses

    from helpers.schemas import assert_valid

    base = sample_report()
    merged = tuple(dataclasses.replace(i, parts={**i.parts, "sglang_instance": "10.0.0.2:30000<b>"})
                   if i.status in ("warning", "critical") else i for i in base.instances)
    report = dataclasses.replace(base, instances=merged)
    assert any("sglang_instance" in i.parts for i in merged)
    assert "SGLang's own metrics from `10.0.0.2:30000<b>` (same host)." in report_formats.render(report, "markdown")
    assert "SGLang's own metrics from <code>10.0.0.2:30000&lt;b&gt;</code> (same host)." in report_formats.render(
        report, "html")
    doc = json.loads(report_formats.render(report, "json"))
    assert_valid(doc, "report")
    assert {i.get("sglang_instance") for i in doc["instances"]} >= {"10.0.0.2:30000<b>"}


def test_secret_server_args_and_labels_never_reach_any_format() -> None:
    """A secret argument's series (from an exporter that did not redact it) and label values carrying a
    credential reach no format of the report, drift included: the value reads `***` (core/redact)."""
    data = fleet.collect({
        "args": [s(424242, instance="a:1", arg="api_key"), s(515151, instance="b:1", arg="api_key"),
                 s(616161, instance="a:1", arg="ssl_keyfile_password"), s(0.8, instance="a:1", arg="mem_fraction_static")],
        "info": [s(1, instance="a:1", version="0.5.23", model_name="https://bob:hunter2@hf.co/m",
                   schedule_policy="lpm")],
        "models": [s(1, instance="b:1", model_name="https://bob:hunter2@hf.co/m")],
    })
    instances = evaluate_fleet(data, lambda sig, d, w: [finding("queue_empty", "warning")], {}, 86400.0)
    rep = FleetReport(prometheus="http://prom:9090", start=END - 86400, end=END, queries=1, profile="docs-2025",
                      workload="throughput", selector="", instances=tuple(instances),
                      drift=tuple(fleet.find_drift(data.values())), checks=("queue_empty",))
    for fmt in ("markdown", "html", "json"):
        text = report_formats.render(rep, fmt)
        assert not re.search("424242|515151|616161|hunter2", text), fmt
    doc = json.loads(report_formats.render(rep, "json"))
    assert doc["instances"][0]["args"]["api_key"] == "***" and doc["instances"][1]["args"]["api_key"] == "***"
    assert doc["instances"][0]["model_name"] == doc["instances"][1]["model_name"] != ""
