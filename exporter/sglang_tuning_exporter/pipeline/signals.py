"""Guide signals over a sliding window of observations, per rank (see docs/signals.md).

Pure: time is whatever the observations and the caller's `now` say.  A signal is `None`
(unknown) when the window holds too few samples to judge it; the window itself is pipeline/window.py,
its aggregates pipeline/stats.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_tuning_exporter.core.catalog import LATENCIES, LATENCY_PERCENTILES, OOM_PHASES, SIGNAL_NAMES
from sglang_tuning_exporter.core.events import counted
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.pipeline.stats import (
    Bucket,
    SampleStats,
    bucket_quantile,
    hist_at_least,
    hist_max,
    hist_pairs,
    hist_quantile,
)

# Per-sample values of a Decode line (or a scrape); observations of one line share a time.
SAMPLE_NAMES = frozenset({"num_queue_reqs", "num_running_reqs", "token_usage", "gen_throughput",
                          "num_used_tokens", "cuda_graph"})
# The same values from a Prefill line: used only for ranks without Decode samples (PD prefill nodes).
PREFILL_SAMPLE_NAMES = {"prefill_num_queue_reqs": "num_queue_reqs",
                        "prefill_num_running_reqs": "num_running_reqs",
                        "prefill_token_usage": "token_usage"}
# Sums of a hybrid model's Decode lines (observations.pool_pairs): Bucket.pools by name.
POOL_EVENT_NAMES = frozenset({"pool_samples", "full_samples", "full_usage_sum", "swa_samples", "swa_usage_sum", "mamba_bound",
                              "swa_bound", "mamba_num_sum", "mamba_usage_sum"})
# The same sums from scrapes (observations.scraped_pool_pairs) are kept apart under this prefix: a rank's
# window reads its log's sums when it holds any, else its scrapes' (one sample counted once).
SCRAPED_POOL = "scraped:"
# The observations of the counted event kinds (core/events.Count): Bucket.counts by name, each one's rate
# `<name>_per_minute`.
COUNT_NAMES = tuple(spec.count.name for spec in counted() if spec.count is not None)
# One observation = one thing that happened (value = its size).
EVENT_NAMES = frozenset({"retraction", *(f"oom_{p}" for p in OOM_PHASES), "prefill_new_tokens",
                         "prefill_cached_tokens", "decode_cuda_graph_passes", "decode_eager_passes",
                         "cuda_graph_disabled_steps", *POOL_EVENT_NAMES, *COUNT_NAMES})
# Facts stated once (startup lines, server info): kept until the next startup, not windowed.
FACT_NAMES = frozenset({"available_gpu_mem_gb", "avail_mem_after_pool_gb", "gpu_mem_total_gb", "weights_gb",
                        "max_total_num_tokens", "max_running_requests", "cuda_graph_max_bs_captured",
                        "chunked_prefill_size", "context_len", "metrics_enabled", "avail_after_weights_gb",
                        "kv_cache_gb", "cuda_graph_gb", "oom_gpu_free_gb", "cuda_graph_off",
                        "chunked_prefill_off", "mem_fraction_floor",
                        # what limits running requests besides --max-running-requests (SGLang 0.5.2x)
                        "mamba_running_cap", "mamba_cache_size", "mamba_slots_per_request", "max_running_requested",
                        "max_running_default", "kv_pool_tokens", "full_pool_tokens", "swa_pool_tokens"})
SERVER_START = "server_start"  # a `server_args` line: the observation that resets startup facts
# Facts that differ between TP ranks of one replica: keep the worst when folding TP ranks.
FACTS_KEPT_MIN = frozenset({"available_gpu_mem_gb", "avail_mem_after_pool_gb", "gpu_mem_total_gb",
                       "avail_after_weights_gb", "oom_gpu_free_gb"})
FACTS_KEPT_MAX = frozenset({"weights_gb"})

# Latency quantiles from SGLang's histograms (scrape only): `<latency>_p<q>_seconds`, and the requests behind
# them, `<latency>_requests` (the window's +Inf bucket delta).
LATENCY_QUANTILES = tuple((pct, pct / 100) for pct in LATENCY_PERCENTILES)
LATENCY_SIGNALS = tuple(f"{lat}_p{pct}_seconds" for lat in LATENCIES for pct, _ in LATENCY_QUANTILES)
LATENCY_COUNTS = tuple(f"{lat}_requests" for lat in LATENCIES)


@dataclass(frozen=True, slots=True)
class SignalParams:
    """Thresholds that shape the signals themselves (from the guide profile and config)."""

    queue_band: tuple[float, float] = (100.0, 2000.0)
    usage_good: float = 0.9  # the guide's `token usage > 0.9 means good utilization`
    capped_fraction: float = 0.95  # running >= 95 % of max_running_requests counts as capped
    min_samples: int = 3  # below this a windowed ratio is unknown


# Too few samples to judge, but worth showing (the advisor's "indications"): these keys carry the
# same signals computed on the samples there are, plus the extremes of those samples. Never exported.
FEW = "few:"


def few_sample_signals(s: SampleStats, p: SignalParams) -> dict[str, float]:
    """Signals of a rank that has some samples but fewer than `p.min_samples` (pure)."""
    out: dict[str, float] = {}
    if s.queue_n:
        out[FEW + "queue_samples"] = float(s.queue_n)
        out[FEW + "queue_over_band_ratio"] = s.queue_over / s.queue_n
        out[FEW + "queue_empty_ratio"] = s.queue_zero / s.queue_n
        out[FEW + "queue_min"] = float(min(k for k, _ in hist_pairs(s.queue)))
        out[FEW + "queue_max"] = float(hist_max(s.queue))
    if s.kv_n:
        out[FEW + "kv_samples"] = float(s.kv_n)
        out[FEW + "kv_underused_ratio"] = s.kv_under / s.kv_n
        out[FEW + "token_usage_max"] = s.usage_max
    if s.running_n:
        out[FEW + "decode_samples"] = float(s.running_n)
        out[FEW + "running_min"] = float(min(k for k, _ in hist_pairs(s.running)))
        out[FEW + "running_max"] = float(hist_max(s.running))
    if s.graph_n:
        out[FEW + "graph_samples"] = float(s.graph_n)
        out[FEW + "cuda_graph_miss_ratio"] = s.graph_miss / s.graph_n
    return out


def share_server_latency(by_rank: dict[Rank, dict[str, float | None]]) -> None:
    """TTFT, ITL and E2E are measured by the tokenizer (no scheduler rank): each scheduler rank takes its
    server's (or its Ray replica's) where it has none, then the signals that combine latency with the
    rank's own batch and queue are derived (in place)."""
    for rank, sig in by_rank.items():
        for server in (Rank(dp=rank.dp), Rank()):
            src = by_rank.get(server)
            if src is None or server == rank:
                continue
            for name in (*LATENCY_SIGNALS, *LATENCY_COUNTS):
                if sig.get(name) is None and src.get(name) is not None:
                    sig[name] = src[name]
        queue, e2e = sig.get("queue_time_p50_seconds"), sig.get("e2e_p50_seconds")
        if queue is not None and e2e:
            sig["queue_time_share"] = min(1.0, queue / e2e)
        tokens, requests = sig.get("prefill_tokens"), sig.get("ttft_requests")
        if tokens is not None and requests:
            sig["prefill_tokens_per_request"] = tokens / requests
        batch, waiting = sig.get("decode_batch_p90"), sig.get("queue_p50")
        if batch and waiting:
            sig["servers_for_queue"] = float(math.ceil((batch + waiting) / batch))


def compute_signals(total: Bucket, facts: dict[str, float], p: SignalParams, *, span_s: float,
                    from_log: bool) -> dict[str, float | None]:
    """The signals of one rank from its merged window bucket and its startup facts (pure)."""
    out: dict[str, float | None] = dict.fromkeys(SIGNAL_NAMES)
    out["window_span_s"] = span_s  # what the rates and ratios cover (the evidence says it; min_span_s)
    enough = p.min_samples
    # A prefill-only rank (PD prefill node, v0.1 logs) is judged from its Prefill lines.
    s = total.decode if (total.decode.queue_n or total.decode.running_n) else total.prefill
    out["queue_samples"] = float(s.queue_n)
    out["decode_samples"] = float(s.running_n)
    out["kv_samples"] = float(s.kv_n)
    if any(0 < n < enough for n in (s.queue_n, s.kv_n, s.running_n, s.graph_n)):
        out.update(few_sample_signals(s, p))
    if s.queue_n >= enough:
        nq = s.queue_n
        out["queue_empty_ratio"] = s.queue_zero / nq
        out["queue_over_band_ratio"] = s.queue_over / nq
        out["queue_under_band_ratio"] = s.queue_under / nq
        out["queue_p50"] = hist_quantile(s.queue, 0.5)
    if s.kv_n >= enough:
        out["kv_underused_ratio"] = s.kv_under / s.kv_n
        out["token_usage_max"] = s.usage_max
        out["token_usage_mean"] = round(s.usage_sum / s.kv_n, 4)  # merge order must not show
    if s.running_n >= enough:
        out["decode_batch_p90"] = hist_quantile(s.running, 0.9)
        out["running_max"] = float(hist_max(s.running))
    if s.tp_n:
        out["gen_throughput_mean"] = round(s.tp_sum / s.tp_n, 2)
    cap = facts.get("max_running_requests")
    if cap and s.capped_base >= enough:
        floor = p.capped_fraction * cap
        capped = hist_at_least(s.capped_cand, floor)  # running >= floor
        out["running_capped_ratio"] = capped / s.capped_base
    # CUDA graph coverage: exact counters (scrape) win over sampled Decode lines.
    passes, eager = total.graph_passes, total.eager_passes
    if passes + eager > 0:
        out["graph_samples"] = passes + eager
        out["cuda_graph_miss_ratio"] = eager / (passes + eager)
    else:
        out["graph_samples"] = float(s.graph_n)
        if s.graph_n >= enough:
            out["cuda_graph_miss_ratio"] = s.graph_miss / s.graph_n
    if s.missed:
        out["cuda_graph_miss_batch_p90"] = hist_quantile(s.missed, 0.9)
    if total.disabled_steps:
        out["cuda_graph_disabled_steps"] = total.disabled_steps
    out["prefill_samples"] = float(total.prefill_n)
    new, cached = total.prefill_new, total.prefill_cached
    if total.prefill_n >= enough and new + cached > 0:
        out["prefix_cache_hit_ratio"] = cached / (new + cached)
    if total.prefill_n:
        out["prefill_tokens"] = new
    if total.is_active():
        minutes = max(1.0, span_s / 60.0)
        out["retractions_per_minute"] = total.retractions / minutes
        out["retracted_requests_per_minute"] = total.retracted / minutes
        for name in COUNT_NAMES:
            out[f"{name}_per_minute"] = total.counts.get(name, 0.0) / minutes
    for lat, buckets in total.latency.items():
        # Unknown (absent) when SGLang does not export the histogram: a log-only rank, an older release.
        n = buckets.get(float("inf"), 0.0)
        out[f"{lat}_requests"] = n
        if n >= enough:
            for pct, q in LATENCY_QUANTILES:
                out[f"{lat}_p{pct}_seconds"] = bucket_quantile(q, buckets)
    if from_log:
        # OOMs are only observable from the log; metrics-only ranks leave them unknown.
        for phase in OOM_PHASES:
            out[f"oom_{phase}_count"] = float(total.oom.get(f"oom_{phase}", 0))
    for name in ("gpu_mem_total_gb", "weights_gb", "max_total_num_tokens", "max_running_requests",
                 "cuda_graph_max_bs_captured", "chunked_prefill_size", "context_len", "metrics_enabled",
                 "kv_cache_gb", "cuda_graph_gb", "oom_gpu_free_gb", "cuda_graph_off", "chunked_prefill_off",
                 "mem_fraction_floor"):
        out[name] = facts.get(name)
    if "available_gpu_mem_gb" in facts:
        out["available_gpu_mem_gb"] = facts["available_gpu_mem_gb"]
        out["available_gpu_mem_from_summary"] = 1.0
    elif "avail_mem_after_pool_gb" in facts:
        out["available_gpu_mem_gb"] = facts["avail_mem_after_pool_gb"]
        out["available_gpu_mem_from_summary"] = 0.0
    gpu, after_w, kv = facts.get("gpu_mem_total_gb"), facts.get("avail_after_weights_gb"), facts.get("kv_cache_gb")
    if gpu and after_w is not None and kv is not None and after_w >= kv:
        # SGLang sizes the KV pool as avail_after_weights - total * (1 - mem_fraction_static).
        out["mem_fraction_static_estimate"] = round(1.0 - (after_w - kv) / gpu, 3)
    captured = facts.get("cuda_graph_max_bs_captured")
    if captured is not None and cap:
        out["cuda_graph_ceiling_ratio"] = captured / cap
    _pool_signals(total, facts, cap, out, enough)
    return out


def _pool_signals(total: Bucket, facts: dict[str, float], cap: float | None, out: dict[str, float | None],
                  enough: int) -> None:
    """Which limit binds running requests: the hybrid pools' share of samples and SGLang's own caps."""
    pools = total.pools
    if not pools.get("pool_samples") and pools:
        pools = {k[len(SCRAPED_POOL):]: v for k, v in pools.items() if k.startswith(SCRAPED_POOL)}
    n = pools.get("pool_samples", 0.0)
    out["pool_samples"] = n
    if n >= enough:
        out["mamba_bound_ratio"] = pools.get("mamba_bound", 0.0) / n
        full_n = pools.get("full_samples", 0.0)
        if full_n:  # samples without the full pool's usage (scrapes before 0.5.10) leave it unknown, never 0
            out["full_usage_mean"] = round(pools.get("full_usage_sum", 0.0) / full_n, 4)
        swa_n = pools.get("swa_samples", 0.0)
        if swa_n:
            out["swa_bound_ratio"] = pools.get("swa_bound", 0.0) / swa_n
            out["swa_usage_mean"] = round(pools.get("swa_usage_sum", 0.0) / swa_n, 4)
    if pools.get("mamba_usage_sum"):
        # Rounded in two steps: sums merged in another order (diagnose's ranges) must give the same value.
        out["mamba_cache_size_seen"] = round(round(pools.get("mamba_num_sum", 0.0) / pools["mamba_usage_sum"], 6), 1)
    for name in ("mamba_running_cap", "mamba_cache_size", "mamba_slots_per_request", "max_running_requested",
                 "kv_pool_tokens", "swa_pool_tokens", "full_pool_tokens"):
        out[name] = facts.get(name)
    if cap:
        # Who set the cap in force: the mamba state pool, the KV pool's cut of the requested value, or SGLang's
        # own default (speculative decoding's 48, a model family's value); 0 = the cap the user set.
        mamba = facts.get("mamba_running_cap")
        out["running_cap_by_mamba"] = 1.0 if mamba is not None and cap >= mamba else 0.0
        requested = facts.get("max_running_requested")
        out["running_cap_by_kv"] = 1.0 if requested is not None and requested > cap and not (
            mamba is not None and cap >= mamba) else 0.0
        default = facts.get("max_running_default")
        out["running_cap_default"] = 1.0 if default is not None and default == cap else 0.0
    tokens, context = facts.get("kv_pool_tokens", facts.get("max_total_num_tokens")), facts.get("context_len")
    if tokens and context:
        out["kv_pool_context_ratio"] = round(tokens / context, 4)

