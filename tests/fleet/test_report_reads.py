"""How the report reads the sidecar's windowed signals over a range, from a REAL Prometheus (review findings):
TP ranks folded by the advisor's rule (min where less is worse, e.g. `prefix_cache_hit_ratio`), OOMs counted
over the whole range (not the fullest window), fixed settings at their latest value (not averaged across a
restart), and a `--range` just longer than the window read without falling back to other sources.

The history (promtool blocks from OpenMetrics): 2 hours ending at fleet_history.HISTORY_END, every minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import fleet_history as fh
from helpers.runners import report_json
from helpers.tsdb import backfilled_prometheus, write_openmetrics

pytestmark = pytest.mark.integration

END = fh.HISTORY_END
START = END - 7200.0
TP, OOM, FACT, SHORT = (f"10.9.7.{i}:9470" for i in range(1, 5))
OOM_AT = (START + 20 * 60, START + 50 * 60, START + 80 * 60)  # three decode OOMs, in three windows


def _labels(instance: str, tp: int = 0, extra: str = "") -> str:
    return (f'instance="{instance}",job="sglang-tuning",model_name="{fh.MODEL_A}",pp_rank="0",tp_rank="{tp}",'
            f'moe_ep_rank="0"' + ("," + extra if extra else ""))


def _write(out_dir: Path) -> list[Path]:
    times = [START + 60.0 * k for k in range(121)]
    rows: dict[tuple[str, str], list[tuple[str, list[tuple[float, float]]]]] = {}

    def emit(family: str, kind: str, sample: str, labels: str, values: list[tuple[float, float]]) -> None:
        rows.setdefault((family, kind), []).append((f"{sample}{{{labels}}}", values))

    def ratio(instance: str, tp: int, signal: str, value: float) -> None:
        emit("sglang_tuning_signal_ratio", "gauge", "sglang_tuning_signal_ratio",
             _labels(instance, tp, f'signal="{signal}"'), [(t, value) for t in times])

    # Two TP ranks of one replica that disagree: the least prefix-cache hit ratio and graph ceiling is the worst.
    for tp, hit, ceiling in ((0, 0.2, 0.25), (1, 0.6, 0.5)):
        ratio(TP, tp, "prefix_cache_hit_ratio", hit)
        ratio(TP, tp, "cuda_graph_ceiling_ratio", ceiling)
    # Three OOMs over the range, each alone in its 10-minute window.
    emit("sglang_tuning_oom_events", "counter", "sglang_tuning_oom_events_total", _labels(OOM, 0, 'phase="decode"'),
         [(t, float(sum(1 for a in OOM_AT if a <= t))) for t in times])
    emit("sglang_tuning_signal_amount", "gauge", "sglang_tuning_signal_amount",
         _labels(OOM, 0, 'signal="oom_decode_count"'),
         [(t, float(sum(1 for a in OOM_AT if t - 600 < a <= t))) for t in times])
    # A restart halfway with another --max-running-requests: the value now is 512, never their mean.
    emit("sglang_tuning_signal_amount", "gauge", "sglang_tuning_signal_amount",
         _labels(FACT, 0, 'signal="max_running_requests"'), [(t, 1024.0 if t < START + 3600 else 512.0) for t in times])
    # The sidecar's queue_empty_ratio (0.9) against a raw queue that is never empty (0 from the raw sources).
    ratio(SHORT, 0, "queue_empty_ratio", 0.9)
    emit("sglang_tuning_queue_requests", "gauge", "sglang_tuning_queue_requests", _labels(SHORT),
         [(t, 40.0) for t in times])
    return write_openmetrics(out_dir / "reads.om", rows)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with backfilled_prometheus(_write, tmp_path_factory.mktemp("reads")) as url:
        yield url


@pytest.fixture(scope="module")
def doc(prometheus: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return report_json(prometheus, tmp_path_factory.mktemp("out"), length="2h", end=END)


def signals(doc: dict[str, Any], instance: str) -> dict[str, Any]:
    (inst,) = [i for i in doc["instances"] if i["instance"] == instance]
    (sig,) = inst["signals"].values()
    out: dict[str, Any] = sig
    return out


def test_tp_ranks_fold_by_the_advisors_rule(doc: dict[str, Any]) -> None:
    """prefix_cache_hit_ratio and cuda_graph_ceiling_ratio: the least TP rank's (guide/advisor.MIN_AGG), as
    the advisor folds ranks; before, every ratio folded with max (0.6 and 0.5)."""
    sig = signals(doc, TP)
    assert (sig["prefix_cache_hit_ratio"], sig["cuda_graph_ceiling_ratio"]) == (0.2, 0.25)


def test_ooms_are_counted_over_the_range(doc: dict[str, Any]) -> None:
    """Three OOMs in two hours are 3 (the counter's increase), not the fullest window's 1."""
    assert signals(doc, OOM)["oom_decode_count"] == 3


def test_a_fixed_setting_is_its_latest_value(doc: dict[str, Any]) -> None:
    """max_running_requests 1024 then 512 after a restart is 512 now, not the mean 768."""
    assert signals(doc, FACT)["max_running_requests"] == 512


def test_a_range_just_longer_than_the_window_still_reads_the_sidecar(prometheus: str, tmp_path: Path) -> None:
    """--range 620s with a 600 s window left 20 s to look back, less than a scrape: the sidecar's signal
    vanished and the raw queue (never empty, 0) took its place silently. Now the windows ending in the last
    5 minutes are read, and the report says how far before the range they reach."""
    got = report_json(prometheus, tmp_path, length="620s", end=END - 20)
    assert signals(got, SHORT)["queue_empty_ratio"] == 0.9
    (note,) = got["notes"]
    assert "before the range's start" in note and "reach back 4.7 min" in note  # 280 s
