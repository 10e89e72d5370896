"""What the fleet report reads from SGLang's own metrics beyond fleet/queries.plan's gauges and counters: the
latency quantiles from SGLang's histograms, and the hybrid-pool checks from SGLang's pool gauges through the
checks' own native expressions (guide/checks.yaml `promql.sglang`, the source of the native alert rules).

One query each, whatever the fleet size; every series carries a `signal` label (its docs/signals.md name) and
loses to the sidecar's windowed signals of the same instance and rank (queries.collect), so a server seen only
through SGLang's /metrics gets its latency columns, latency checks, change-verdict latency guard and pool checks.
"""

from __future__ import annotations

import functools

from sglang_tuning_exporter.core.catalog import LATENCIES, LATENCY_HISTOGRAMS
from sglang_tuning_exporter.fleet.promql import (
    GROUP,
    SGLANG_SPELLINGS,
    PlannedQuery,
    Window,
    duration,
    series,
    sources,
)
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.native import fill, respell

# SGLang's names as servers expose them; Ray Serve's `ray_sglang_` (0.5.15+) too (render/expressions.SPELLINGS).
SPELLINGS = (*SGLANG_SPELLINGS, "ray_sglang_")
# Labels that split a histogram's events (summed); the TP/EP ranks of a replica repeat them (folded with max).
EVENT_SPLITS = "is_streaming, pid, ReplicaId"
# The quantiles read: every latency's p95 (the report's columns, the change verdicts' guard, the checks) and
# the medians latency_queue_dominates compares (queue_time_share, its guard).
QUANTILES = (*((lat, 95) for lat in LATENCIES), ("queue_time", 50), ("e2e", 50))
POOL_CHECKS = {"mamba_bound_ratio": "mamba_pool_full", "swa_bound_ratio": "swa_pool_full"}
LATENCY_KEY, POOLS_KEY = "native_latency", "native_pools"
KEYS = (LATENCY_KEY, POOLS_KEY)


def _tag(expr: str, signal: str) -> str:
    return f'label_replace({expr}, "signal", "{signal}", "", "")'


def _fold(expr: str, keep: str = "") -> str:
    """TP/EP ranks folded with max, the labels that split events summed (docs/signals.md)."""
    by = f"{keep}, {GROUP}" if keep else GROUP
    return f"sum by ({by}) (max by ({by}, {EVENT_SPLITS}) ({expr}))"


def _families(lat: str) -> list[str]:
    return [p + name for name, which in LATENCY_HISTOGRAMS.items() if which == lat for p in SPELLINGS]


def latency_query(w: Window) -> PlannedQuery:
    """Quantiles (`<lat>_p95_seconds`, ...), request counts (`<lat>_requests`) and the new prefill tokens
    (`prefill_tokens`) per replica over the range: `histogram_quantile(q, rate(<histogram>_bucket[range]))` over
    every release's name and spelling, the first that has the instance winning."""
    sel, r = w.selector, duration(w.length_s)
    parts = []
    for lat, pct in QUANTILES:
        buckets = sources(*[_fold(f"rate({series(m + '_bucket', sel)}[{r}])", "le") for m in _families(lat)])
        parts.append(_tag(f"histogram_quantile({pct / 100:g}, {buckets})", f"{lat}_p{pct}_seconds"))
    for lat in LATENCIES:
        parts.append(_tag(sources(*[_fold(f"increase({series(m + '_count', sel)}[{r}])") for m in _families(lat)]),
                          f"{lat}_requests"))
    # 0.5.7+: new (not cached) prompt tokens; the per-request figure ttft_long_prompts reads is derived from it.
    prefill = [series(p + "realtime_tokens_total", sel, 'mode="prefill_compute"') for p in SPELLINGS]
    parts.append(_tag(sources(*[f"max by ({GROUP}) (increase({c}[{r}]))" for c in prefill]), "prefill_tokens"))
    return PlannedQuery(LATENCY_KEY, sources(*parts))


@functools.cache
def _pool_templates() -> dict[str, str]:
    by_id = {c.id: c for c in load_table().checks}
    return {signal: str(by_id[check].promql["sglang"]) for signal, check in POOL_CHECKS.items()}


def pools_query(w: Window) -> PlannedQuery:
    """The hybrid-pool signals per replica over the range: `mamba_bound_ratio` and `swa_bound_ratio` by the
    native rules' expressions (the range for their window, the report's resolution for their subquery), with
    `pool_samples`, `full_usage_mean` and `swa_usage_mean`. SGLang exports the pool gauges at 0 on a model
    without the pool: as for the sidecar (sources/scrape), a pool counts where its usage or slots rose above 0
    within the range, else its signals stay unknown."""
    sel, r, step = w.selector, duration(w.length_s), duration(w.step_s)

    def scoped(braces: str | None) -> str | None:
        inner = ",".join(p for p in ((braces or "{}")[1:-1].strip(), sel) if p)
        return "{" + inner + "}" if inner else None

    def shown(*gauges: str) -> str:
        return f"max by ({GROUP}) (" + " or ".join(f"(max_over_time(sglang:{g}[{r}]) > 0)" for g in gauges) + ")"

    per_spelling = []
    for sp in SPELLINGS:
        def native(expr: str, sp: str = sp) -> str:
            return respell(expr, sp, scoped)

        swa = native(shown("swa_token_usage", "swa_used_tokens", "swa_available_tokens"))
        pool = native(shown("swa_token_usage", "swa_used_tokens", "swa_available_tokens", "mamba_usage",
                            "mamba_used_tokens", "mamba_available_tokens"))
        signals = []
        for signal, template in _pool_templates().items():
            expr = fill(template, window=r, band=("", ""), min_samples="", guard=None).replace(f"[{r}:]", f"[{r}:{step}]")
            signals.append(_tag(f"max by ({GROUP}) ({native(expr)}) and on ({GROUP}) "
                                f"({swa if signal == 'swa_bound_ratio' else pool})", signal))
        for signal, expr, gate in (
                ("pool_samples", f"max by ({GROUP}) (count_over_time(sglang:num_queue_reqs[{r}]))", pool),
                ("full_usage_mean", f"max by ({GROUP}) (avg_over_time(sglang:full_token_usage[{r}]))", pool),
                ("swa_usage_mean", f"max by ({GROUP}) (avg_over_time(sglang:swa_token_usage[{r}]))", swa)):
            signals.append(_tag(f"{native(expr)} and on ({GROUP}) ({gate})", signal))
        per_spelling.append(sources(*signals))
    return PlannedQuery(POOLS_KEY, sources(*per_spelling))


def queries(w: Window) -> list[PlannedQuery]:
    """The native path's queries of one report (or one slice plan of the change verdicts)."""
    return [latency_query(w), pools_query(w)]
