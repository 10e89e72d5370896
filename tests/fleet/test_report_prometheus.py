"""The fleet report against a REAL Prometheus (Debian's /usr/bin/prometheus) filled with synthetic history.

200 servers x 1 day at 5-minute resolution, written as OpenMetrics, turned into TSDB blocks by the real
promtool, served by a real Prometheus on loopback; the report runs through the CLI entry point.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import fleet_history as fh
from helpers import runners
from helpers.netutil import free_port
from helpers.runners import report_main, report_output
from helpers.tsdb import PROMTOOL, backfilled_prometheus
from sglang_tuning_exporter.cli import main
from sglang_tuning_exporter.guide.checks import load_table

pytestmark = pytest.mark.integration

N_INSTANCES = 200
LENGTH_S = 86400.0


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus serving the synthetic history; yields its URL."""
    with backfilled_prometheus(lambda om: fh.write_history(fh.fleet(N_INSTANCES), fh.HISTORY_END, LENGTH_S, 300, om),
                               tmp_path_factory.mktemp("fleet")) as url:
        yield url


def run_report(url: str, tmp: Path, fmt: str, *extra: str) -> tuple[int, str]:
    """Run `report` with its own flags over the history's day; returns (exit code, output text)."""
    return report_output(url, tmp, fmt, length="1d", end=fh.HISTORY_END, extra=extra)


@pytest.fixture(scope="module")
def report_json(prometheus: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The JSON report of the whole fleet."""
    return runners.report_json(prometheus, tmp_path_factory.mktemp("out"), length="1d", end=fh.HISTORY_END)


def firing(inst: dict[str, Any]) -> list[dict[str, Any]]:
    """The warning/critical findings of one instance."""
    return [f for f in inst["findings"] if f["status"] in ("warning", "critical")]


def test_every_instance_is_reviewed(report_json: dict[str, Any]) -> None:
    """All 200 servers appear, each with every check of the workload, and the summary adds up."""
    assert report_json["summary"]["instances"] == N_INSTANCES == len(report_json["instances"])
    assert sum(report_json["summary"]["by_status"].values()) == N_INSTANCES
    assert report_json["range"] == {"start": "2026-10-31T00:00:00Z", "end": "2026-11-01T00:00:00Z"}
    one = next(i for i in report_json["instances"] if i["instance"] == "10.0.0.1:9470")
    assert {f["check"] for f in one["findings"]} >= {"queue_empty", "retractions_frequent", "kv_underused",
                                                     "gpu_mem_headroom_high", "cuda_graph_uncovered"}


@pytest.mark.parametrize("instance", sorted(fh.KNOWN_MISTUNED))
def test_known_mistuned_named_with_flag(report_json: dict[str, Any], instance: str) -> None:
    """Each known mis-tuned server has its check firing with the right flag and direction."""
    check, flag, action = fh.KNOWN_MISTUNED[instance]
    inst = next(i for i in report_json["instances"] if i["instance"] == instance)
    hits = [f for f in firing(inst) if f["check"] == check]
    assert hits, f"{instance}: {check} did not fire; firing: {[f['check'] for f in firing(inst)]}"
    f = hits[0]
    if flag is None:
        assert f["flag"] is None and "submission rate" in f["action"]
    else:
        assert f["flag"] is not None and f["flag"].startswith(flag) and f["action"] == action
        assert f["suggested"] is not None and f["suggested"] != f["current"]


def test_suggested_values_follow_the_guide(report_json: dict[str, Any]) -> None:
    """Retraction storm -> 1.3; 14 GB headroom -> a larger static fraction; misses -> a larger graph ceiling."""
    by = {i["instance"]: i for i in report_json["instances"]}

    def hit(instance: str, check: str) -> dict[str, Any]:
        return next(f for f in firing(by[instance]) if f["check"] == check)

    assert hit("10.9.0.1:9470", "retractions_frequent")["suggested"] == pytest.approx(1.3)
    head = hit("10.9.0.2:9470", "gpu_mem_headroom_high")
    assert head["current"] == pytest.approx(0.88) and head["suggested"] > 0.88
    graph = hit("10.9.0.4:9470", "cuda_graph_uncovered")
    assert graph["flag"] == "--cuda-graph-max-bs" and graph["current"] == 160 and graph["suggested"] >= 300


def test_report_instances_carry_coverage_and_plan(report_json: dict[str, Any], prometheus: str,
                                                  tmp_path: Path) -> None:
    """Every instances[] entry of the real report carries coverage, indications, the plan and the verdict line,
    from the same code as diagnose: coverage adds up to the workload's checks, a server with a firing flag
    check has a plan step for that flag (a client-side one a client step), a healthy one has none."""
    checks = len(load_table().for_workload(report_json["workload"]))
    for inst in report_json["instances"]:
        cov = inst["coverage"]
        assert cov["checks"] == checks and cov["judged"] + cov["unknown"] == checks, inst["instance"]
        assert set(cov["unknown_why"]) <= {f["check"] for f in inst["findings"]}
        assert isinstance(inst["indications"], list) and inst["verdict"], inst["instance"]
        flags = {f["flag"] for f in firing(inst)}  # None: a client-side step
        planned = {s["flag"] for s in inst["plan"]}
        assert flags <= planned and bool(planned) == bool(flags), (inst["instance"], flags, planned)
    storm = next(i for i in report_json["instances"] if i["instance"] == "10.9.0.1:9470")
    step = next(s for s in storm["plan"] if s["flag"] == "--schedule-conservativeness")
    assert step["action"] == "increase" and step["to"] == pytest.approx(1.3) and step["why"] and step["then"]
    code, md = run_report(prometheus, tmp_path, "markdown", "--selector", '{instance="10.9.0.1:9470"}')
    assert code == 0 and "Plan, one change at a time" in md
    assert f"{step['step']}. `increase --schedule-conservativeness: " in md


def test_dp_rank_storm_names_only_that_rank(report_json: dict[str, Any]) -> None:
    """A storm on DP rank 1 of a DP=2 server fires on dp=1 and not on dp=0."""
    inst = next(i for i in report_json["instances"] if i["instance"] == "10.9.0.7:9470")
    retr = {json.dumps(f["rank"]): f["status"] for f in inst["findings"] if f["check"] == "retractions_frequent"}
    assert retr == {'{"dp": 0}': "ok", '{"dp": 1}': "critical"}
    assert inst["signals"]["dp=1"]["retractions_per_minute"] == pytest.approx(6.0, rel=0.02)
    assert inst["signals"]["dp=0"]["retractions_per_minute"] == 0


def test_healthy_servers_are_not_flagged(report_json: dict[str, Any]) -> None:
    """No server outside the known mis-tuned set has a warning or critical finding."""
    flagged = {i["instance"]: [f["check"] for f in firing(i)] for i in report_json["instances"] if firing(i)}
    assert set(flagged) == set(fh.KNOWN_MISTUNED), flagged
    assert report_json["summary"]["by_status"]["ok"] == N_INSTANCES - len(fh.KNOWN_MISTUNED)


def test_both_sglang_spellings_are_read(report_json: dict[str, Any]) -> None:
    """Servers exposing only `sglang:` or only `sglang_` metrics get known verdicts (not unknown)."""
    by = {i["instance"]: i for i in report_json["instances"]}
    for name in ("10.0.0.9:30000", "10.0.0.19:30000"):  # sglang: and sglang_ spellings (fleet_history.fleet)
        statuses = {f["check"]: f["status"] for f in by[name]["findings"]}
        assert statuses["queue_empty"] == "ok" and statuses["retractions_frequent"] == "ok"
        assert statuses["cuda_graph_uncovered"] == "ok" and statuses["metrics_disabled"] == "ok"


def test_recording_rules_are_used_where_raw_counters_are_gone(report_json: dict[str, Any]) -> None:
    """A server whose counters survive only as recording rules still gets its storm and graph verdicts."""
    inst = next(i for i in report_json["instances"] if i["instance"] == fh.RECORDED_ONLY)
    statuses = {f["check"]: f["status"] for f in inst["findings"]}
    assert statuses["retractions_frequent"] == "critical"
    assert statuses["cuda_graph_uncovered"] == "ok"


def test_drift_names_the_outlier(report_json: dict[str, Any]) -> None:
    """mem_fraction_static 0.80 beside peers at 0.88 is reported as drift naming that server."""
    drift = [d for d in report_json["drift"] if d["arg"] == "mem_fraction_static" and d["model_name"] == fh.MODEL_A]
    assert len(drift) == 1
    values = drift[0]["values"]
    assert values["0.8"] == [fh.DRIFT_INSTANCE]
    assert len(values["0.88"]) > 100 and fh.DRIFT_INSTANCE not in values["0.88"]
    assert not any(d["arg"] == "port" for d in report_json["drift"])


def test_query_count_does_not_grow_with_instances(prometheus: str, report_json: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """A selector that keeps 8 servers sends exactly as many queries as the 200-server run."""
    code, text = run_report(prometheus, tmp_path, "json", "--selector", '{instance=~"10[.]9[.].*"}')
    assert code == 0
    small = json.loads(text)
    assert small["summary"]["instances"] == len(fh.KNOWN_MISTUNED)
    assert small["queries"] == report_json["queries"] <= 40


def test_markdown_names_servers_and_flags(prometheus: str, tmp_path: Path) -> None:
    """The markdown report lists each mis-tuned server with its flag change, and the drift."""
    code, text = run_report(prometheus, tmp_path, "markdown")
    assert code == 0
    assert "## Summary" in text and "## Configuration drift" in text and "## Every instance × check" in text
    for inst, (_, flag, _) in fh.KNOWN_MISTUNED.items():
        assert f"### `{inst}`" in text
        if flag:
            assert flag in text
    assert "`increase --schedule-conservativeness: 1 -> 1.3`" in text  # the plan step, one spelling
    assert "`0.8` on 10.9.0.6:9470" in text


def test_html_has_charts_from_range_queries(prometheus: str, tmp_path: Path) -> None:
    """The html report carries inline SVG sparklines for mis-tuned servers (data from range queries)."""
    code, text = run_report(prometheus, tmp_path, "html")
    assert code == 0
    assert text.count("<polyline") == 3 * len(fh.KNOWN_MISTUNED)  # recorded-only and raw servers included
    assert "no data" not in text
    assert "<script" not in text and "http://" not in text.replace(prometheus, "").replace(
        "http://www.w3.org/2000/svg", "")


def test_prometheus_down_is_one_line_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Prometheus that is not there: exit 1 and one line on stderr, no traceback."""
    port = free_port()
    code, _ = run_report(f"http://127.0.0.1:{port}", tmp_path, "json")
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("report: cannot reach Prometheus") and err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_entry_point_runs_report(prometheus: str, tmp_path: Path) -> None:
    """`sglang-tuning-exporter report` through the real CLI entry point."""
    out = tmp_path / "r.json"
    assert main(["report", "--prometheus.url", prometheus, "--range", "1d", "--end", str(fh.HISTORY_END),
                 "--format", "json", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["instances"] == N_INSTANCES


def test_unwritable_output_is_one_line_exit_1(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An output path that cannot be written: exit 1 and one line."""
    code = report_main(["--prometheus.url", prometheus, "--range", "1h", "--end", str(fh.HISTORY_END),
                        "--format", "json", "--output", "/nonexistent-dir/report.json"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("report: cannot write /nonexistent-dir/report.json") and err.count("\n") == 1


def test_query_error_is_one_line_exit_1(prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A query Prometheus rejects (a selector with an invalid regex) gives exit 1 and Prometheus' reason."""
    code, _ = run_report(prometheus, tmp_path, "json", "--selector", '{instance=~"("}')
    err = capsys.readouterr().err
    assert code == 1 and "rejected the query (HTTP 400, bad_data)" in err and err.count("\n") == 1


def test_sidecar_signals_come_back_in_their_docs_unit(tmp_path: Path) -> None:
    """The report reads the unit families under their docs/signals.md names and units (GiB, per minute),
    and the deprecated mixed family of a previous-release sidecar where there is nothing newer."""
    import subprocess

    import yaml

    from sglang_tuning_exporter.fleet.queries import sidecar_signals_expr

    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed")
    new = 'instance="new:9470", dp_rank="0", pp_rank="", tp_rank="0"'
    old = 'instance="old:9470", dp_rank="0", pp_rank="", tp_rank="0"'
    series = [
        {"series": f'sglang_tuning_signal_bytes{{{new}, signal="available_gpu_mem"}}', "values": f"{6 * 2**30}x20"},
        {"series": f'sglang_tuning_signal_per_second{{{new}, signal="retractions"}}', "values": "0.05x20"},
        {"series": f'sglang_tuning_signal_ratio{{{new}, signal="kv_underused_ratio"}}', "values": "0.25x20"},
        # the same sidecar's deprecated twin must not be read a second time
        {"series": f'sglang_tuning_signal{{{new}, signal="kv_underused_ratio"}}', "values": "0.25x20"},
        {"series": f'sglang_tuning_signal{{{old}, signal="retractions_per_minute"}}', "values": "2x20"},
    ]

    def sample(labels: str, value: float) -> dict[str, Any]:
        return {"labels": "{" + labels + "}", "value": value}

    expected = [sample('dp_rank="0", instance="new:9470", signal="available_gpu_mem_gb"', 6),
                sample('dp_rank="0", instance="new:9470", signal="retractions_per_minute"', 3),
                sample('dp_rank="0", instance="new:9470", signal="kv_underused_ratio"', 0.25),
                sample('dp_rank="0", instance="old:9470", signal="retractions_per_minute"', 2)]
    (tmp_path / "none.rules.yaml").write_text("groups: []\n", encoding="utf-8")
    test = {"rule_files": ["none.rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": f"round({sidecar_signals_expr('', 600.0)}, 0.001)", "eval_time": "15m",
             "exp_samples": expected}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    proc = subprocess.run([PROMTOOL, "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_range_longer_than_the_window_reads_the_windows_inside_it(tmp_path: Path) -> None:
    """Over 1h with the sidecar's 10-minute window: the mean of the windowed signal over the 50 minutes whose
    windows lie inside the range (the first 10 minutes' 30/min, windows reaching before the range, are not
    read), and the fullest window for a sample count; OOM counts are left to the counter's increase over the
    range (the `oom` query), so the windowed oom_decode_count is not read."""
    import subprocess

    import yaml

    from sglang_tuning_exporter.fleet.queries import sidecar_signals_expr

    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed")
    at = 'instance="x:9470", dp_rank="0", pp_rank="", tp_rank="0"'
    series = [
        {"series": f'sglang_tuning_signal_per_second{{{at}, signal="retractions"}}', "values": "0.5x9 0.1x51"},
        {"series": f'sglang_tuning_signal_amount{{{at}, signal="graph_samples"}}', "values": "0x29 100 0x30"},
        {"series": f'sglang_tuning_signal_amount{{{at}, signal="oom_decode_count"}}', "values": "0x20 1x10 0x30"},
        {"series": f'sglang_tuning_signal_amount{{{at}, signal="decode_batch_p90"}}', "values": "40x60"},
    ]
    labels = 'dp_rank="0", instance="x:9470", signal="{}"'
    expected = [{"labels": "{" + labels.format(name) + "}", "value": v} for name, v in
                (("retractions_per_minute", 6), ("graph_samples", 100), ("decode_batch_p90", 40))]
    (tmp_path / "none.rules.yaml").write_text("groups: []\n", encoding="utf-8")
    test = {"rule_files": ["none.rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": f"round({sidecar_signals_expr('', 3600.0, 600.0)}, 0.001)", "eval_time": "60m",
             "exp_samples": expected}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    proc = subprocess.run([PROMTOOL, "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
