"""Issue 25, the fleet side: the report's latency columns (the sidecar's windowed p95 quantiles) and its order
by SLO burn, from a REAL Prometheus holding SGLang's TTFT/ITL histograms, the sidecar's
`sglang_tuning_signal_seconds` and, for one server, only the `instance:sglang_slo_*` recording rule.

The history (promtool blocks from OpenMetrics): 2 hours ending at fleet_history.HISTORY_END, every minute,
10 requests a second per server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from helpers import fleet_history as fh
from helpers.runners import report_json, report_output
from helpers.tsdb import backfilled_prometheus, write_openmetrics

pytestmark = pytest.mark.integration

END = fh.HISTORY_END
START = END - 7200.0
FAST, BURN, MID, NOLAT, RECORDED = (f"10.9.8.{i}:9470" for i in range(1, 6))
# server -> (p95 TTFT, ITL, E2E, queue time exported by its sidecar; share of requests slower than 2 s TTFT;
# share slower than 0.1 s ITL)
SERVERS: dict[str, tuple[tuple[float, float, float, float] | None, float | None, float | None]] = {
    FAST: ((0.4, 0.02, 5.0, 0.1), 0.01, 0.002),
    BURN: ((3.0, 0.05, 30.0, 2.5), 0.10, 0.004),
    MID: ((1.6, 0.12, 12.0, 0.3), 0.02, 0.04),
    NOLAT: (None, None, None),
}
# Servers seen only through SGLang's own /metrics (no sidecar): cumulative share of requests at or under each
# bucket bound, per histogram family (every release's name and spelling: NATIVE the 0.5.23 names, RAY Ray Serve's
# `ray_sglang_` with the 0.3.6-0.4.4 ITL name and 0.5.2's queue-time name, and no TTFT histogram).
NATIVE, RAY = "10.9.8.6:30000", "10.9.8.7:8080"
HISTOGRAMS: dict[str, dict[str, dict[float, float]]] = {
    NATIVE: {"sglang:time_to_first_token_seconds": {0.5: 0.5, 1.0: 0.8, 2.0: 0.97, 4.0: 1.0},
             "sglang:inter_token_latency_seconds": {0.05: 0.9, 0.1: 0.99, 0.2: 1.0},
             "sglang:e2e_request_latency_seconds": {5.0: 0.6, 10.0: 0.9, 20.0: 1.0},
             "sglang:queue_time_seconds": {0.1: 0.7, 1.0: 0.99, 2.0: 1.0}},
    RAY: {"ray_sglang_time_per_output_token_seconds": {0.05: 0.5, 0.1: 0.95, 0.2: 1.0},
          "ray_sglang_queue_time_s": {0.5: 0.2, 1.0: 0.6, 4.0: 1.0}},
}
SLO = "slo:\n  ttft_p95_seconds: 2\n  itl_p95_seconds: 0.1\n  objective: 0.99\n"


def _labels(instance: str, extra: str = "") -> str:
    return (f'instance="{instance}",job="sglang-tuning",model_name="{fh.MODEL_A}",pp_rank="0",tp_rank="0",'
            f'moe_ep_rank="0"' + ("," + extra if extra else ""))


def _write(out_dir: Path) -> list[Path]:
    times = [START + 60.0 * k for k in range(121)]
    rows: dict[str, list[tuple[str, list[tuple[float, float]]]]] = {}

    def emit(name: str, labels: str, values: list[tuple[float, float]]) -> None:
        rows.setdefault(name, []).append((f"{name}{{{labels}}}", values))

    for inst, (p95, ttft_slow, itl_slow) in SERVERS.items():
        emit("sglang_tuning_queue_requests", _labels(inst), [(t, 30.0) for t in times])
        if p95 is not None:
            for signal, v in zip(("ttft_p95", "itl_p95", "e2e_p95", "queue_time_p95"), p95, strict=True):
                emit("sglang_tuning_signal_seconds", _labels(inst, f'signal="{signal}"'), [(t, v) for t in times])
        for family, le, slow in (("sglang:time_to_first_token_seconds", "2.0", ttft_slow),
                                 ("sglang:inter_token_latency_seconds", "0.1", itl_slow)):
            if slow is None:
                continue
            count = [(t, 10.0 * (t - START)) for t in times]
            emit(family + "_count", _labels(inst), count)
            emit(family + "_bucket", _labels(inst, f'le="{le}"'), [(t, round(n * (1 - slow))) for t, n in count])
            emit(family + "_bucket", _labels(inst, 'le="+Inf"'), count)
    for inst, families in HISTOGRAMS.items():
        labels = f'instance="{inst}",job="sglang",model_name="{fh.MODEL_A}",engine_type="unified"'
        emit(("ray_sglang_" if inst == RAY else "sglang:") + "num_queue_reqs", labels, [(t, 30.0) for t in times])
        for family, cumulative in families.items():
            count = [(t, 10.0 * (t - START)) for t in times]
            emit(family + "_count", labels, count)
            for le, share in [*cumulative.items(), (float("inf"), 1.0)]:
                bound = "+Inf" if le == float("inf") else repr(le)
                emit(family + "_bucket", f'{labels},le="{bound}"', [(t, round(n * share)) for t, n in count])
    # A long-term store that kept only the recording rule: 20 % slower than the target, burn 20.
    emit("instance:sglang_slo_ttft_slow_ratio:rate1h", f'instance="{RECORDED}",model_name="{fh.MODEL_A}"',
         [(t, 0.2) for t in times])
    emit("sglang_tuning_queue_requests", _labels(RECORDED), [(t, 30.0) for t in times])
    return write_openmetrics(out_dir / "latency.om", {(name, "gauge"): series for name, series in rows.items()})


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with backfilled_prometheus(_write, tmp_path_factory.mktemp("latency")) as url:
        yield url


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(SLO, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def doc(prometheus: str, config: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return report_json(prometheus, tmp_path_factory.mktemp("out"), length="2h", end=END,
                       extra=("--config", str(config)))


def latency(doc: dict[str, Any], instance: str) -> dict[str, Any]:
    (inst,) = [i for i in doc["instances"] if i["instance"] == instance]
    out: dict[str, Any] = inst["latency"]
    return out


def test_latency_columns_are_the_sidecars_p95(doc: dict[str, Any]) -> None:
    got = latency(doc, BURN)
    assert (got["ttft_p95_seconds"], got["itl_p95_seconds"], got["e2e_p95_seconds"],
            got["queue_time_p95_seconds"]) == (3.0, 0.05, 30.0, 2.5)
    none = latency(doc, NOLAT)
    assert none["ttft_p95_seconds"] is None and "no latency quantile series" in none["unknown_why"]["ttft_p95_seconds"]


def test_servers_are_ordered_by_worst_burn(doc: dict[str, Any]) -> None:
    """Burn = share slower than the target over the range / the 1 % budget: the recorded-only server 20,
    BURN 10 (TTFT), MID 4 (ITL, its worst), FAST 1; NOLAT, with no burn, last."""
    assert doc["order"]["by"] == "slo_burn" and doc["slo"] == {"ttft_p95_seconds": 2.0, "itl_p95_seconds": 0.1,
                                                              "objective": 0.99}
    assert [i["instance"] for i in doc["instances"]] == [RECORDED, BURN, RAY, MID, NATIVE, FAST, NOLAT]
    burns = {i["instance"]: i["latency"]["worst_burn"] for i in doc["instances"]}
    assert burns[RECORDED] == pytest.approx(20, rel=0.01) and burns[BURN] == pytest.approx(10, rel=0.01)
    assert burns[MID] == pytest.approx(4, rel=0.01) and burns[FAST] == pytest.approx(1, rel=0.05)
    assert burns[NOLAT] is None
    # SGLang's own histograms, Ray Serve's spelling and the older ITL name included: 5 % slower than 0.1 s ITL.
    assert burns[RAY] == pytest.approx(5, rel=0.01) and burns[NATIVE] == pytest.approx(3, rel=0.01)
    assert latency(doc, MID)["slo"]["itl_p95_seconds"]["burn"] == pytest.approx(4, rel=0.01)


def test_markdown_says_the_burn_and_the_order(prometheus: str, config: Path, tmp_path: Path) -> None:
    code, md = report_output(prometheus, tmp_path, "markdown", length="2h", end=END, extra=("--config", str(config)))
    assert code == 0
    section = md.split("## Latency", 1)[1].split("## Mis-tuned servers", 1)[0]
    assert "Order: servers ordered by their worst SLO burn" in section
    assert f"| `{BURN}` | 3 s | 0.05 s | 30 s | 2.5 s | 10 (p95 TTFT) |" in section
    assert section.index(RECORDED) < section.index(BURN) < section.index(MID) < section.index(FAST)


def test_without_slo_the_order_is_by_name_and_says_why(prometheus: str, tmp_path: Path) -> None:
    got = report_json(prometheus, tmp_path, length="2h", end=END)
    assert got["order"]["by"] == "instance" and "no slo: in --config" in got["order"]["why"]
    assert [i["instance"] for i in got["instances"]] == [FAST, BURN, MID, NOLAT, RECORDED, NATIVE, RAY]
    assert got["slo"] is None and all(i["latency"]["slo"] == {} for i in got["instances"])
    assert latency(got, FAST)["ttft_p95_seconds"] == 0.4


def _histogram_quantile(url: str, q: float, family: str, instance: str) -> float:
    """Prometheus' own histogram_quantile over the range the report reviews."""
    expr = f'histogram_quantile({q}, sum by (le) (rate({family}_bucket{{instance="{instance}"}}[2h])))'
    body = requests.get(f"{url}/api/v1/query", params={"query": expr, "time": str(END)}, timeout=30).json()
    (res,) = body["data"]["result"]
    return float(res["value"][1])


def test_servers_without_a_sidecar_get_latency_from_sglangs_histograms(prometheus: str, doc: dict[str, Any]) -> None:
    """A server seen only through SGLang's /metrics: its p95 columns are Prometheus' histogram_quantile over its
    histograms (any release name and spelling); a histogram it does not export is unknown with the reason."""
    names = {"ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds",
             "e2e": "e2e_request_latency_seconds", "queue_time": "queue_time_seconds"}
    got = latency(doc, NATIVE)
    for lat, name in names.items():
        want = _histogram_quantile(prometheus, 0.95, "sglang:" + name, NATIVE)
        assert got[f"{lat}_p95_seconds"] == pytest.approx(want, rel=1e-5), lat
    assert got["ttft_p95_seconds"] == pytest.approx(1 + 0.15 / 0.17, rel=1e-5) and got["unknown_why"] == {}
    ray = latency(doc, RAY)
    assert ray["itl_p95_seconds"] == pytest.approx(
        _histogram_quantile(prometheus, 0.95, "ray_sglang_time_per_output_token_seconds", RAY), rel=1e-5)
    assert ray["queue_time_p95_seconds"] == pytest.approx(
        _histogram_quantile(prometheus, 0.95, "ray_sglang_queue_time_s", RAY), rel=1e-5)
    assert ray["ttft_p95_seconds"] is None and "SGLang's latency histograms" in ray["unknown_why"]["ttft_p95_seconds"]
    # The checks read them too: the medians latency_queue_dominates compares are among the judged signals.
    (inst,) = [i for i in doc["instances"] if i["instance"] == NATIVE]
    (signals,) = inst["signals"].values()
    assert signals["queue_time_share"] == pytest.approx(
        _histogram_quantile(prometheus, 0.5, "sglang:queue_time_seconds", NATIVE)
        / _histogram_quantile(prometheus, 0.5, "sglang:e2e_request_latency_seconds", NATIVE), rel=1e-4)
    assert signals["ttft_requests"] == pytest.approx(10 * 7200, rel=0.01)
