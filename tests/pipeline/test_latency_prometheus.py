"""The window's latency quantiles equal a real Prometheus' `histogram_quantile` over the same scraped
histograms (docs/signals.md, latency rows): a recorded 0.5.23 /metrics sequence with TTFT rising."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

from helpers.paths import FIXTURES
from helpers.tsdb import backfilled_prometheus
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.pipeline.window import Window
from sglang_tuning_exporter.sources.scrape import ScrapeInterpreter, parse_exposition, wanted

pytestmark = pytest.mark.integration

REAL = (FIXTURES / "metrics" / "sglang-0.5.23-metrics.txt").read_text()
T0 = 1_790_000_000.0
STEP = 15.0
SCRAPES = 21  # 5 minutes
_BUCKET = re.compile(r"^(sglang:(?:time_to_first_token|inter_token_latency|e2e_request_latency|queue_time)"
                     r"_seconds_bucket)(\{[^}]*\}) (\S+)$")


def scrape(i: int) -> str:
    """Scrape i: each bucket grows by a multiple of its first count; TTFT also gains more and more requests
    slower than 2 s (TTFT rising; added to every cumulative bucket from 2 s up, so they stay monotonic)."""
    def grow(m: re.Match[str]) -> str:
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        le = float(re.search(r'le="([^"]+)"', labels).group(1))  # type: ignore[union-attr]
        slow = 3 * i * i if "first_token" in name and le >= 2.0 else 0
        return f"{name}{labels} {value * (1 + i) + slow}"
    return "\n".join(_BUCKET.sub(grow, line) for line in REAL.splitlines()) + "\n"


def write_openmetrics(folder: Path) -> list[Path]:
    series: dict[str, list[tuple[float, str]]] = {}
    for i in range(SCRAPES):
        for line in scrape(i).splitlines():
            m = _BUCKET.match(line)
            if m:
                series.setdefault(f"{m.group(1)}{m.group(2)}", []).append((T0 + i * STEP, m.group(3)))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "latency.om"
    with out.open("w") as f:
        for head, points in series.items():
            for t, v in points:
                f.write(f"{head} {v} {t:.0f}\n")
        f.write("# EOF\n")
    return [out]


def sidecar_signals() -> dict[Rank, dict[str, float | None]]:
    interp, w = ScrapeInterpreter(), Window(600.0)
    for i in range(SCRAPES):
        for o in interp.interpret(parse_exposition(scrape(i), wanted), T0 + i * STEP).observations:
            w.add(o)
    return w.signals(T0 + (SCRAPES - 1) * STEP)


def test_window_quantiles_equal_histogram_quantile(tmp_path: Path) -> None:
    """Every latency quantile of the window = PromQL's histogram_quantile over the window's bucket deltas."""
    sig = sidecar_signals()
    end = T0 + (SCRAPES - 1) * STEP
    span = int((SCRAPES - 1) * STEP)
    families = {"ttft": "time_to_first_token", "itl": "inter_token_latency", "e2e": "e2e_request_latency",
                "queue_time": "queue_time"}
    with backfilled_prometheus(write_openmetrics, tmp_path) as url:
        compared = 0
        for latency, family in families.items():
            metric = f'{{__name__="sglang:{family}_seconds_bucket"}}'
            rank = Rank(pp=0) if latency == "queue_time" else Rank()
            for pct in (50, 95, 99):
                q = (f"histogram_quantile({pct / 100}, sum by (le) ({metric} - {metric} offset {span}s))")
                r = requests.get(f"{url}/api/v1/query", params={"query": q, "time": end}, timeout=30).json()
                promql = float(r["data"]["result"][0]["value"][1])
                mine = sig[rank][f"{latency}_p{pct}_seconds"]
                assert mine == pytest.approx(promql, rel=1e-9), (latency, pct, mine, promql)
                compared += 1
        assert compared == 12
    # TTFT rose: the window's p95 is past the first scrape's
    assert sig[Rank()]["ttft_p95_seconds"] is not None and sig[Rank()]["ttft_p95_seconds"] > 1.0
