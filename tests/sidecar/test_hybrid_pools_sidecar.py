"""Issue 22 without the log: a sidecar that only scrapes SGLang 0.5.23's /metrics of a hybrid (mamba) model reads
the per-pool gauges as the log's Decode lines (mamba_pool_full judged, not unknown); with the log too, each
batch is counted once (docs/signals.md, "Hybrid pools")."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable

from helpers.paths import FIXTURES
from helpers.recorded_sglang import recorded_sglang
from helpers.runners import serve_args
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.sidecar.engine import Sidecar
from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for
from sglang_tuning_exporter.sidecar.serveconfig import build_config
from sglang_tuning_exporter.sources.logreader import EventReader

HYBRID = (FIXTURES / "metrics" / "sglang-0.5.23-metrics-hybrid-mamba.txt").read_text()  # mamba 0.98, full 0.35
SERVER_INFO = (FIXTURES / "sglang-0.5.23-server_info-toplevel.json").read_bytes()
T0 = float(calendar.timegm((2026, 11, 28, 10, 0, 0)))
POOL_SIGNALS = ("pool_samples", "mamba_bound_ratio", "full_usage_mean", "mamba_cache_size_seen", "swa_bound_ratio")


class _Lines:
    """A followed log whose lines are all there at the first poll."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.rotations, self.truncations, self.exists = lines, 0, 0, True

    def poll(self) -> list[str]:
        out, self.lines = self.lines, []
        return out


def _decode_lines(n: int, bound: int) -> list[str]:
    """n Decode lines 2 s apart from T0; the mamba pool binds (0.98, 40 waiting) in the first `bound`."""
    out = []
    for i in range(n):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + 2 * i))
        num, usage = (196, 0.98) if i < bound else (100, 0.50)
        out.append(f"[{stamp}] Decode batch, #running-req: 187, #full token: 60000, full token usage: 0.35, "
                   f"mamba num: {num}, mamba usage: {usage:.2f}, cuda graph: True, gen throughput (token/s): "
                   f"310.00, #queue-req: 40")
    return out


def _run(*, log: list[str] | None, metrics: bool, ticks: int = 13) -> Sidecar:
    argv = ["--sglang.scrape-interval", "15s", "--evaluation-interval", "15s"]
    http: Callable[[str, float], bytes] | None = None
    log_input = None
    if metrics:
        argv += ["--sglang.url", "http://127.0.0.1:30000"]
        http = recorded_sglang([HYBRID], SERVER_INFO)
    if log is not None:
        argv += ["--sglang.log-file", "/nonexistent/sglang.log", "--from-start"]
        log_input = log_input_for(_Lines(log), EventReader())
    sc = build_sidecar(build_config(serve_args(*argv)), timer=lambda: 0.0, http_get=http, log_input=log_input)
    for i in range(ticks):
        sc.tick(T0 + 15.0 * i)
    return sc


def _status(sc: Sidecar, check: str) -> set[str]:
    return {f.status for f in sc.state._findings if f.check == check}


def _pools(sc: Sidecar) -> dict[Rank, dict[str, float | None]]:
    return {r: {n: s.get(n) for n in POOL_SIGNALS} for r, s in sc.state._signals.items()}


def test_metrics_only_sidecar_judges_the_mamba_pool() -> None:
    """13 scrapes of a mamba pool at 0.98 with the full pool at 0.35 and 412 waiting: the state pool binds in
    every sample; the pool's size is what used / usage says (196 / 0.98); no SWA pool, so its check stays
    unknown as on the log."""
    sc = _run(log=None, metrics=True)
    (signals,) = _pools(sc).values()
    assert signals == {"pool_samples": 13.0, "mamba_bound_ratio": 1.0, "full_usage_mean": 0.35,
                       "mamba_cache_size_seen": 200.0, "swa_bound_ratio": None}
    assert _status(sc, "mamba_pool_full") == {"warning"}
    assert _status(sc, "swa_pool_full") == {"unknown"}


def test_log_and_metrics_count_each_batch_once() -> None:
    """The same server read from its log (90 Decode lines, the pool binding in 30) and its /metrics (binding in
    every scrape): the pool signals are the log's alone, as a log-only sidecar reads them."""
    lines = _decode_lines(90, bound=30)
    both, log_only = _run(log=lines, metrics=True), _run(log=lines, metrics=False)
    assert _pools(log_only) == {Rank(): {"pool_samples": 90.0, "mamba_bound_ratio": 1 / 3, "full_usage_mean": 0.35,
                                         "mamba_cache_size_seen": 200.0, "swa_bound_ratio": None}}
    assert _pools(both) == _pools(log_only)
    assert _status(both, "mamba_pool_full") == _status(log_only, "mamba_pool_full") == {"ok"}
