"""Every PromQL evaluator gives one value per DP replica whatever the TP degree (docs/signals.md, "PromQL: the
same meaning"): the rendered rules (exporter and SGLang-native, both spellings), the dashboards and the fleet
report, computed by the real promtool and a real Prometheus over synthetic scrapes of our exporter's /metrics
and of SGLang's own /metrics.

The fleet (one history, 40 minutes at 15 s):
- `storm-*`: TP4, every TP rank exports the same retraction counter (`--enable-metrics-for-all-schedulers`;
  the sidecar's per-rank counters of a log where each TP rank prints each retraction) at 3/min;
- `healthy-*`: the same at 0.35/min (summed over 4 ranks it would read 1.4/min and page);
- `dp-*`: DP attention, 4 DP ranks, only DP rank 2 retracts (6/min), the others 0.2/min;
- `headroom-*`: TP4 with available GPU memory 6.0, 6.2, 4.5, 6.1 GB: the server's headroom is 4.5 GB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.promql import (
    EXPORTER_JOB,
    SCRAPE_STEP_S,
    SGLANG_JOB,
    PromHistory,
    Scrape,
    dashboard_values,
    fleet_report,
    rules_check,
    tolerance,
)
from helpers.tsdb import missing_prometheus
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.render import rules as render_rules

REASON = missing_prometheus()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
STEP = SCRAPE_STEP_S
LENGTH = 2400.0
AT = T0 + LENGTH  # the instant the rules, dashboards and the report's range end are evaluated at
REPORT_START = T0 + 600.0
GIB = float(1 << 30)
WINDOW_S = 600.0  # the retraction check's window (checks.yaml)


@dataclass(frozen=True)
class Server:
    """One synthetic server and what it exposes."""

    instance: str
    source: str  # "exporter" (our /metrics), "sglang:" or "sglang_" (SGLang's own, in that spelling)
    model: str
    tp: int = 4
    dp: int = 1  # > 1: DP attention, one scheduler per DP rank (dp_rank label, tp_rank = the DP rank)
    rate: Callable[[int], float] = field(default=lambda dp: 0.0)  # retractions per minute of a DP rank
    headroom_gb: tuple[float, ...] = (6.5, 6.5, 6.5, 6.5)  # per TP rank

    def ranks(self) -> list[tuple[int | None, int]]:
        """(dp, tp) of every scheduler that exports metrics (every TP rank of every replica)."""
        if self.dp > 1:
            return [(d, d) for d in range(self.dp)]
        return [(None, t) for t in range(self.tp)]


def _storm(dp: int) -> float:
    return 3.0


def _healthy(dp: int) -> float:
    return 0.35


def _hot_rank_2(dp: int) -> float:
    return 6.0 if dp == 2 else 0.2


FLEET = (
    Server("storm-exp:9470", "exporter", "m/storm-exp", rate=_storm),
    Server("storm-colon:30000", "sglang:", "m/storm-colon", rate=_storm),
    Server("storm-under:30000", "sglang_", "m/storm-under", rate=_storm),
    Server("healthy-exp:9470", "exporter", "m/healthy-exp", rate=_healthy),
    Server("healthy-colon:30000", "sglang:", "m/healthy-colon", rate=_healthy),
    Server("dp-exp:9470", "exporter", "m/dp-exp", tp=4, dp=4, rate=_hot_rank_2),
    Server("dp-colon:30000", "sglang:", "m/dp-colon", tp=4, dp=4, rate=_hot_rank_2),
    Server("headroom-exp:9470", "exporter", "m/headroom-exp", headroom_gb=(6.0, 6.2, 4.5, 6.1)),
    Server("headroom-under:30000", "sglang_", "m/headroom-under", headroom_gb=(6.0, 6.2, 4.5, 6.1)),
)
BY_NAME = {s.instance.split(":")[0]: s for s in FLEET}


def _count(rate_per_min: float, t: float) -> int:
    """Events so far of a rank retracting evenly at `rate_per_min` (a counter: whole events)."""
    return math.floor(rate_per_min * (t - T0) / 60.0 + 1e-9)


def _labels(**kv: str | int | None) -> str:
    return ",".join(f'{k}="{"" if v is None else v}"' for k, v in kv.items())


def exporter_text(s: Server, t: float) -> str:
    """Our exporter's /metrics for `s` at `t`: per-rank counters and gauges (as the sidecar keeps them per
    log rank), the windowed signal per replica (TP folded)."""
    lines = ["# HELP sglang_tuning_retractions_total Retraction events.",
             "# TYPE sglang_tuning_retractions_total counter"]
    rank_sets = [(dp, tp, _labels(model_name=s.model, dp_rank=dp, pp_rank=None, tp_rank=tp, moe_ep_rank=None))
                 for dp, tp in s.ranks()]
    lines += [f"sglang_tuning_retractions_total{{{lab}}} {_count(s.rate(dp or 0), t)}" for dp, _, lab in rank_sets]
    for name, value in (("queue_requests", 500.0), ("token_usage_ratio", 0.95), ("running_requests", 600.0),
                        ("max_running_requests", 1024.0)):
        lines += [f"# TYPE sglang_tuning_{name} gauge"]
        lines += [f"sglang_tuning_{name}{{{lab}}} {value}" for _, _, lab in rank_sets]
    lines += ["# TYPE sglang_tuning_available_gpu_memory_bytes gauge"]
    lines += [f"sglang_tuning_available_gpu_memory_bytes{{{lab}}} {s.headroom_gb[tp % len(s.headroom_gb)] * GIB}"
              for _, tp, lab in rank_sets]
    lines += ["# TYPE sglang_tuning_signal_per_second gauge"]
    for dp in sorted({dp for dp, _ in s.ranks()}, key=lambda d: -1 if d is None else d):
        lab = _labels(model_name=s.model, dp_rank=dp, pp_rank=None, tp_rank=None, moe_ep_rank=None)
        lines.append(f'sglang_tuning_signal_per_second{{{lab},signal="retractions"}} {s.rate(dp or 0) / 60.0!r}')
    return "\n".join(lines) + "\n"


def sglang_text(s: Server, t: float) -> str:
    """SGLang 0.5.23's own /metrics for `s` at `t` (every scheduler exports; `s.source` is the spelling)."""
    p = s.source
    out: list[str] = []
    rank_sets = []
    for dp, tp in s.ranks():
        lab = _labels(engine_type="unified", model_name=s.model, moe_ep_rank=0, pp_rank=0, tp_rank=tp)
        rank_sets.append((dp, tp, lab + (f',dp_rank="{dp}"' if dp is not None else "")))
    out += [f"# HELP {p}num_retracted_requests_total Total number of retracted requests.",
            f"# TYPE {p}num_retracted_requests_total counter"]
    out += [f"{p}num_retracted_requests_total{{{lab}}} {_count(s.rate(dp or 0), t)}.0" for dp, _, lab in rank_sets]
    for name, value in (("num_queue_reqs", 500.0), ("token_usage", 0.95), ("num_running_reqs", 600.0),
                        ("max_running_requests", 1024.0)):
        out += [f"# TYPE {p}{name} gauge"] + [f"{p}{name}{{{lab}}} {value}" for _, _, lab in rank_sets]
    out += [f"# TYPE {p}startup_available_gpu_memory_gb gauge"]
    out += [f"{p}startup_available_gpu_memory_gb{{{lab}}} {s.headroom_gb[tp % len(s.headroom_gb)]}"
            for _, tp, lab in rank_sets]
    return "\n".join(out) + "\n"


def history() -> list[Scrape]:
    """Every scrape of every server, every 15 s for 40 minutes."""
    out = []
    for i in range(round(LENGTH / STEP) + 1):
        t = T0 + i * STEP
        for s in FLEET:
            if s.source == "exporter":
                out.append(Scrape(t, EXPORTER_JOB, s.instance, exporter_text(s, t)))
            else:
                out.append(Scrape(t, SGLANG_JOB, s.instance, sglang_text(s, t)))
    return out


@pytest.fixture(scope="module")
def scrapes() -> list[Scrape]:
    """The fleet's history."""
    return history()


@pytest.fixture(scope="module")
def prom(scrapes: list[Scrape], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromHistory]:
    """The history in a real Prometheus."""
    with PromHistory(scrapes, tmp_path_factory.mktemp("prom")) as p:
        yield p


@pytest.fixture(scope="module")
def report_doc(prom: PromHistory) -> dict[str, Any]:
    """The fleet report over the last 30 minutes."""
    return fleet_report(prom, REPORT_START, AT)


@pytest.fixture(scope="module")
def panels(prom: PromHistory) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Every dashboard panel's value at AT."""
    return dashboard_values(prom, AT)


def _instance(values: dict[frozenset[tuple[str, str]], float], instance: str) -> dict[dict[str, str] | Any, float]:
    return {k: v for k, v in values.items() if dict(k).get("instance") == instance}


# ----------------------------------------------------------------------------- rules (promtool)


def test_exporter_rules_fire_once_per_replica(scrapes: list[Scrape], tmp_path: Path) -> None:
    """Exporter rules: the TP4 storm pages once (warning: 3/min, not 12), the healthy TP4 server not at all,
    DP attention on DP rank 2 only (warning and critical at 6/min), headroom on the least TP rank (4.5 GB)
    once, with no tp_rank left on any alert."""
    rules_check(scrapes, AT, {
        "SGLangRetractionsFrequent": [
            {"instance": "storm-exp:9470", "severity": "warning"},
            {"instance": "dp-exp:9470", "dp_rank": "2", "severity": "warning"},
            {"instance": "dp-exp:9470", "dp_rank": "2", "severity": "critical"}],
        "SGLangGPUMemHeadroomLow": [{"instance": "headroom-exp:9470", "severity": "warning", "tp_rank": ""}],
        "SGLangGPUMemHeadroomHigh": [],
    }, tmp_path)


def test_native_rules_fire_once_per_replica(scrapes: list[Scrape], tmp_path: Path) -> None:
    """SGLang-native rules, both spellings: the same verdicts from SGLang's per-TP-rank series."""
    no_tp = {"tp_rank": "", "moe_ep_rank": ""}
    rules_check(scrapes, AT, {
        "SGLangRetractionsFrequent": [
            {"instance": "storm-colon:30000", "severity": "warning", **no_tp},
            {"instance": "storm-under:30000", "severity": "warning", **no_tp},
            {"instance": "dp-colon:30000", "dp_rank": "2", "severity": "warning", **no_tp},
            {"instance": "dp-colon:30000", "dp_rank": "2", "severity": "critical", **no_tp}],
        "SGLangGPUMemHeadroomLow": [{"instance": "headroom-under:30000", "severity": "warning", **no_tp}],
        "SGLangGPUMemHeadroomHigh": [],
    }, tmp_path, native=True)


def test_rules_check_reports_a_disagreement(scrapes: list[Scrape], tmp_path: Path) -> None:
    """The evaluator can fail: a wrong expectation (the storm at critical) raises with what did fire."""
    with pytest.raises(AssertionError, match="storm-colon:30000"):
        rules_check(scrapes, AT, {"SGLangRetractionsFrequent": [
            {"instance": "storm-colon:30000", "severity": "critical"}]}, tmp_path, native=True)


# ----------------------------------------------------------------------------- recording rules


def _rule_expr(record: str) -> str:
    for g in render_rules.rule_groups(load_table()):
        for r in g["rules"]:
            if r.get("record") == record:
                return str(r["expr"])
    raise AssertionError(f"no recording rule {record}")


def test_recording_rules_give_the_replica_rate(prom: PromHistory) -> None:
    """The exporter's recording rule and the native one: one series per replica at ~3/min on the storm."""
    recorded = prom.query(_rule_expr(render_rules.recorded("retractions")), AT)
    storm = _instance(recorded, "storm-exp:9470")
    assert len(storm) == 1 and 60 * next(iter(storm.values())) == pytest.approx(3.0, abs=tolerance(3.0, 300))
    native = prom.query(_rule_expr("rank:sglang_retractions_per_minute:over10m"), AT)
    for inst in ("storm-colon:30000", "storm-under:30000"):
        one = _instance(native, inst)
        assert len(one) == 1 and next(iter(one.values())) == pytest.approx(3.0, abs=tolerance(3.0, WINDOW_S))
    healthy = _instance(native, "healthy-colon:30000")
    assert len(healthy) == 1 and next(iter(healthy.values())) == pytest.approx(0.35, abs=tolerance(0.35, WINDOW_S))
    headroom = prom.query(_rule_expr("rank:sglang_available_gpu_mem_gb:latest"), AT)
    assert list(_instance(headroom, "headroom-under:30000").values()) == [4.5]


# ----------------------------------------------------------------------------- dashboards


RATE_WINDOW = 4 * STEP  # Grafana's $__rate_interval for a 15 s scrape interval


def test_dashboard_retractions_per_replica(panels: dict[str, dict[frozenset[tuple[str, str]], float]]) -> None:
    """Server dashboard: one retraction series per replica at ~3/min (a sum over TP4 would read 12);
    fleet dashboard: each server at its worst replica."""
    server = panels["sglang-tuning-server/Retractions per minute/A"]
    tol = tolerance(3.0, RATE_WINDOW)
    for inst in ("storm-exp:9470", "storm-colon:30000", "storm-under:30000"):
        one = _instance(server, inst)
        assert len(one) == 1, one
        assert next(iter(one.values())) == pytest.approx(3.0, abs=tol), inst
    dp = {dict(k)["dp_rank"]: v for k, v in _instance(server, "dp-colon:30000").items()}
    assert set(dp) == {"0", "1", "2", "3"} and dp["2"] == pytest.approx(6.0, abs=tolerance(6.0, RATE_WINDOW))
    fleet = {dict(k)["instance"]: v for k, v in panels["sglang-tuning-fleet/Retractions per minute, worst servers/A"].items()}
    assert fleet["storm-exp:9470"] == pytest.approx(3.0, abs=tol)
    assert fleet["storm-colon:30000"] == pytest.approx(3.0, abs=tol)
    assert fleet["dp-exp:9470"] == pytest.approx(6.0, abs=tolerance(6.0, RATE_WINDOW))


def test_dashboard_headroom_is_the_least_tp_rank(panels: dict[str, dict[frozenset[tuple[str, str]], float]]) -> None:
    """The memory panel shows 4.5 GB for the TP4 server whose ranks have 6.0/6.2/4.5/6.1 GB, both sources."""
    mem = panels["sglang-tuning-server/Available GPU memory after startup/A"]
    for inst in ("headroom-exp:9470", "headroom-under:30000"):
        assert list(_instance(mem, inst).values()) == [pytest.approx(4.5 * GIB)], inst


# ----------------------------------------------------------------------------- the fleet report


def _inst(doc: dict[str, Any], instance: str) -> dict[str, Any]:
    found: dict[str, Any] = next(i for i in doc["instances"] if i["instance"] == instance)
    return found


def _retr(doc: dict[str, Any], instance: str) -> list[tuple[dict[str, int], str]]:
    return [(f["rank"], f["status"]) for f in _inst(doc, instance)["findings"] if f["check"] == "retractions_frequent"]


REPORT_RANGE = AT - REPORT_START


def test_report_storm_reads_3_per_minute(report_doc: dict[str, Any]) -> None:
    """The report reads the TP4 storm at ~3/min (warning), from both sources and both spellings."""
    for inst in ("storm-exp:9470", "storm-colon:30000", "storm-under:30000"):
        sig = _inst(report_doc, inst)["signals"]
        assert list(sig) == ["all"], sig
        assert sig["all"]["retractions_per_minute"] == pytest.approx(3.0, abs=tolerance(3.0, REPORT_RANGE)), inst
        assert _retr(report_doc, inst) == [({}, "warning")], inst


def test_report_healthy_tp4_is_not_flagged(report_doc: dict[str, Any]) -> None:
    """0.35/min on each of 4 TP ranks is 0.35/min, not 1.4: ok."""
    for inst in ("healthy-exp:9470", "healthy-colon:30000"):
        sig = _inst(report_doc, inst)["signals"]["all"]
        assert sig["retractions_per_minute"] == pytest.approx(0.35, abs=tolerance(0.35, REPORT_RANGE)), inst
        assert _retr(report_doc, inst) == [({}, "ok")], inst


def test_report_dp_attention_names_the_hot_rank(report_doc: dict[str, Any]) -> None:
    """DP attention with DP rank 2 at 6/min: the report fires on dp=2 only, with that rank's value."""
    for inst in ("dp-exp:9470", "dp-colon:30000"):
        retr = dict((r.get("dp"), s) for r, s in _retr(report_doc, inst))
        assert retr == {0: "ok", 1: "ok", 2: "critical", 3: "ok"}, inst
        sig = _inst(report_doc, inst)["signals"]
        assert sig["dp=2"]["retractions_per_minute"] == pytest.approx(6.0, abs=tolerance(6.0, REPORT_RANGE))
        assert sig["dp=0"]["retractions_per_minute"] == pytest.approx(0.2, abs=tolerance(0.2, REPORT_RANGE))


def test_report_headroom_is_the_least_tp_rank(report_doc: dict[str, Any]) -> None:
    """The report's headroom is the least free memory across TP ranks (4.5 GB, low), not the most (6.2)."""
    for inst in ("headroom-exp:9470", "headroom-under:30000"):
        assert _inst(report_doc, inst)["signals"]["all"]["available_gpu_mem_gb"] == pytest.approx(4.5), inst
        statuses = {f["check"]: f["status"] for f in _inst(report_doc, inst)["findings"]}
        assert statuses["gpu_mem_headroom_low"] == "warning", inst
