"""The one catalog of every metric sglang-tuning-exporter emits (name, type, help, labels).

The collector, the README table, the dashboard lint and the alert-rule tests all read this list.
Add a metric here first; nothing else may invent a `sglang_tuning_` name.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_tuning_exporter.core.events import counted

# The phases an OOM is filed under (pipeline/observations.oom_phase): one counter and one signal each.
OOM_PHASES = ("prefill", "decode", "startup", "unknown", "capture", "graph_decode", "graph_prefill")
# The latencies SGLang's histograms measure (sources/scrape.HISTOGRAMS): quantile signals and a seconds family.
LATENCIES = ("ttft", "itl", "e2e", "queue_time")
# SGLang's latency histograms (every release's name, without the `sglang:` prefix) -> the latency each measures.
LATENCY_HISTOGRAMS: dict[str, str] = {
    "time_to_first_token_seconds": "ttft",
    "inter_token_latency_seconds": "itl",
    "time_per_output_token_seconds": "itl",  # 0.3.6-0.4.4: the inter-token latency's first name
    "e2e_request_latency_seconds": "e2e",
    "queue_time_seconds": "queue_time",
    "queue_time_s": "queue_time",  # 0.5.2 only
}

PREFIX = "sglang_tuning_"
RANK_LABELS = ("model_name", "dp_rank", "pp_rank", "tp_rank", "moe_ep_rank")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family we expose."""

    name: str  # full name; counters include the `_total` suffix
    type: str  # gauge | counter | info
    help: str
    labels: tuple[str, ...] = ()


def _m(name: str, type_: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(PREFIX + name, type_, help_, labels)


CATALOG: tuple[MetricSpec, ...] = (
    # --- raw per-rank values from the latest Decode/Prefill line or SGLang scrape
    _m("queue_requests", "gauge", "Requests waiting in the scheduler queue (#queue-req) at the latest sample.", RANK_LABELS),
    _m("running_requests", "gauge", "Requests in the running batch (#running-req) at the latest sample.", RANK_LABELS),
    _m("token_usage_ratio", "gauge", "KV-cache token usage 0-1 (token usage) at the latest sample.", RANK_LABELS),
    _m("gen_throughput_tokens_per_second", "gauge", "Decode generation throughput at the latest sample.", RANK_LABELS),
    _m("decode_samples_total", "counter", "Decode samples seen (Decode batch lines or scrapes), by whether the batch ran in a CUDA graph (true|false|unknown).", (*RANK_LABELS, "cuda_graph")),
    _m("decode_batch_size_without_graph", "gauge", "90th percentile of decode batch sizes that ran without a CUDA graph in the window: the signal cuda_graph_miss_batch_p90, per replica (TP ranks folded); absent when none.", RANK_LABELS),
    _m("retractions_total", "counter", "Retraction events (KV cache pool is full / decode out of memory).", RANK_LABELS),
    _m("retracted_requests_total", "counter", "Requests retracted by retraction events.", RANK_LABELS),
    _m("prefill_tokens_total", "counter", "Prefill tokens by source: new (computed) or cached (prefix-cache hit).", (*RANK_LABELS, "source")),
    _m("oom_events_total", "counter", "Out-of-memory errors by phase (prefill|decode|startup|capture|unknown|graph_decode|graph_prefill; startup: the pool does not fit after the weights, capture: an allocation failed in the headroom before the first batch, graph_decode / graph_prefill: that CUDA graph failed to capture at start-up).", (*RANK_LABELS, "phase")),
    # --- raw counters of the counted event kinds (core/events.Count), one each: `<name>_total`
    *(_m(f"{spec.count.name}_total", "counter", spec.count.help, RANK_LABELS) for spec in counted()
      if spec.count is not None),
    # --- startup facts (log startup lines, server info, or SGLang constants)
    _m("available_gpu_memory_bytes", "gauge", "GPU memory left for activations after weights, KV cache and CUDA graphs at startup (available_gpu_mem).", RANK_LABELS),
    _m("gpu_memory_total_bytes", "gauge", "Estimated GPU memory capacity (from `Load weight begin. avail mem`).", RANK_LABELS),
    _m("max_total_tokens", "gauge", "KV-cache capacity in tokens (max_total_num_tokens).", RANK_LABELS),
    _m("max_running_requests", "gauge", "Effective max running requests reported at startup.", RANK_LABELS),
    _m("cuda_graph_max_batch_size", "gauge", "Largest decode batch size captured in a CUDA graph.", RANK_LABELS),
    # --- server configuration
    _m("server_arg", "gauge", "Numeric SGLang server argument (from server_args= or server info), one series per arg.", ("arg",)),
    _m("server_info", "info", "SGLang server facts: version, model, schedule policy.", ("version", "model_name", "schedule_policy")),
    # --- the guide, evaluated by the exporter
    # Signals by unit (SIGNAL_UNITS below says which family carries which signal, and how it is scaled).
    _m("signal_ratio", "gauge", "A guide signal that is a ratio (shares of samples 0-1, or a quotient such as cuda_graph_ceiling_ratio) over the exporter's window (docs/signals.md); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("signal_bytes", "gauge", "A guide signal that is an amount of GPU memory, in bytes (signal label without the `_gb` of docs/signals.md); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("signal_per_second", "gauge", "A guide signal that is an event rate over the exporter's window, per second (signal label without the `_per_minute` of docs/signals.md); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("signal_tokens_per_second", "gauge", "A guide signal that is a token throughput over the exporter's window (gen_throughput_mean); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("signal_seconds", "gauge", "A guide signal that is a latency in seconds: a quantile of SGLang's TTFT, inter-token, end-to-end or queue-time histogram over the exporter's window (signal label without the `_seconds` of docs/signals.md, e.g. ttft_p95); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("signal_amount", "gauge", "A guide signal that is a plain number: requests, batch size, tokens, samples or events in the window (the signal name says which); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("signal_flag", "gauge", "A yes/no guide fact: 1 yes, 0 no (metrics_enabled, available_gpu_mem_from_summary, running_cap_by_mamba, running_cap_by_kv, running_cap_default); absent when unknown.", (*RANK_LABELS, "signal")),
    _m("check_level", "gauge", "Current level of a guide check: -1 unknown, 0 ok, 1 warning, 2 critical (max over series = the worst).", (*RANK_LABELS, "check")),
    # --- deprecated: kept for one release (0.x -> removed in the next); docs/sidecar.md, "Deprecated metrics"
    _m("signal", "gauge", "DEPRECATED, removed in the next release: use sglang_tuning_signal_ratio, _bytes, _per_second, _tokens_per_second, _amount or _flag. A guide signal in its docs/signals.md unit (GB, per minute, ratio, count mixed).", (*RANK_LABELS, "signal")),
    _m("check_status", "gauge", "DEPRECATED, removed in the next release: use sglang_tuning_check_level. Current level of a check (-1 unknown, 0 ok, 1 warning, 2 critical); its `severity` label is the check's highest possible level, not the current one.", (*RANK_LABELS, "check", "severity")),
    _m("suggested_value", "gauge", "The value the exporter suggests for the flag of a firing check.", (*RANK_LABELS, "check", "flag")),
    _m("current_value", "gauge", "The current value of the flag a check names, when known.", (*RANK_LABELS, "check", "flag")),
    # --- flag changes and their verdicts (changes.py; /api/changes)
    _m("change_verdict", "gauge", "Verdict on the last change of a flag, as a state set: 1 for the verdict (improved|worse|no_change|inconclusive), 0 for the others.", ("flag", "verdict")),
    _m("change_info", "info", "The last change of a flag: the value before (from_value, the one to go back to) and after (to_value), and who told (log|server_info).", ("flag", "from_value", "to_value", "source")),
    # --- self health
    _m("up", "gauge", "1 if the last scrape of SGLang's /metrics succeeded, 0 if it failed; absent when the metrics source is not configured (log-only: see source_up)."),
    _m("source_up", "gauge", "1 if the source (log|metrics|server_info) worked at its last attempt.", ("source",)),
    _m("source_enabled", "gauge", "1 if the source is configured.", ("source",)),
    _m("source_failures_total", "counter", "Failed attempts to read a source, by reason (connection|timeout|http_status|too_large|invalid|internal for SGLang; not_found|permission_denied|read_error|closed|internal for the log).", ("source", "reason")),
    _m("input_truncations_total", "counter", "Input cut or skipped at a documented limit (docs/sidecar.md, Limits), by source and limit (line|label_value|samples|ranks|string|server_args|internal_states).", ("source", "limit")),
    _m("source_duration_seconds", "gauge", "Duration of the last read of the source.", ("source",)),
    _m("scrape_duration_seconds", "gauge", "Duration of the last scrape of SGLang's /metrics."),
    _m("log_lines_total", "counter", "Log lines read, by event kind (other = not an event).", ("kind",)),
    _m("log_unparsed_lines_total", "counter", "Lines with a recognised head that could not be parsed."),
    _m("log_implausible_times_total", "counter",
       "Log stamps implausible against their neighbours (cut-off, 1970, far off either way, ahead of the wall clock), taken at a neighbour's time."),
    _m("log_last_line_timestamp_seconds", "gauge", "Unix time at which the last log line was read."),
    _m("log_rotations_total", "counter", "Log rotations followed (new inode; rotated files in between counted too)."),
    _m("log_truncations_total", "counter", "Log truncations detected (size below read offset, or the bytes before it rewritten: copytruncate and regrowth)."),
    _m("log_unread_bytes_total", "counter", "Log bytes that could not be read: written before a truncation and found in no copy, or a partial line dropped at one."),
    _m("tracked_ranks", "gauge", "Ranks currently tracked."),
    _m("ranks_expired_total", "counter", "Ranks dropped because they were not seen within the expiry time."),
    _m("build_info", "info", "Exporter build facts: version, the git revision it was built from (unknown outside a git checkout) and the Python running it.", ("version", "revision", "python_version")),
    # --- sidecar source details (owner: sidecar)
    _m("sglang_restarts_total", "counter", "SGLang restarts detected (a counter going backwards, a new start time or version in server info)."),
    _m("scrape_garbage_lines_total", "counter", "Lines of SGLang's /metrics that were not valid exposition format (skipped)."),
    _m("log_oversized_lines_total", "counter", "Log lines longer than the reader's limit (1 MiB), cut to the limit and read on."),
    _m("scrape_samples", "gauge", "Samples read from SGLang's /metrics at the last successful scrape."),
    _m("sglang_endpoint_info", "info", "The server-info endpoint the running SGLang release answered (/server_info, /get_server_info or /get_server_args).", ("endpoint",)),
    _m("evaluation_timestamp_seconds", "gauge", "Unix time of the last evaluation of the guide checks."),
    _m("http_open_connections", "gauge", "Client connections our HTTP server holds open (at most --web.max-connections)."),
    _m("http_connections_closed_total", "counter", "Client connections our HTTP server closed itself, by reason: room (the longest-idle one, for a new one at --web.max-connections), header_timeout (TLS handshake or request head not complete within --web.header-timeout), idle_timeout (kept-alive without a new request for --web.idle-timeout), write_timeout (an answer not taken within --web.write-timeout).", ("reason",)),
    _m("http_requests_total", "counter", "Requests our HTTP server answered, by status code (429: basic-auth checks throttled, a flood of new credentials; 431: request head too large).", ("code",)),
)

DEPRECATED: dict[str, str] = {  # deprecated family -> what replaces it (one release of overlap)
    PREFIX + "signal": PREFIX + "signal_<unit>",
    PREFIX + "check_status": PREFIX + "check_level",
}

# Process metrics from prometheus_client's ProcessCollector and PlatformCollector (not ours to name).
PROCESS_METRICS = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                   "process_start_time_seconds", "process_open_fds", "process_max_fds", "python_info")

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOG}


GIB = float(1 << 30)  # SGLang's "GB" is get_available_gpu_memory() / 2**30
# Per-rank gauges: catalog short name -> (observation name, scale).
RANK_GAUGES: tuple[tuple[str, str, float], ...] = (
    ("queue_requests", "num_queue_reqs", 1.0),
    ("running_requests", "num_running_reqs", 1.0),
    ("token_usage_ratio", "token_usage", 1.0),
    ("gen_throughput_tokens_per_second", "gen_throughput", 1.0),
    ("available_gpu_memory_bytes", "available_gpu_mem_gb", GIB),
    ("gpu_memory_total_bytes", "gpu_mem_total_gb", GIB),
    ("max_total_tokens", "max_total_num_tokens", 1.0),
    ("max_running_requests", "max_running_requests", 1.0),
    ("cuda_graph_max_batch_size", "cuda_graph_max_bs_captured", 1.0),
)


@dataclass(frozen=True, slots=True)
class SignalUnit:
    """How one unit family of signals differs from docs/signals.md, where each signal's name says its unit."""

    docs_suffix: str = ""  # the docs' unit suffix, left out of the family's `signal` label ("_gb")
    scale: float = 1.0  # exported value = docs value x scale (GiB -> bytes, per minute -> per second)
    to_docs: str = ""  # the PromQL operation taking an exported value back to the docs' unit ("/ 2^30")
    shown_as: str = ""  # the docs' unit as a reader sees it ("GiB"); "" = the name says it already


# Unit family (catalog short name) -> its conversion; every signal lives in exactly one (SIGNAL_UNITS).
SIGNAL_FAMILY_UNITS: dict[str, SignalUnit] = {
    "signal_ratio": SignalUnit(),
    "signal_bytes": SignalUnit("_gb", GIB, "/ 2^30", "GiB"),
    "signal_per_second": SignalUnit("_per_minute", 1.0 / 60.0, "* 60", "/min"),
    "signal_tokens_per_second": SignalUnit(shown_as="tok/s"),
    "signal_seconds": SignalUnit("_seconds", shown_as="s"),
    "signal_amount": SignalUnit(),
    "signal_flag": SignalUnit(),
}
SIGNAL_FAMILIES = tuple(SIGNAL_FAMILY_UNITS)


@dataclass(frozen=True, slots=True)
class SignalDef:
    """One signal of docs/signals.md, declared once: everything else that lists signals derives from SIGNALS."""

    name: str
    family: str  # its unit family on /metrics (SIGNAL_FAMILY_UNITS): how it is exported and scaled
    samples: str | None = None  # the sample count that decides whether it is known (check.min_samples applies)
    worst: str = "max"  # across ranks the worst value is the highest ("max") or the lowest ("min")


def _defs(family: str, names: str, samples: str | None = None, worst: str = "max") -> tuple[SignalDef, ...]:
    return tuple(SignalDef(name, family, samples, worst) for name in names.split())


_R, _G, _M, _T, _S, _A, _F = SIGNAL_FAMILIES
LATENCY_PERCENTILES = (50, 95, 99)  # `<latency>_p<pct>_seconds`, from SGLang's histograms (scrape only)
# Every signal the window computes (pipeline/signals.compute_signals), in the order it lists them.
SIGNALS: tuple[SignalDef, ...] = (
    *_defs(_R, "queue_empty_ratio queue_over_band_ratio queue_under_band_ratio", "queue_samples"),
    *_defs(_A, "queue_p50", "queue_samples"),
    *_defs(_R, "kv_underused_ratio token_usage_max token_usage_mean", "kv_samples"),
    *_defs(_M, "retractions_per_minute retracted_requests_per_minute"),
    *_defs(_R, "cuda_graph_miss_ratio", "graph_samples"),
    *_defs(_A, "cuda_graph_miss_batch_p90", "graph_samples"),
    *_defs(_A, "decode_batch_p90 running_max", "decode_samples"),
    *_defs(_R, "running_capped_ratio", "decode_samples"),
    *_defs(_R, "prefix_cache_hit_ratio", "prefill_samples", worst="min"),
    *_defs(_A, " ".join(f"oom_{p}_count" for p in OOM_PHASES)),
    *_defs(_G, "available_gpu_mem_gb", worst="min"),
    *_defs(_F, "available_gpu_mem_from_summary"),
    *_defs(_G, "gpu_mem_total_gb", worst="min"),
    *_defs(_G, "weights_gb"),
    *_defs(_A, "max_total_num_tokens"),
    *_defs(_A, "max_running_requests cuda_graph_max_bs_captured", worst="min"),
    *_defs(_R, "cuda_graph_ceiling_ratio", worst="min"),
    *_defs(_A, "chunked_prefill_size context_len"),
    *_defs(_F, "metrics_enabled", worst="min"),
    *_defs(_T, "gen_throughput_mean"),
    *_defs(_G, "kv_cache_gb cuda_graph_gb"),
    *_defs(_G, "oom_gpu_free_gb", worst="min"),
    *_defs(_A, "cuda_graph_off chunked_prefill_off"),
    *_defs(_R, "mem_fraction_floor mem_fraction_static_estimate"),
    *_defs(_A, "cuda_graph_disabled_steps window_span_s"),
    *_defs(_R, "mamba_bound_ratio swa_bound_ratio full_usage_mean swa_usage_mean", "pool_samples"),
    *_defs(_F, "running_cap_by_mamba running_cap_by_kv running_cap_default"),
    *_defs(_A, "mamba_running_cap mamba_cache_size mamba_slots_per_request max_running_requested kv_pool_tokens"),
    *_defs(_R, "kv_pool_context_ratio"),
    *_defs(_A, "swa_pool_tokens full_pool_tokens mamba_cache_size_seen"),
    *_defs(_A, "decode_samples queue_samples kv_samples graph_samples prefill_samples pool_samples"),
    *(d for lat in LATENCIES
      for d in _defs(_S, " ".join(f"{lat}_p{pct}_seconds" for pct in LATENCY_PERCENTILES), f"{lat}_requests")),
    *_defs(_A, " ".join(f"{lat}_requests" for lat in LATENCIES)),
    *_defs(_A, "prefill_tokens"),
    # Derived once every rank has its server's latencies (pipeline/signals.share_server_latency).
    *_defs(_R, "queue_time_share", "queue_time_requests"),
    *_defs(_A, "prefill_tokens_per_request servers_for_queue"),
    # A counted event kind (core/events.Count) yields its rate with no other declaration.
    *(SignalDef(f"{spec.count.name}_per_minute", _M) for spec in counted() if spec.count is not None),
)
SIGNAL_NAMES = tuple(d.name for d in SIGNALS)
# Signal name (docs/signals.md) -> (catalog short name of its unit family, exported `signal` label, scale).
SIGNAL_UNITS: dict[str, tuple[str, str, float]] = {
    d.name: (d.family, d.name.removesuffix(SIGNAL_FAMILY_UNITS[d.family].docs_suffix),
             SIGNAL_FAMILY_UNITS[d.family].scale)
    for d in SIGNALS
}
# Which sample count decides whether a signal is known (the advisor applies check.min_samples to it).
SAMPLE_COUNT_OF: dict[str, str] = {d.name: d.samples for d in SIGNALS if d.samples is not None}
WORST_IS_LOWEST = frozenset(d.name for d in SIGNALS if d.worst == "min")  # headroom-like: the least rank is worst
