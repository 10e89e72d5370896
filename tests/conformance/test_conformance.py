"""One meaning everywhere: every scenario read by every evaluator gives the same verdicts and signal
values at its end (docs/signals.md, "Conformance").  A new evaluator or check joins here."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.tsdb import missing_prometheus
from sglang_tuning_exporter.core.model import STATUS_CODE
from sglang_tuning_exporter.pipeline.signals import LATENCY_COUNTS, LATENCY_SIGNALS

from . import promql
from .evaluators import TABLE, Reading, diagnose, live, replay, replayed_then_scraped, sidecar_restarted
from .scenarios import ALL, START, Scenario

WINDOW_S = 600.0
NATIVE_ALERTS = {c.alert for c in TABLE.checks if c.promql.get("sglang")}  # checks SGLang's own metrics can judge

SCENARIOS = {f().name: f for f in ALL}
PY_EVALUATORS = {"diagnose": diagnose, "replay": replay, "live": live}


def _applies(sc: Scenario, evaluator: str) -> bool:
    if not sc.lines:
        return evaluator == "live"  # metrics only: nothing to replay or diagnose
    return True


# Evaluators that read only the log: a scenario's /metrics (SGLang's latency histograms) never reaches them.
LOG_ONLY = {"diagnose", "replay"}
# The histograms' quantiles and counts, and what share_server_latency derives from them.
HISTOGRAM_SIGNALS = frozenset((*LATENCY_SIGNALS, *LATENCY_COUNTS, "queue_time_share", "prefill_tokens_per_request",
                               "servers_for_queue"))


def check_reading(sc: Scenario, r: Reading, who: str, *, log_only: bool = False) -> None:
    unseen = sc.log_only if log_only and sc.metrics else {}
    for check, words in unseen.items():
        # Not judged, and saying why on every rank (never `ok` for want of the histogram).
        assert r.worst_status(check) == "unknown", f"{who}: {check} is {r.worst_status(check)}, want unknown"
        said = [ev[check] for ev in r.evidence.values() if check in ev]
        assert said and all(words in e for e in said), f"{who}: {check} evidence {said}, want {words!r}"
    for check, want in sc.statuses.items():
        if check in unseen:
            continue
        assert r.worst_status(check) == want, f"{who}: {check} is {r.worst_status(check)}, want {want}"
    for name, want in sc.signals.items():
        if unseen and name in HISTOGRAM_SIGNALS:
            assert r.worst_signal(name) is None, f"{who}: {name} = {r.worst_signal(name)} from a log"
            continue
        got = r.worst_signal(name)
        assert got is not None and math.isclose(got, want, rel_tol=sc.rel, abs_tol=0.02), \
            f"{who}: {name} = {got}, want {want} (±{sc.rel:.0%})"
    for rank_text, checks in sc.rank_statuses.items():
        dim, _, value = rank_text.partition("=")
        ranks = [rk for rk in r.statuses if getattr(rk, dim) == int(value)]
        assert ranks, f"{who}: no rank {rank_text} in {list(r.statuses)}"
        for check, want in checks.items():
            got = {r.statuses[rk].get(check) for rk in ranks}
            assert got == {want}, f"{who}: {check} on {rank_text} is {got}, want {want}"


@pytest.mark.parametrize("evaluator", sorted(PY_EVALUATORS))
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_python_evaluators_agree(name: str, evaluator: str, tmp_path: Path) -> None:
    """Each Python evaluator reads each scenario's end as the scenario states."""
    sc = SCENARIOS[name]()
    if not _applies(sc, evaluator):
        pytest.skip(f"{evaluator} does not read a scenario without a log")
    check_reading(sc, PY_EVALUATORS[evaluator](sc, tmp_path), evaluator, log_only=evaluator in LOG_ONLY)


def test_sidecar_restarted_mid_log_knows_the_startup_facts(tmp_path: Path) -> None:
    """A sidecar started without --from-start reads the running server's startup section."""
    sc = SCENARIOS["sidecar_restart"]()
    check_reading(sc, sidecar_restarted(sc, tmp_path), "sidecar restarted")


# ----------------------------------------------------------------------------- PromQL evaluators
# The live run's /metrics history (and SGLang's own, where the scenario has one) is what a Prometheus
# scraped: the rendered rules under promtool, every dashboard panel and the fleet report read it.

EXPORTER_INSTANCE = "{}:9470"
SGLANG_INSTANCE = "{}:30000"
STEP_S = 15.0


def _scrapes(sc: Scenario, reading: Reading) -> list[promql.Scrape]:
    out = [promql.Scrape(t, promql.EXPORTER_JOB, EXPORTER_INSTANCE.format(sc.name), text)
           for t, text in reading.expositions]
    out += [promql.Scrape(START + t, promql.SGLANG_JOB, SGLANG_INSTANCE.format(sc.name), text)
            for t, text in sc.metrics]
    return out


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Scenario, list[promql.Scrape], float]]:
    reason = missing_prometheus()
    if reason:
        pytest.skip(reason)
    out = {}
    for name, make in SCENARIOS.items():
        sc = make()
        reading = live(sc, tmp_path_factory.mktemp(name))
        scrapes = _scrapes(sc, reading)
        out[name] = (sc, scrapes, max(s.t for s in scrapes))
    return out


def _expected_alerts(sc: Scenario) -> dict[str, list[dict[str, str]]]:
    """Each compared check's alert: fires at warning (and critical) as the scenario's end status says."""
    by_id = {c.id: c for c in TABLE.checks}
    out: dict[str, list[dict[str, str]]] = {}
    for check, status in sc.statuses.items():
        levels = {"ok": [], "unknown": [], "warning": ["warning"], "critical": ["warning", "critical"]}[status]
        # A check with one level (the OOM checks: critical only) renders one rule.
        levels = [lv for lv in levels if lv in by_id[check].thresholds_for(TABLE.default_profile())]
        subsets = [{"severity": lv} for lv in levels]
        for rank_text, checks in sc.rank_statuses.items():
            if check in checks:
                dim, _, value = rank_text.partition("=")
                subsets = [{**s, f"{dim}_rank": value} for s in subsets] if checks[check] != "ok" else subsets
        out[by_id[check].alert] = subsets
    return out


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rules_agree(name: str, histories: dict[str, tuple[Scenario, list[promql.Scrape], float]],
                     tmp_path: Path) -> None:
    """The rendered alert rules (promtool) fire as the scenario's end status says: exporter rules on our
    /metrics, SGLang-native rules on SGLang's own /metrics where the scenario has it."""
    sc, scrapes, end = histories[name]
    expected = _expected_alerts(sc)
    promql.rules_check([s for s in scrapes if s.job == promql.EXPORTER_JOB], end, expected, tmp_path / "exporter")
    if sc.metrics:
        native = [s for s in scrapes if s.job == promql.SGLANG_JOB]
        promql.rules_check(native, end, {a: v for a, v in expected.items() if a in NATIVE_ALERTS}, tmp_path / "native",
                           native=True)


@pytest.fixture(scope="module")
def prom(histories: dict[str, tuple[Scenario, list[promql.Scrape], float]],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[promql.PromHistory]:
    scrapes = [s for _, ss, _ in histories.values() for s in ss]
    with promql.PromHistory(scrapes, tmp_path_factory.mktemp("prom")) as p:
        yield p


RETRACTION_PANEL = "sglang-tuning-server/Retractions per minute/A"


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_dashboards_and_report_agree(name: str, histories: dict[str, tuple[Scenario, list[promql.Scrape], float]],
                                     prom: promql.PromHistory) -> None:
    """The server dashboard's retraction panel and the fleet report over the last window read the scenario's
    end as the Python evaluators do (within PromQL's stated tolerance, docs/signals.md)."""
    sc, _, end = histories[name]
    instances = {EXPORTER_INSTANCE.format(sc.name), SGLANG_INSTANCE.format(sc.name)}
    want = sc.signals.get("retractions_per_minute")
    if want is not None:
        panel = promql.dashboard_values(prom, end)[RETRACTION_PANEL]
        got = [v for k, v in panel.items() if dict(k).get("instance") in instances]
        assert got, f"no retraction series for {sc.name}"
        # Grafana's $__rate_interval (4 scrapes) counts few events: one event per minute of tolerance.
        assert max(got) == pytest.approx(want, abs=promql.tolerance(want, 4 * STEP_S)), got
    doc = promql.fleet_report(prom, end - WINDOW_S, end)
    moot = {c for c, st in sc.statuses.items() if st == "unknown"}
    found = [i for i in doc["instances"] if i["instance"] in instances]
    assert found, f"the report has no instance of {sc.name}"
    compared = 0
    judged: set[str] = set()
    for inst in found:
        statuses = {}
        for f in inst["findings"]:
            old = statuses.get(f["check"])
            if old is None or STATUS_CODE[f["status"]] > STATUS_CODE[old]:
                statuses[f["check"]] = f["status"]
        for f in inst["findings"]:
            if f["check"] in moot:  # not judged for the scenario's reason, not for lack of data
                assert f["evidence"].startswith("not judged: "), f["evidence"]
        for check, status in sc.statuses.items():
            # A check the scenario states as not judged (a feature switched off) is compared too.
            if check in statuses and (statuses[check] != "unknown" or status == "unknown"):
                assert statuses[check] == status, f"report on {inst['instance']}: {check} {statuses[check]}"
                compared += 1
                judged.add(check)
        if want is not None:
            vals = [s.get("retractions_per_minute") for s in inst["signals"].values()]
            vals = [v for v in vals if v is not None]
            assert vals and max(vals) == pytest.approx(want, abs=promql.tolerance(want, WINDOW_S)), vals
    # A report that judged none of the stated checks (all absent or unknown) would pass the loop above.
    assert compared or not sc.statuses, f"the report judged none of {sorted(sc.statuses)} for {sc.name}"
    if sc.log_only:  # SGLang's histograms reached the sidecar: the report judges every latency check stated
        assert set(sc.statuses) <= judged, f"the report did not judge {sorted(set(sc.statuses) - judged)}"
    if sc.metrics:
        # SGLang's own target alone (no sidecar series: the report reads SGLang's job only) is judged as the native
        # rules judge it: each stated check with a native rule, the latency checks from the histograms and the
        # hybrid pools from the gauges.
        alone = promql.fleet_report(prom, end - WINDOW_S, end, f'{{job="{promql.SGLANG_JOB}"}}')
        (native,) = [i for i in alone["instances"] if i["instance"] == SGLANG_INSTANCE.format(sc.name)]
        by_alert = {c.id: c.alert for c in TABLE.checks}
        want = {c: st for c, st in sc.statuses.items() if by_alert[c] in NATIVE_ALERTS and st != "unknown"}
        got = {c: _worst(native["findings"], c) for c in want}
        assert got == want, f"report on {native['instance']} (SGLang's metrics only): {got}, want {want}"
        # Its latency columns, from SGLang's histograms alone, are the quantiles every evaluator states.
        for name, value in sc.signals.items():
            if name in native["latency"]:
                assert native["latency"][name] == pytest.approx(value, rel=sc.rel, abs=0.02), (name, native["latency"])


def _worst(findings: list[dict[str, Any]], check: str) -> str | None:
    """The worst status of `check` over an instance's findings (None: not judged at all)."""
    found = [f["status"] for f in findings if f["check"] == check]
    return max(found, key=lambda st: STATUS_CODE[st]) if found else None


LEVELS = {-1.0: "unknown", 0.0: "ok", 1.0: "warning", 2.0: "critical"}


@pytest.mark.integration
def test_report_right_after_a_replayed_storm_agrees_with_the_alert(tmp_path: Path) -> None:
    """A sidecar replays a retraction storm, Prometheus scrapes it for 6 minutes and the retraction alert
    fires; `report --range 10m` three seconds later judges every check as the sidecar's windowed signals do
    (its `check_level`), retractions at the alert's severity, CUDA-graph coverage known (issue #24: it said
    `ok` at 0/min and `unknown`, reading counters whose growth came before the first scrape)."""
    if (reason := missing_prometheus()) is not None:
        pytest.skip(reason)
    sc = SCENARIOS["retraction_storm"]()
    reading = replayed_then_scraped(sc, tmp_path, at=START + 40 * 60, scrapes=25)
    instance = "replayed:9470"
    scrapes = [promql.Scrape(t, promql.EXPORTER_JOB, instance, text) for t, text in reading.expositions]
    end = scrapes[-1].t
    levels = {dict(labels)["check"]: LEVELS[v] for (name, labels), points in promql.series_of(scrapes[-1:]).items()
              if name == "sglang_tuning_check_level" for v in points.values()}
    # A replay read to its end is judged at its end (6 retractions a minute, critical) and stays so while
    # Prometheus scrapes; the alert fires at that level after its `for`, the CUDA graphs are judged ok.
    assert levels["retractions_frequent"] in ("warning", "critical") and levels["cuda_graph_uncovered"] == "ok"
    fired = {"warning": [{"severity": "warning"}],
             "critical": [{"severity": "warning"}, {"severity": "critical"}]}[levels["retractions_frequent"]]
    promql.rules_check(scrapes, end, {"SGLangRetractionsFrequent": fired}, tmp_path / "rules")
    with promql.PromHistory(scrapes, tmp_path / "prom") as prom:
        doc = promql.fleet_report(prom, end + 3 - WINDOW_S, end + 3)
    (inst,) = doc["instances"]
    got = {}
    for f in inst["findings"]:
        if f["check"] not in got or STATUS_CODE[f["status"]] > STATUS_CODE[got[f["check"]]]:
            got[f["check"]] = f["status"]
    assert got == {c: levels[c] for c in got}, {c: (got[c], levels[c]) for c in got if got[c] != levels[c]}
    assert set(got) == set(levels), set(got) ^ set(levels)  # every check judged by both
    sidecar = reading.worst_signal("retractions_per_minute")
    (sig,) = inst["signals"].values()
    assert sidecar is not None and sig["retractions_per_minute"] == pytest.approx(sidecar)


# Checks no scenario states yet, each with the reason; a new check in the table must join a scenario
# or this list (test_every_check_joins_the_suite fails otherwise).
NOT_IN_SCENARIOS = {
    "latency_batch_too_large": "latency workload only; the scenarios run the throughput workload",
    "schedule_policy_lpm_no_reuse": "needs Prefill lines with prefix-cache figures, which no scenario writes",
    "schedule_policy_fcfs_with_reuse": "needs Prefill lines with prefix-cache figures, which no scenario writes",
}


def test_every_check_joins_the_suite() -> None:
    """Each check of the table is stated by at least one scenario (so every evaluator is held to it), or
    listed above with the reason it is not yet."""
    stated = {c for make in ALL for c in make().statuses}
    ids = {c.id for c in TABLE.checks}
    assert ids - stated - set(NOT_IN_SCENARIOS) == set(), "add these checks to a scenario"
    assert not (set(NOT_IN_SCENARIOS) & stated), "stated by a scenario now: drop them from NOT_IN_SCENARIOS"
    assert set(NOT_IN_SCENARIOS) <= ids
