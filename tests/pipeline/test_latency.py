"""Latency signals: SGLang's histograms scraped -> bucket deltas in the window -> quantiles computed as
Prometheus' `histogram_quantile` computes them (docs/signals.md, latency rows)."""

from __future__ import annotations

import math
import re

import pytest

from helpers.paths import FIXTURES
from sglang_tuning_exporter.core.catalog import SIGNAL_UNITS
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.pipeline.signals import LATENCY_SIGNALS
from sglang_tuning_exporter.pipeline.stats import bucket_quantile
from sglang_tuning_exporter.pipeline.window import Window
from sglang_tuning_exporter.sources.scrape import ScrapeInterpreter, parse_exposition, wanted

REAL = (FIXTURES / "metrics" / "sglang-0.5.23-metrics.txt").read_text()
INF = math.inf


def scaled(text: str, family: str, factor: float) -> str:
    """`text` with every cumulative bucket of `family` multiplied by `factor`."""
    return re.sub(rf"({re.escape(family)}_bucket\{{[^}}]*\}} )([0-9.eE+-]+)",
                  lambda m: f"{m.group(1)}{float(m.group(2)) * factor}", text)


def window_signals(texts: list[str], step: float = 15.0) -> dict[Rank, dict[str, float | None]]:
    interp, w = ScrapeInterpreter(), Window(600.0)
    for i, text in enumerate(texts):
        for o in interp.interpret(parse_exposition(text, wanted), 1000.0 + i * step).observations:
            w.add(o)
    return w.signals(1000.0 + len(texts) * step)


def test_quantile_interpolates_inside_the_bucket() -> None:
    """Linear interpolation: 10 of 20 requests <= 0.1 s, 10 more <= 0.2 s -> p75 = 0.15."""
    assert bucket_quantile(0.75, {0.1: 10.0, 0.2: 20.0, INF: 20.0}) == pytest.approx(0.15)
    assert bucket_quantile(0.5, {0.1: 10.0, 0.2: 20.0, INF: 20.0}) == pytest.approx(0.1)


def test_quantile_lowest_bucket_starts_at_zero() -> None:
    """The lowest bucket with a positive bound starts at 0: 10 requests <= 0.4 s -> p50 = 0.2."""
    assert bucket_quantile(0.5, {0.4: 10.0, 0.8: 10.0, INF: 10.0}) == pytest.approx(0.2)


def test_quantile_lowest_bucket_at_or_below_zero_answers_its_bound() -> None:
    """Queue time's `le="0.0"` bucket: a rank falling in it is 0, not an interpolation."""
    assert bucket_quantile(0.5, {0.0: 6.0, 0.001: 8.0, INF: 10.0}) == 0.0


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    """Requests past the last finite bound: PromQL answers that bound."""
    assert bucket_quantile(0.99, {1.0: 5.0, 2.0: 6.0, INF: 10.0}) == 2.0


def test_quantile_unknown_where_promql_says_nan() -> None:
    """No request, no +Inf bucket, a single bucket: None (PromQL's NaN)."""
    assert bucket_quantile(0.5, {0.1: 0.0, INF: 0.0}) is None
    assert bucket_quantile(0.5, {0.1: 3.0, 0.2: 4.0}) is None
    assert bucket_quantile(0.5, {INF: 4.0}) is None


def test_quantile_non_monotonic_buckets_are_raised() -> None:
    """A bucket below the one before it (a restart between scrapes) counts as the one before, as PromQL."""
    assert bucket_quantile(0.5, {0.1: 4.0, 0.2: 2.0, 0.4: 8.0, INF: 8.0}) == pytest.approx(0.1)


def test_scraped_histograms_give_quantiles_per_server_and_rank() -> None:
    """0.5.23: TTFT/ITL/E2E (tokenizer side, no rank labels) on the server, queue time on its scheduler rank;
    the window holds the requests since the first scrape (the first is a baseline)."""
    later = scaled(REAL, "sglang:time_to_first_token_seconds", 3.0)
    later = scaled(later, "sglang:queue_time_seconds", 3.0)
    sig = window_signals([REAL, later])
    server, rank = sig[Rank()], sig[Rank(pp=0)]
    # TTFT deltas double the first scrape's buckets: 40 requests, 2,4,8,8,8,8,2 per bucket of 0.1..2.0
    assert server["ttft_requests"] == 40.0
    assert server["ttft_p50_seconds"] == pytest.approx(0.55)
    assert server["ttft_p95_seconds"] == pytest.approx(1.0)
    assert server["ttft_p99_seconds"] == pytest.approx(1.8)
    assert server["itl_requests"] == 0.0 and server["itl_p95_seconds"] is None  # no new request: unknown
    assert rank["queue_time_requests"] == 10.0
    assert rank["queue_time_p50_seconds"] == pytest.approx(1.5)
    assert "queue_time_requests" not in server or server["queue_time_requests"] is None


def test_log_only_rank_has_no_latency() -> None:
    """Without SGLang's histograms the latency signals are unknown (None), not zero."""
    sig = window_signals([REAL.replace("time_to_first_token", "x").replace("queue_time", "y")
                          .replace("inter_token", "z").replace("e2e_request", "w")] * 2)
    for values in sig.values():
        assert all(values.get(name) is None for name in LATENCY_SIGNALS)
        assert values.get("ttft_requests") is None


def test_ray_and_old_spellings_read_the_same() -> None:
    """Ray Serve's `ray_sglang_*` (with its ReplicaId) and 0.3.6-0.4.4's `time_per_output_token_seconds`."""
    ray = REAL.replace("sglang:", "ray_sglang_").replace('engine_type="unified"', 'ReplicaId="r1",engine_type="unified"')
    sig = window_signals([ray, scaled(ray, "ray_sglang_time_to_first_token_seconds", 3.0)])
    mine = window_signals([REAL, scaled(REAL, "sglang:time_to_first_token_seconds", 3.0)])
    assert sig[Rank(dp=0)]["ttft_p95_seconds"] == mine[Rank()]["ttft_p95_seconds"]
    old = REAL.replace("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
    sig = window_signals([old, scaled(old, "sglang:time_per_output_token_seconds", 2.0)])
    assert sig[Rank()]["itl_p95_seconds"] == window_signals(
        [REAL, scaled(REAL, "sglang:inter_token_latency_seconds", 2.0)])[Rank()]["itl_p95_seconds"]


def test_restart_counts_the_new_process_requests() -> None:
    """A bucket going backwards is a restart: everything the new process counted is new."""
    later = scaled(REAL, "sglang:time_to_first_token_seconds", 0.5)
    sig = window_signals([REAL, later])
    assert sig[Rank()]["ttft_requests"] == 10.0


def test_old_buckets_leave_the_window() -> None:
    """Requests scraped more than a window ago no longer count."""
    interp, w = ScrapeInterpreter(), Window(60.0)
    texts = [REAL, scaled(REAL, "sglang:time_to_first_token_seconds", 2.0)]
    for i, text in enumerate(texts):
        for o in interp.interpret(parse_exposition(text), 1000.0 + i * 15).observations:
            w.add(o)
    assert w.signals(1020.0)[Rank()]["ttft_requests"] == 20.0
    assert w.signals(1090.0)[Rank()]["ttft_requests"] is None


def test_latency_quantiles_export_in_seconds() -> None:
    """On /metrics: sglang_tuning_signal_seconds{signal="ttft_p95"}."""
    assert SIGNAL_UNITS["ttft_p95_seconds"] == ("signal_seconds", "ttft_p95", 1.0)
    assert SIGNAL_UNITS["queue_time_p99_seconds"] == ("signal_seconds", "queue_time_p99", 1.0)
