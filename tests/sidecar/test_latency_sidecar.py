"""Issue 25 in the sidecar: a recorded 0.5.23 /metrics sequence with rising TTFT makes the sidecar export the
latency quantiles (sglang_tuning_signal_seconds), equal to the window's over the same scrapes."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.paths import FIXTURES
from helpers.recorded_sglang import recorded_sglang
from helpers.runners import serve_args
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.pipeline.window import Window
from sglang_tuning_exporter.sidecar.serve import build_sidecar, make_web
from sglang_tuning_exporter.sidecar.serveconfig import build_config
from sglang_tuning_exporter.sources.scrape import ScrapeInterpreter, parse_exposition, wanted

REAL = (FIXTURES / "metrics" / "sglang-0.5.23-metrics.txt").read_text()
SERVER_INFO = (FIXTURES / "sglang-0.5.23-server_info-toplevel.json").read_bytes()
T0 = 1_790_208_000.0
SCRAPES = 6


def scrape(i: int) -> str:
    """Scrape i: TTFT gains 20 i^2 requests slower than 2 s (every cumulative bucket from 2 s up, +Inf too),
    every bucket also grows x(1+i)."""
    def grow(m: re.Match[str]) -> str:
        slow = 20 * i * i if "first_token" in m.group(1) and float(m.group(2)) > 2.0 else 0
        return f"{m.group(1)}{m.group(2)}{m.group(3)} {float(m.group(4)) * (1 + i) + slow}"
    return re.sub(r'^(sglang:\w+_seconds_bucket\{.*le=")([^"]+)(".*\}) (\S+)$', grow, REAL, flags=re.M)


def test_sidecar_exports_the_window_quantiles_of_rising_ttft() -> None:
    cfg = build_config(serve_args("--sglang.url", "http://127.0.0.1:30000", "--sglang.scrape-interval", "15s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=recorded_sglang([scrape(i) for i in range(SCRAPES)], SERVER_INFO))
    for i in range(SCRAPES):
        sc.tick(T0 + i * 15.0)
    body = make_web(cfg, sc, clock=lambda: T0 + (SCRAPES - 1) * 15.0,
                    process_metrics=False).handle("GET", "/metrics").body.decode()
    exported: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(body):
        if fam.name == "sglang_tuning_signal_seconds":
            for s in fam.samples:
                exported[(s.labels["signal"], s.labels["pp_rank"])] = s.value
    interp, w = ScrapeInterpreter(), Window(600.0)
    for i in range(SCRAPES):
        for o in interp.interpret(parse_exposition(scrape(i), wanted), T0 + i * 15.0).observations:
            w.add(o)
    mine = w.signals(T0 + (SCRAPES - 1) * 15.0)[Rank()]
    assert mine["ttft_p95_seconds"] is not None and mine["ttft_p95_seconds"] > 2.0  # TTFT rose past 2 s
    for name in ("ttft_p50", "ttft_p95", "ttft_p99", "itl_p95", "e2e_p95"):
        assert exported[(name, "")] == pytest.approx(mine[f"{name}_seconds"]), name
    # queue time comes from the scheduler's histogram (tp_rank 0), on the server's single series here
    assert {name for name, _ in exported} >= {"queue_time_p50", "queue_time_p95", "queue_time_p99"}
