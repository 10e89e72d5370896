"""The fleet report against a REAL VictoriaMetrics (Debian's /usr/bin/victoria-metrics), beside the Prometheus
run of tests/fleet/test_report_prometheus.py: the same synthetic fleet history, imported through VictoriaMetrics'
Prometheus-text import API, queried through its Prometheus-compatible query API.

What differs from Prometheus and matters to the report (docs/report.md, "Other backends"): VictoriaMetrics'
`rate`/`increase` do not extrapolate to the window's edges, so per-minute rates can differ slightly; the
verdicts must not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from helpers import fleet_history as fh
from helpers.runners import report_json
from helpers.tsdb import backfilled_victoria_metrics

pytestmark = pytest.mark.integration

N_INSTANCES = 200  # as in the Prometheus run: the known mis-tuned servers and 191 healthy ones


@pytest.fixture(scope="module")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """VictoriaMetrics holding the synthetic history of N_INSTANCES servers over one day; yields its URL."""
    with backfilled_victoria_metrics(lambda om: fh.write_history(fh.fleet(N_INSTANCES), fh.HISTORY_END, 86400.0, 300, om),
                                     tmp_path_factory.mktemp("vmfleet")) as url:
        yield url


@pytest.fixture(scope="module")
def vm_report(victoria: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The JSON report of the fleet, from VictoriaMetrics."""
    return report_json(victoria, tmp_path_factory.mktemp("vmout"), length="1d", end=fh.HISTORY_END)


def _firing(inst: dict[str, Any]) -> list[str]:
    return sorted(f["check"] for f in inst["findings"] if f["status"] in ("warning", "critical"))


def test_every_server_is_reviewed_from_victoria_metrics(vm_report: dict[str, Any]) -> None:
    """All servers appear with the checks of the workload; none is left unknown for lack of data."""
    assert vm_report["summary"]["instances"] == N_INSTANCES == len(vm_report["instances"])
    one = next(i for i in vm_report["instances"] if i["instance"] == "10.0.0.1:9470")
    statuses = {f["check"]: f["status"] for f in one["findings"]}
    assert statuses["retractions_frequent"] == "ok" and statuses["queue_empty"] == "ok"


@pytest.mark.parametrize("instance", sorted(fh.KNOWN_MISTUNED))
def test_known_mistuned_servers_named_as_with_prometheus(vm_report: dict[str, Any], instance: str) -> None:
    """Each known mis-tuned server gets the same check and flag as from Prometheus."""
    by = {i["instance"]: i for i in vm_report["instances"]}
    check, flag, _ = fh.KNOWN_MISTUNED[instance]
    hits = [f for f in by[instance]["findings"] if f["check"] == check and f["status"] in ("warning", "critical")]
    assert hits, f"{instance}: {check} did not fire; firing: {_firing(by[instance])}"
    if flag is not None:
        assert hits[0]["flag"].startswith(flag)


def test_no_healthy_server_is_flagged(vm_report: dict[str, Any]) -> None:
    """Non-extrapolating rates change no verdict: only the known mis-tuned servers are flagged."""
    flagged = {i["instance"]: _firing(i) for i in vm_report["instances"] if _firing(i)}
    assert set(flagged) == set(fh.KNOWN_MISTUNED), flagged


def test_dp_rank_storm_rate_matches_without_extrapolation(vm_report: dict[str, Any]) -> None:
    """The DP-rank storm's per-minute rate is within 5 % of the true 6/min (VictoriaMetrics does not
    extrapolate `rate`; Prometheus does; both land near the truth over a long window)."""
    inst = next(i for i in vm_report["instances"] if i["instance"] == "10.9.0.7:9470")
    assert inst["signals"]["dp=1"]["retractions_per_minute"] == pytest.approx(6.0, rel=0.05)
    assert inst["signals"]["dp=0"]["retractions_per_minute"] == 0
