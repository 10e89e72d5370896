"""Issue 16, the fleet side: flag changes within the reviewed range, their verdicts, and the servers that still
lag a peer's improvement, from a REAL Prometheus whose history holds restarts with other flags.

The history (promtool blocks from OpenMetrics, like test_report_prometheus.py): 8 hours ending at
fleet_history.HISTORY_END, samples every 30 s, servers restarted with other flags 4 hours before the end
(counters start again from 0 there, as after a real restart).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import fleet_history as fh
from helpers.runners import report_json, report_output
from helpers.tsdb import backfilled_prometheus
from sglang_tuning_exporter.core.durations import iso_time as iso
from sglang_tuning_exporter.fleet import changes as fleet_changes
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet.promapi import Series
from sglang_tuning_exporter.guide.checks import load_table

pytestmark = pytest.mark.integration

END = fh.HISTORY_END
LENGTH_S = 8 * 3600.0
CHANGE_AT = END - 4 * 3600.0
LATE_AT = END - 300.0  # a change too late to judge: no full slice after it
A = fh.BASE_ARGS
IMPROVED, STORM, WORSE, LATE, HEALTHY, SLOWER = (f"10.9.5.{i}:9470" for i in range(1, 7))
# A server scraped as two targets: its sidecar reads only the log (no latency of its own), its SGLang's /metrics
# carry the TTFT histogram; the report makes them one row and guards the change with SGLang's quantiles.
PAIRED, PAIRED_SGLANG = "10.9.5.7:9470", "10.9.5.7:30000"


def _history() -> list[tuple[list[fh.InstanceSpec], float, float]]:
    start, stop = END - LENGTH_S, END + 30
    storm = {"usage": 0.99, "retractions_per_min": 6.0}
    steady = [fh.InstanceSpec(STORM, "retraction_storm", args=A, **storm),  # type: ignore[arg-type]
              fh.InstanceSpec(HEALTHY, args=A)]
    before = [fh.InstanceSpec(IMPROVED, "retraction_storm", args=A, **storm),  # type: ignore[arg-type]
              fh.InstanceSpec(WORSE, model_name=fh.MODEL_B, args={**A, "max_running_requests": 512.0})]
    after = [fh.InstanceSpec(IMPROVED, args={**A, "schedule_conservativeness": 1.3}),
             fh.InstanceSpec(WORSE, model_name=fh.MODEL_B, graph_miss_ratio=0.35, batch_without_graph=300.0,
                             args={**A, "max_running_requests": 512.0, "cuda_graph_max_bs": 160.0})]
    # Retractions gone after the change, but p95 TTFT doubled (issue 25): the trade is stated, the verdict worse.
    before.append(fh.InstanceSpec(SLOWER, "retraction_storm", model_name=fh.MODEL_B, args=A,  # type: ignore[arg-type]
                                  latency={"ttft_p95": 0.8, "itl_p95": 0.03}, **storm))
    after.append(fh.InstanceSpec(SLOWER, model_name=fh.MODEL_B, args={**A, "schedule_conservativeness": 1.3},
                                 latency={"ttft_p95": 1.6, "itl_p95": 0.03}))
    before += [fh.InstanceSpec(PAIRED, "retraction_storm", model_name=fh.MODEL_B, args=A, **storm),  # type: ignore[arg-type]
               fh.InstanceSpec(PAIRED_SGLANG, source="sglang:", model_name=fh.MODEL_B, histograms={"ttft": 0.8})]
    after += [fh.InstanceSpec(PAIRED, model_name=fh.MODEL_B, args={**A, "schedule_conservativeness": 1.3}),
              fh.InstanceSpec(PAIRED_SGLANG, source="sglang:", model_name=fh.MODEL_B, histograms={"ttft": 1.6})]
    late = fh.InstanceSpec(LATE, model_name=fh.MODEL_B, args=A)
    late_after = fh.InstanceSpec(LATE, model_name=fh.MODEL_B, args={**A, "mem_fraction_static": 0.9})
    return [(steady, start, stop), (before, start, CHANGE_AT), (after, CHANGE_AT, stop),
            ([late], start, LATE_AT), ([late_after], LATE_AT, stop)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus serving the history with the restarts; yields its URL."""
    with backfilled_prometheus(lambda om: fh.write_segments(_history(), 30, om),
                               tmp_path_factory.mktemp("changes")) as url:
        yield url


def run_report(url: str, tmp: Path, fmt: str, *extra: str) -> tuple[int, str]:
    return report_output(url, tmp, fmt, length="8h", end=END, extra=extra)


@pytest.fixture(scope="module")
def doc(prometheus: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return report_json(prometheus, tmp_path_factory.mktemp("out"), length="8h", end=END)


def changes(doc: dict[str, Any], instance: str) -> list[dict[str, Any]]:
    (inst,) = [i for i in doc["instances"] if i["instance"] == instance]
    found: list[dict[str, Any]] = inst["changes"]
    return found


def test_a_fixed_retraction_storm_is_improved(doc: dict[str, Any]) -> None:
    (c,) = changes(doc, IMPROVED)
    assert (c["flag"], c["from"], c["to"], c["source"], c["verdict"]) == (
        "--schedule-conservativeness", 1, 1.3, "prometheus", "improved")
    assert c["at"] == iso(CHANGE_AT)
    assert c["checks"]["retractions_frequent"] == {"before": "critical", "after": "ok"}
    assert c["before"]["signals"]["retractions_per_minute"] > 4 > 0.5 > c["after"]["signals"]["retractions_per_minute"]
    # Split at the change: no slice of either side crosses it.
    assert c["before"]["end"] <= c["at"] <= c["after"]["start"]
    assert "comparable load" in c["why"]
    (inst,) = [i for i in doc["instances"] if i["instance"] == IMPROVED]
    assert (inst["last_change"]["step"], inst["last_change"]["verdict"]) == (0, "improved")


def test_a_lower_graph_ceiling_that_misses_graphs_is_worse(doc: dict[str, Any]) -> None:
    (c,) = changes(doc, WORSE)
    assert (c["flag"], c["from"], c["to"], c["verdict"]) == ("--cuda-graph-max-bs", 256, 160, "worse")
    assert c["checks"]["cuda_graph_uncovered"]["before"] == "ok"
    assert c["checks"]["cuda_graph_uncovered"]["after"] in ("warning", "critical")
    assert "go back to --cuda-graph-max-bs 256" in c["why"]


def test_fewer_retractions_but_doubled_ttft_is_worse_and_says_the_trade(doc: dict[str, Any]) -> None:
    """The report's verdict reads the sidecar's latency quantiles on both sides of the change and applies
    guide/changes.py's latency guard: retractions critical -> ok, yet p95 TTFT 0.8 s -> 1.6 s is `worse`."""
    (c,) = changes(doc, SLOWER)
    assert (c["flag"], c["from"], c["to"], c["verdict"]) == ("--schedule-conservativeness", 1, 1.3, "worse")
    assert c["checks"]["retractions_frequent"] == {"before": "critical", "after": "ok"}
    assert (c["before"]["signals"]["ttft_p95_seconds"], c["after"]["signals"]["ttft_p95_seconds"]) == (0.8, 1.6)
    assert "p95 TTFT 0.8 s -> 1.6 s (+100 %)" in c["why"] and "go back to --schedule-conservativeness 1" in c["why"]
    assert "retractions_frequent critical -> ok" in c["why"]


def test_a_sidecar_and_its_sglang_are_one_row_whose_verdict_reads_sglangs_histograms(doc: dict[str, Any]) -> None:
    """The sidecar reads only the log; SGLang's TTFT histogram is on its own target (same host, same model):
    one row, which names SGLang's target, and the change that ended the storm but doubled TTFT is `worse`."""
    names = [i["instance"] for i in doc["instances"]]
    assert PAIRED in names and PAIRED_SGLANG not in names
    (inst,) = [i for i in doc["instances"] if i["instance"] == PAIRED]
    assert inst["sglang_instance"] == PAIRED_SGLANG and inst["latency"]["ttft_p95_seconds"] is not None
    (c,) = changes(doc, PAIRED)
    assert (c["flag"], c["from"], c["to"], c["verdict"]) == ("--schedule-conservativeness", 1, 1.3, "worse")
    assert c["checks"]["retractions_frequent"] == {"before": "critical", "after": "ok"}
    assert c["before"]["signals"]["ttft_p95_seconds"] == pytest.approx(fh.histogram_p95(0.8))
    assert c["after"]["signals"]["ttft_p95_seconds"] == pytest.approx(fh.histogram_p95(1.6))
    assert "p95 TTFT" in c["why"] and "(+100 %)" in c["why"], c["why"]


def test_a_change_without_data_after_it_is_inconclusive(doc: dict[str, Any]) -> None:
    (c,) = changes(doc, LATE)
    assert (c["flag"], c["from"], c["to"], c["verdict"]) == ("--mem-fraction-static", 0.88, 0.9, "inconclusive")
    assert "after the change" in c["why"]


def test_servers_that_did_not_change_have_no_changes(doc: dict[str, Any]) -> None:
    assert changes(doc, STORM) == [] and changes(doc, HEALTHY) == []


def test_peers_of_the_improved_server_lag(doc: dict[str, Any]) -> None:
    assert doc["lagging"] == [{"model_name": fh.MODEL_A, "flag": "--schedule-conservativeness", "value": 1.3,
                               "improved_on": [IMPROVED], "servers": {STORM: 1, HEALTHY: 1}}]


def test_markdown_and_html_have_the_sections(prometheus: str, tmp_path: Path) -> None:
    code, md = run_report(prometheus, tmp_path, "markdown")
    assert code == 0
    section = md.split("## Changes within the range", 1)[1].split("## Configuration drift", 1)[0]
    assert f"`{IMPROVED}` | `--schedule-conservativeness` | 1 | 1.3 | **improved**" in section
    assert "**worse**" in section and "**inconclusive**" in section
    lag = section.split("### Servers that still lag their peers", 1)[1]
    assert STORM in lag and HEALTHY in lag and WORSE not in lag
    code, page = run_report(prometheus, tmp_path, "html")
    assert code == 0
    assert 'id="changes"' in page and 'id="lagging"' in page and "improved" in page


def test_no_change_in_range_costs_one_query(prometheus: str, doc: dict[str, Any], tmp_path: Path) -> None:
    """`queries` counts every query sent: the instant plan and the server facts, plus one instant query naming the
    servers whose flags moved; only when a server changed in the range, one range query of their arguments and
    the plan once more as range queries over the slices, whatever the number of changed servers (here 5, or 1)."""
    w = fleet.Window(start=END - LENGTH_S, end=END, step_s=60.0)
    instant = len(fleet.plan(w)) + len(fleet.identity_queries(w)) + 1
    sliced = len(fleet.plan(w))
    code, text = run_report(prometheus, tmp_path, "json", "--selector", f'{{instance=~"{STORM}|{HEALTHY}"}}')
    assert code == 0
    quiet = json.loads(text)
    assert quiet["lagging"] == [] and all(i["changes"] == [] for i in quiet["instances"])
    assert quiet["queries"] == instant
    assert doc["queries"] == instant + 1 + sliced
    code, text = run_report(prometheus, tmp_path, "json", "--selector", f'{{instance="{IMPROVED}"}}')
    assert json.loads(text)["queries"] == instant + 1 + sliced


def test_detect_changes_bridges_gaps_and_skips_untracked_args() -> None:
    table = load_table()
    s = [Series({"instance": "x", "arg": "schedule_conservativeness"}, ((0.0, 1.0), (60.0, 1.0), (600.0, 1.3))),
         Series({"instance": "x", "arg": "port"}, ((0.0, 1.0), (60.0, 2.0))),
         Series({"instance": "y", "arg": "mem_fraction_static"}, ((0.0, 0.8), (60.0, 0.8)))]
    assert fleet_changes.detect_changes(s, table) == {
        "x": [fleet_changes.ArgChange("x", 600.0, "--schedule-conservativeness", 1, 1.3)]}


def test_instance_matcher_escapes_regex_and_string() -> None:
    assert fleet_changes.instance_matcher(["10.0.0.1:9470"]) == 'instance=~"10\\\\.0\\\\.0\\\\.1:9470"'


def test_only_the_arguments_that_moved_are_read_over_time(prometheus: str) -> None:
    """Every argument of every server over the range made the answer grow with the fleet (1000 servers x 7 days
    passed the 64 MiB cap): an instant query names the (instance, arg) whose value changed, and the range query
    reads only those servers, each argument with every point the unfiltered query gives it."""
    from sglang_tuning_exporter.fleet.promapi import PromConfig, PrometheusClient

    w = fleet.Window(start=END - LENGTH_S, end=END, step_s=60.0)
    client = PrometheusClient(PromConfig(url=prometheus, timeout_s=30.0))
    moved = client.instant(fleet_changes.moved_query(w), w.end)
    assert {(s.labels["instance"], s.labels["arg"]) for s in moved} == {
        (IMPROVED, "schedule_conservativeness"), (SLOWER, "schedule_conservativeness"),
        (PAIRED, "schedule_conservativeness"), (WORSE, "cuda_graph_max_bs"), (LATE, "mem_fraction_static")}
    names = fleet_changes.moved_instances(moved)
    got = {(s.labels["instance"], s.labels["arg"]): s.points
           for s in client.range(fleet_changes.args_query(w, names), w.start, w.end, w.step_s)}
    every = {(s.labels["instance"], s.labels["arg"]): s.points for s in client.range(
        "max by (instance, arg) (sglang_tuning_server_arg)", w.start, w.end, w.step_s)}
    assert {i for i, _ in got} == set(names) and len(every) > len(got) > 0
    assert got == {k: v for k, v in every.items() if k[0] in names}
