"""Fleet signals from Prometheus: the PromQL plan (a fixed number of queries whatever the fleet size) and the
pure functions that turn its answers into per-instance, per-rank signals, server facts and drift.

Every query aggregates `by (instance, dp_rank, pp_rank)` so one answer covers every server, one series per
DP replica: TP/EP ranks of a replica repeat the same values, so they are folded with max (min for memory
headroom), never summed; a label that partitions events (cuda_graph, mode, source) is summed after that fold
(docs/signals.md, "PromQL: the same meaning"). Each signal lists its
sources in order of preference, joined with PromQL `or` (the left side wins per instance): the alert
engineer's recording rules, our sidecar's raw `sglang_tuning_*` series, then SGLang's own metrics in both
spellings (`sglang:name` and `sglang_name`), then the sidecar's windowed `sglang_tuning_signal_<unit>` families
(brought back to their docs/signals.md name and unit; the deprecated `sglang_tuning_signal` for sidecars of the
previous release).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sglang_tuning_exporter.core.catalog import (
    GIB,
    LATENCIES,
    OOM_PHASES,
    SAMPLE_COUNT_OF,
    SIGNAL_FAMILIES,
    SIGNAL_FAMILY_UNITS,
    SIGNAL_UNITS,
)
from sglang_tuning_exporter.core.durations import duration_text
from sglang_tuning_exporter.core.model import Rank, ServerState, value_text
from sglang_tuning_exporter.core.recording import recorded
from sglang_tuning_exporter.core.redact import redact_text, redact_value
from sglang_tuning_exporter.core.versions import merge_version
from sglang_tuning_exporter.fleet import native
from sglang_tuning_exporter.fleet.promapi import Sample, Series
from sglang_tuning_exporter.fleet.promql import GROUP as GROUP
from sglang_tuning_exporter.fleet.promql import SGLANG_SPELLINGS as SGLANG_SPELLINGS
from sglang_tuning_exporter.fleet.promql import PlannedQuery as PlannedQuery
from sglang_tuning_exporter.fleet.promql import Window as Window
from sglang_tuning_exporter.fleet.promql import duration as duration
from sglang_tuning_exporter.fleet.promql import series as series
from sglang_tuning_exporter.fleet.promql import sources as _sources
from sglang_tuning_exporter.guide.advisor import MIN_AGG, STARTUP_SIGNALS
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.pipeline.signals import SignalParams, share_server_latency

SIDECAR_WINDOW_S = Config().window_s  # the sidecar's window unless the report's --config says another
TF = '"true|false"'
FACT_LOOKBACK = "1h"  # startup constants are re-exposed on every scrape; an hour bridges scrape gaps
NEW = '"new"'
# Server arguments that differ between healthy servers by design; never reported as drift.
DRIFT_IGNORED_ARGS = frozenset({"port", "nccl_port", "random_seed", "base_gpu_id", "dist_init_addr",
                                "node_rank", "metrics_port", "host"})


class SelectorError(ValueError):
    """The --selector text is not a PromQL label-matcher list."""


_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


def parse_selector(text: str | None) -> str:
    """Validate `{job="sglang", ...}` (braces optional) and return the inner matchers, '' when empty."""
    if text is None:
        return ""
    inner = text.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1]
    elif "{" in inner or "}" in inner:
        raise SelectorError(f"selector {text!r}: unbalanced braces")
    inner = inner.strip().rstrip(",")
    if not inner:
        return ""
    parts: list[str] = []
    pos = 0
    while pos < len(inner):
        m = _MATCHER.match(inner, pos)
        if m is None:
            raise SelectorError(f"selector {text!r}: expected label=\"value\" at {inner[pos:pos + 20]!r}")
        if m.group(1) == "__name__":
            raise SelectorError(f"selector {text!r}: do not select on __name__; the report picks the metrics")
        parts.append(f'{m.group(1)}{m.group(2)}"{m.group(3)}"')
        pos = m.end()
        if pos < len(inner):
            if inner[pos] != ",":
                raise SelectorError(f"selector {text!r}: expected ',' at {inner[pos:pos + 20]!r}")
            pos += 1
    return ",".join(parts)


def _sglang(name: str, sel: str, matchers: str = "") -> list[str]:
    return [series(p + name, sel, matchers) for p in SGLANG_SPELLINGS]


# The alert engineer's recording rules (alerts/recording.rules.yaml), preferred where they exist: long-term
# stores often keep only recorded series. Per-second rates over 5m, by (job, instance, model_name, dp_rank, ...).
RULE_RETRACTIONS = recorded("retractions")
RULE_DECODE_SAMPLES = recorded("decode_samples")
RULE_PREFILL_TOKENS = recorded("prefill_tokens")


def per_replica(expr: str, split: str = "") -> str:
    """Fold the TP ranks of each replica with max; a `split` label partitioning the events (cuda_graph, mode,
    source) is summed after that fold."""
    if not split:
        return f"max by ({GROUP}) ({expr})"
    return f"sum by ({GROUP}) (max by ({GROUP}, {split}) ({expr}))"


def ratio_of_samples(cond: str, w: Window) -> str:
    """Fraction of evaluation steps in the range where the 0/1 expression `cond` is 1, per group."""
    return f"avg by ({GROUP}) (avg_over_time(({cond})[{duration(w.length_s)}:{duration(w.step_s)}]))"


def plan(w: Window, params: SignalParams | None = None, window_s: float = SIDECAR_WINDOW_S) -> list[PlannedQuery]:
    """The instant queries of one report; their number does not depend on the fleet size.

    `window_s` is the sidecar's window (the report's config `window_s`), which shapes how its windowed
    signals are read. `params` are the signal definitions shared with signals.py (the profile's queue band, the usage that
    counts as good, the share of max_running_requests that counts as capped); the checks' thresholds on the
    resulting signals stay in the checks table and are applied by the advisor.
    """
    p = params or SignalParams()
    queue_band_high, usage_target = p.queue_band[1], p.usage_good
    sel, r = w.selector, duration(w.length_s)
    queue_ours = series("sglang_tuning_queue_requests", sel)
    queue_sg = [series(p + "num_queue_reqs", sel, 'priority=""') for p in SGLANG_SPELLINGS]
    usage_ours = series("sglang_tuning_token_usage_ratio", sel)
    usage_sg = _sglang("token_usage", sel)

    def per_queue(tmpl: str) -> list[str]:
        return [ratio_of_samples(tmpl.format(q=f"max by ({GROUP}) ({q})"), w) for q in (queue_ours, *queue_sg)]

    def usage_with_queue(u: str, q: str) -> str:
        return ratio_of_samples(f"(max by ({GROUP}) ({u}) < bool {usage_target:g}) * "
                                f"(max by ({GROUP}) ({q}) > bool 0)", w)

    def last(name: str, metric_ours: str, sg_names: Sequence[str], scale_ours: float = 1.0) -> str:
        # The TP ranks of a replica fold by the advisor's rule: min for headroom (the least free memory OOMs).
        op = fold_of(name)
        ours = f"{op} by ({GROUP}) (last_over_time({series(metric_ours, sel)}[{r}]))"
        if scale_ours != 1.0:
            ours = f"{ours} / {scale_ours:.17g}"  # exact: `:g` wrote 2^30 as 1.07374e+09
        sg = [f"{op} by ({GROUP}) (last_over_time({s}[{r}]))" for n in sg_names for s in _sglang(n, sel)]
        return _sources(ours, *sg)

    running_ours = series("sglang_tuning_running_requests", sel)
    running_sg = _sglang("num_running_reqs", sel)
    cap_ours = series("sglang_tuning_max_running_requests", sel)
    cap_sg = _sglang("max_running_requests", sel)

    def capped(run: str, cap: str, u: str, q: str) -> str:
        # The batch sat at its cap while requests waited and the KV cache had room (running_capped_ratio).
        # The cap is a startup constant: a short look-back keeps the subquery linear in the range.
        return ratio_of_samples(f"(max by ({GROUP}) ({run}) >= bool {p.capped_fraction:g} * max by ({GROUP}) "
                                f"(last_over_time({cap}[{FACT_LOOKBACK}]))) * "
                                f"(max by ({GROUP}) ({q}) > bool 0) * (max by ({GROUP}) ({u}) < bool {usage_target:g})", w)

    def counter_ratio(metric: str, num: str, den: str, split: str) -> str:
        # A missing numerator series means zero events, not an unknown ratio.
        n = per_replica(f"increase({series(metric, sel, num)}[{r}])", split)
        d = per_replica(f"increase({series(metric, sel, den)}[{r}])", split)
        return f"(({n}) or ({d}) * 0) / ({d})"

    def rule_ratio(rule: str, num: str, den: str, split: str) -> str:
        # Recorded per-second rates: average numerator and denominator over the range, then divide.
        n = per_replica(f"avg_over_time({series(rule, sel, num)}[{r}])", split)
        d = per_replica(f"avg_over_time({series(rule, sel, den)}[{r}])", split)
        return f"(({n}) or ({d}) * 0) / ({d})"

    def counter_ratio_sg(name: str, num_m: str, den_m: str, split: str) -> list[str]:
        out = []
        for p in SGLANG_SPELLINGS:
            n = per_replica(f"increase({series(p + name, sel, num_m)}[{r}])", split)
            d = per_replica(f"increase({series(p + name, sel, den_m)}[{r}])", split)
            out.append(f"(({n}) or ({d}) * 0) / ({d})")
        return out

    # Every TP rank of a replica exports (and logs) the same retractions: max over them, never sum.
    retr = [f"60 * max by ({GROUP}) (rate({series('sglang_tuning_retractions_total', sel)}[{r}]))"]
    retr += [f"60 * max by ({GROUP}) (rate({s}[{r}]))" for s in _sglang("num_retracted_requests_total", sel)]
    # 0.4.10-0.5.2: a cumulative gauge; rate() copes with its resets at restarts.
    retr += [f"60 * max by ({GROUP}) (rate({s}[{r}]))" for s in _sglang("total_retracted_reqs", sel)]

    return [
        PlannedQuery("queue_empty_ratio", _sources(*per_queue("{q} == bool 0"))),
        PlannedQuery("queue_over_band_ratio", _sources(*per_queue(f"{{q}} > bool {queue_band_high:g}"))),
        PlannedQuery("kv_underused_ratio", _sources(
            usage_with_queue(usage_ours, queue_ours),
            *(usage_with_queue(u, q) for u, q in zip(usage_sg, queue_sg, strict=True)))),
        PlannedQuery("retractions_per_minute", _sources(
            f"60 * max by ({GROUP}) (avg_over_time({series(RULE_RETRACTIONS, sel)}[{r}]))", *retr)),
        PlannedQuery("cuda_graph_miss_ratio", _sources(
            rule_ratio(RULE_DECODE_SAMPLES, 'cuda_graph="false"', 'cuda_graph=~"true|false"', "cuda_graph"),
            counter_ratio("sglang_tuning_decode_samples_total", 'cuda_graph="false"', 'cuda_graph=~"true|false"',
                          "cuda_graph"),
            *counter_ratio_sg("cuda_graph_passes_total", 'mode="decode_none"',
                              'mode=~"decode_cuda_graph|decode_none"', "mode"))),
        PlannedQuery("cuda_graph_miss_batch_p90", _sources(
            f"max by ({GROUP}) (quantile_over_time(0.9, "
            f"{series('sglang_tuning_decode_batch_size_without_graph', sel)}[{r}]))")),
        PlannedQuery("prefix_cache_hit_ratio", _sources(
            rule_ratio(RULE_PREFILL_TOKENS, 'source="cached"', 'source=~"cached|new"', "source"),
            counter_ratio("sglang_tuning_prefill_tokens_total", 'source="cached"', 'source=~"cached|new"', "source"),
            # SGLang's tokenizer counters: one process, no TP ranks; the sum adds is_streaming / cache_source.
            *[f"sum by ({GROUP}) (increase({c}[{r}])) / sum by ({GROUP}) (increase({p}[{r}]))"
              for c, p in zip(_sglang("cached_tokens_total", sel), _sglang("prompt_tokens_total", sel),
                              strict=True)])),
        PlannedQuery("token_usage_mean", _sources(
            *[f"max by ({GROUP}) (avg_over_time({u}[{r}]))" for u in (usage_ours, *usage_sg)])),
        PlannedQuery("running_max", _sources(
            *[f"max by ({GROUP}) (max_over_time({x}[{r}]))" for x in (running_ours, *running_sg)])),
        # Sample counts: the advisor applies each check's min_samples to them (catalog.SAMPLE_COUNT_OF).
        PlannedQuery("queue_samples", _sources(
            *[f"max by ({GROUP}) (count_over_time({q}[{r}]))" for q in (queue_ours, *queue_sg)])),
        PlannedQuery("kv_samples", _sources(
            *[f"max by ({GROUP}) (count_over_time({u}[{r}]))" for u in (usage_ours, *usage_sg)])),
        PlannedQuery("decode_samples", _sources(
            *[f"max by ({GROUP}) (count_over_time({x}[{r}]))" for x in (running_ours, *running_sg)])),
        PlannedQuery("graph_samples", _sources(
            per_replica(f"avg_over_time({series(RULE_DECODE_SAMPLES, sel, 'cuda_graph=~' + TF)}[{r}])", "cuda_graph")
            + f" * {w.length_s:g}",
            per_replica(f"increase({series('sglang_tuning_decode_samples_total', sel, 'cuda_graph=~' + TF)}[{r}])",
                        "cuda_graph"),
            *[per_replica(f"increase({x}[{r}])", "mode")
              for x in _sglang("cuda_graph_passes_total", sel, 'mode=~"decode_cuda_graph|decode_none"')])),
        PlannedQuery("prefill_samples", _sources(
            f"max by ({GROUP}) (count_over_time({series('sglang_tuning_prefill_tokens_total', sel, 'source=' + NEW)}[{r}]))",
            *[f"max by ({GROUP}) (count_over_time({x}[{r}]))" for x in _sglang("prompt_tokens_total", sel)])),
        *[PlannedQuery(name, last(name, *how)) for name, how in (
            ("available_gpu_mem_gb", ("sglang_tuning_available_gpu_memory_bytes", ["startup_available_gpu_memory_gb"],
                                      GIB)),
            ("gpu_mem_total_gb", ("sglang_tuning_gpu_memory_total_bytes", [], GIB)),
            ("max_total_num_tokens", ("sglang_tuning_max_total_tokens", ["max_total_num_tokens"])),
            ("max_running_requests", ("sglang_tuning_max_running_requests", ["max_running_requests"])),
            ("cuda_graph_max_bs_captured", ("sglang_tuning_cuda_graph_max_batch_size", [])))],
        PlannedQuery("running_capped_ratio", _sources(
            capped(running_ours, cap_ours, usage_ours, queue_ours),
            *(capped(a, b, c, d) for a, b, c, d in zip(running_sg, cap_sg, usage_sg, queue_sg, strict=True)))),
        PlannedQuery("decode_batch_p90", _sources(
            *[f"max by ({GROUP}) (quantile_over_time(0.9, {x}[{r}]))" for x in (running_ours, *running_sg)])),
        # SGLang's latency histograms and hybrid-pool gauges (fleet/native.py), under their signal names.
        *native.queries(w),
        PlannedQuery("oom", f"max by ({GROUP}, phase) (increase({series('sglang_tuning_oom_events_total', sel)}[{r}]))"),
        # The sidecar's own windowed signals, what its alert rules judge: they win over the queries above for
        # the instances that export them (collect), which serve SGLang's own metrics and older sidecars.
        PlannedQuery("sidecar_signals", sidecar_signals_expr(sel, w.length_s, window_s)),
    ]


# Signals of the sidecar that count samples in its window: over a range longer than the window, the fullest
# window inside it counts, not their mean. OOM events are counted over the whole range by their counter instead.
WINDOW_COUNTS = tuple(sorted(set(SAMPLE_COUNT_OF.values())))
OOM_COUNTS = frozenset(f"oom_{p}_count" for p in OOM_PHASES)
# Prometheus' default lookback: a windowed signal is looked for at least this far back, since a look-back
# shorter than a scrape interval finds no sample and would hand the signal to the other sources silently.
LOOKBACK_S = 300.0


def fold_of(name: str) -> str:
    """How the TP ranks of a replica fold a signal: the advisor's rule (min where less is worse)."""
    return "min" if name in MIN_AGG else "max"


def sidecar_lookback(range_s: float, window_s: float = SIDECAR_WINDOW_S) -> float:
    """Seconds back from the range's end in which the sidecar's windowed signals are read."""
    return max(range_s - window_s, LOOKBACK_S) if range_s > window_s else max(range_s, LOOKBACK_S)


def window_note(range_s: float, window_s: float = SIDECAR_WINDOW_S) -> str | None:
    """What the report says when the sidecar's windows it reads reach back before the range's start."""
    if range_s > window_s:
        back = sidecar_lookback(range_s, window_s)
        before = round(window_s + back - range_s)
        read = f"the sidecar's {duration_text(window_s)} windows ending in the last {duration_text(back)}"
    else:
        before = round(window_s - range_s)
        read = f"the sidecar's last {duration_text(window_s)} window"
    if before <= 0:
        return None
    return f"signals read from {read} reach back {duration_text(before)} before the range's start"


def sidecar_signals_expr(sel: str, range_s: float, window_s: float = SIDECAR_WINDOW_S) -> str:
    """The sidecar's windowed signals (what the exporter's alert rules judge) under their docs/signals.md
    names and units, per replica.

    A range no longer than the sidecar's window reads each signal at the range's end, the value an alert
    evaluated at that instant reads; a longer range reads the windows that lie inside it (mean of the
    signal, the fullest window for a sample count), which together cover the range and no more. A yes/no
    fact or a fixed setting (guide/advisor.STARTUP_SIGNALS) is read at its latest value, never a mean; OOM
    counts over a longer range are left to the counter's increase (the `oom` query). TP ranks fold by the
    advisor's rule (fold_of).
    """
    longer = range_s > window_s
    r = duration(sidecar_lookback(range_s, window_s))
    def reader(name: str, short: str) -> str:
        if short == "signal_flag" or name in STARTUP_SIGNALS or not longer:
            return "last_over_time"
        return "max_over_time" if name in WINDOW_COUNTS else "avg_over_time"

    parts = []
    for short in SIGNAL_FAMILIES:
        unit = SIGNAL_FAMILY_UNITS[short]  # a family whose label and unit differ from docs/signals.md
        metric = "sglang_tuning_" + short
        default = (reader("", short), "max")
        groups: dict[tuple[str, str], list[str]] = {}
        left_out: list[str] = []
        for name, (family, label, _) in SIGNAL_UNITS.items():
            if family != short:
                continue
            if longer and name in OOM_COUNTS:
                left_out.append(label)
            else:
                groups.setdefault((reader(name, short), fold_of(name)), []).append(label)
        named = sorted(lab for key, labels in groups.items() if key != default for lab in labels) + left_out
        # A signal the catalog does not name (a newer sidecar's) is read the default way.
        groups.setdefault(default, [])
        for (fn, fold), labels in sorted(groups.items()):
            if (fn, fold) == default:
                matcher = f'signal!~"{"|".join(named)}"' if named else ""
            else:
                matcher = f'signal=~"{"|".join(sorted(labels))}"'
            expr = f"{fold} by ({GROUP}, signal) ({fn}({series(metric, sel, matcher)}[{r}]))"
            if unit.docs_suffix:
                expr = f'label_replace({expr} {unit.to_docs}, "signal", "${{1}}{unit.docs_suffix}", "signal", "(.+)")'
            parts.append(expr)
    # Sidecars of the previous release export only the deprecated mixed-unit family.
    parts.append(f"max by ({GROUP}, signal) ({reader('', '')}({series('sglang_tuning_signal', sel)}[{r}]))")
    return _sources(*parts)


# Why a check is unknown, in terms of what the report read (Prometheus series, never log lines): the
# advisor's `words` (guide/advisor.COUNT_WORDS and MISSING_WHY speak of a log).
PROMETHEUS_WORDS: dict[str, str] = {
    "queue_samples": "Prometheus samples of the queue (sglang_tuning_queue_requests, sglang:num_queue_reqs)",
    "kv_samples": "Prometheus samples of token usage (sglang_tuning_token_usage_ratio, sglang:token_usage)",
    "decode_samples": "Prometheus samples of running requests (sglang_tuning_running_requests, "
                      "sglang:num_running_reqs)",
    "graph_samples": "decode passes counted by CUDA-graph use in Prometheus (sglang_tuning_decode_samples_total, "
                     "sglang:cuda_graph_passes_total)",
    "prefill_samples": "Prometheus samples of prefill tokens (sglang_tuning_prefill_tokens_total, "
                       "sglang:prompt_tokens_total)",
    "pool_samples": "hybrid-pool samples in Prometheus (the sidecar's sglang_tuning_signal_amount "
                    "{signal=\"pool_samples\"}, from hybrid models only)",
    "kv_pool_context_ratio": "no KV-pool or context-length fact in Prometheus (the sidecar's "
                             "sglang_tuning_signal_ratio{signal=\"kv_pool_context_ratio\"})",
    "available_gpu_mem_gb": "no available-GPU-memory series in Prometheus (sglang_tuning_available_gpu_memory_bytes, "
                            "sglang:startup_available_gpu_memory_gb)",
    "cuda_graph_ceiling_ratio": "no captured CUDA-graph batch size or max_running_requests series in Prometheus "
                                "(sglang_tuning_cuda_graph_max_batch_size, sglang_tuning_max_running_requests)",
    "metrics_enabled": "neither the server argument enable_metrics (sglang_tuning_server_arg) nor SGLang's own "
                       "metrics in Prometheus",
    "prefix_cache_hit_ratio": "no prefill-token counters in Prometheus (sglang_tuning_prefill_tokens_total, "
                              "sglang:cached_tokens_total)",
    "retractions_per_minute": "no retraction counter or windowed signal in Prometheus "
                              "(sglang_tuning_retractions_total, sglang:num_retracted_requests_total)",
    "oom": "no OOM series in Prometheus (sglang_tuning_oom_events_total: OOMs are counted only by a sidecar "
           "that reads the log)",
    "latency": "no latency quantile series in Prometheus (neither SGLang's latency histograms, e.g. "
               "sglang:time_to_first_token_seconds_bucket, nor sglang_tuning_signal_seconds)",
    **{f"{lat}_requests": f"requests in Prometheus' {lat} latency series (SGLang's histogram or "
                          "sglang_tuning_signal_amount)"
       for lat in LATENCIES},
}


def identity_queries(w: Window) -> list[PlannedQuery]:
    """Server facts: arguments, version and model (one query each, whatever the fleet size)."""
    sel, r = w.selector, duration(w.length_s)
    models = [f"group by (instance, model_name) (last_over_time({s}[{r}]))"
              for s in (series("sglang_tuning_queue_requests", sel), *_sglang("num_queue_reqs", sel))]
    return [
        PlannedQuery("args", f"max by (instance, arg) (last_over_time({series('sglang_tuning_server_arg', sel)}[{r}]))"),
        PlannedQuery("info", f"group by (instance, version, model_name, schedule_policy) "
                             f"(last_over_time({series('sglang_tuning_server_info', sel)}[{r}]))"),
        PlannedQuery("models", _sources(*models)),
        # Servers whose own SGLang metrics reach Prometheus have --enable-metrics on (metrics_enabled = 1).
        PlannedQuery("native", _sources(*[f"group by (instance) (last_over_time({q}[{r}]))"
                                          for q in _sglang("num_queue_reqs", sel)])),
    ]


# --------------------------------------------------------------------------------------------- results


@dataclass(slots=True)
class InstanceData:
    """What the queries told us about one instance."""

    instance: str
    signals: dict[Rank, dict[str, float | None]] = field(default_factory=dict)
    args: dict[str, float | str] = field(default_factory=dict)
    version: str | None = None
    model_name: str | None = None

    def server_state(self) -> ServerState:
        """The advisor's view of this server's configuration."""
        return ServerState(version=self.version, args=dict(self.args), model_name=self.model_name)


def rank_of(labels: Mapping[str, str]) -> Rank:
    """The Rank a grouped sample belongs to: its DP replica (TP ranks repeat the same numbers) and, with
    pipeline parallelism, its stage; stage 0 (every server without PP exports pp_rank="0") is left out."""
    dp, pp = labels.get("dp_rank", ""), labels.get("pp_rank", "")
    return Rank(dp=int(dp) if dp.isdigit() else None, pp=int(pp) if pp.isdigit() and pp != "0" else None)


def _value(v: float) -> float | None:
    return None if math.isnan(v) or math.isinf(v) else v


def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else float(v)


def collect(results: Mapping[str, Sequence[Sample]]) -> dict[str, InstanceData]:
    """Fold the answers of `plan` and `identity_queries` into per-instance data (pure)."""
    fleet: dict[str, InstanceData] = {}

    def inst(name: str) -> InstanceData:
        return fleet.setdefault(name, InstanceData(instance=name))

    # The sidecar's windowed signals come last and win: the report reads what the alerts read.
    for key, samples in sorted(results.items(), key=lambda kv: kv[0] == "sidecar_signals"):
        if key in ("args", "info", "models", "native"):
            continue
        for s in samples:
            name = s.labels.get("instance")
            if not name:
                continue
            sig = inst(name).signals.setdefault(rank_of(s.labels), {})
            if key == "oom":
                # increase() extrapolates to the range's edges: events are whole.
                v = _value(s.value)
                sig[f"oom_{s.labels.get('phase') or 'unknown'}_count"] = None if v is None else float(round(v))
            elif key == "sidecar_signals" or key in native.KEYS:
                which, v = s.labels.get("signal"), _value(s.value)
                if which and (v is not None or which not in sig):
                    sig[which] = v
            else:
                sig[key] = _value(s.value)
    for s in results.get("args", ()):
        name, arg = s.labels.get("instance"), s.labels.get("arg")
        v = _value(s.value)
        if name and arg and v is not None:
            # The exporters redact already; a series from elsewhere is held to the same rule (core/redact).
            inst(name).args[arg] = redact_value(arg, _number(v))
    for s in results.get("models", ()):
        name = s.labels.get("instance")
        if name and s.labels.get("model_name"):
            inst(name).model_name = redact_text(s.labels["model_name"])
    for s in results.get("native", ()):
        name = s.labels.get("instance")
        if name:
            d = inst(name)
            if not d.signals:
                d.signals[Rank()] = {}
            for sig in d.signals.values():
                sig["metrics_enabled"] = 1.0
    for s in results.get("info", ()):
        name = s.labels.get("instance")
        if not name:
            continue
        data = inst(name)
        data.version = merge_version(data.version, s.labels.get("version"))
        data.model_name = redact_text(s.labels.get("model_name") or "") or data.model_name
        if s.labels.get("schedule_policy"):
            data.args.setdefault("schedule_policy", redact_text(s.labels["schedule_policy"]))
    return fleet


@dataclass(frozen=True, slots=True)
class Drift:
    """Servers of one model that run one argument at different values."""

    model_name: str
    arg: str
    values: dict[str, list[str]]  # value (as text) -> instances, most common value first

    def to_json_dict(self) -> dict[str, object]:
        """The `drift` entry of the report JSON."""
        return {"model_name": self.model_name, "arg": self.arg, "values": {k: list(v) for k, v in self.values.items()}}


def find_drift(instances: Iterable[InstanceData]) -> list[Drift]:
    """Per model, every argument whose value is not the same on all servers that report it (pure)."""
    by_model: dict[str, list[InstanceData]] = {}
    for d in instances:
        if d.model_name:
            by_model.setdefault(d.model_name, []).append(d)
    out: list[Drift] = []
    for model in sorted(by_model):
        group = by_model[model]
        if len(group) < 2:
            continue
        arg_names = sorted({a for d in group for a in d.args} - DRIFT_IGNORED_ARGS)
        for arg in arg_names:
            values: dict[str, list[str]] = {}
            for d in sorted(group, key=lambda x: x.instance):
                if arg in d.args:
                    values.setdefault(value_text(d.args[arg]), []).append(d.instance)
            if len(values) > 1:
                ordered = dict(sorted(values.items(), key=lambda kv: (-len(kv[1]), kv[0])))
                out.append(Drift(model_name=model, arg=arg, values=ordered))
    return out


def chart_queries(w: Window) -> list[tuple[str, str]]:
    """Range queries for the html charts (a coarse step; one query per chart for the whole fleet)."""
    sel = w.selector
    step = duration(chart_step(w))
    queue_sg = [series(p + "num_queue_reqs", sel, 'priority=""') for p in SGLANG_SPELLINGS]
    queue = _sources(f"max by (instance) ({series('sglang_tuning_queue_requests', sel)})",
                     *[f"max by (instance) ({q})" for q in queue_sg])
    usage = _sources(f"max by (instance) ({series('sglang_tuning_token_usage_ratio', sel)})",
                     *[f"max by (instance) ({s})" for s in _sglang("token_usage", sel)])
    # A server's rate is its worst DP replica's (the rank the alert fires on), TP ranks counted once.
    retr = _sources(f"60 * max by (instance) ({series(RULE_RETRACTIONS, sel)})",
                    f"60 * max by (instance) (rate({series('sglang_tuning_retractions_total', sel)}[{step}]))",
                    *[f"60 * max by (instance) (rate({s}[{step}]))"
                      for s in _sglang("num_retracted_requests_total", sel)])
    return [("queue", queue), ("token_usage", usage), ("retractions_per_minute", retr)]


def chart_step(w: Window) -> float:
    """The step of the chart range queries."""
    return float(max(60, round(w.length_s / 120)))


def charts_by_instance(results: Mapping[str, Sequence[Series]]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """instance -> chart name -> points, dropping NaN points (pure)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for chart, items in results.items():
        for s in items:
            name = s.labels.get("instance")
            if name:
                pts = [(t, v) for t, v in s.points if not (math.isnan(v) or math.isinf(v))]
                out.setdefault(name, {})[chart] = pts
    return out


def derive_signals(d: InstanceData) -> dict[Rank, dict[str, float | None]]:
    """Per-rank signals plus those signals.py derives from startup facts (pure).

    Signals read from server arguments (schedule policy, metrics enabled) are the advisor's job.
    """
    out: dict[Rank, dict[str, float | None]] = {}
    for rank, sig in (d.signals or {Rank(): {}}).items():
        s = dict(sig)
        cap, captured = s.get("max_running_requests"), s.get("cuda_graph_max_bs_captured")
        if s.get("cuda_graph_ceiling_ratio") is None and cap and captured is not None:
            s["cuda_graph_ceiling_ratio"] = captured / cap
        out[rank] = s
    # SGLang's TTFT/ITL/E2E come from its tokenizer (no scheduler rank): each rank takes its server's, and what
    # combines them with the rank's batch and queue is derived, as the sidecar does; a sidecar's own values stay.
    shared = {rank: dict(s) for rank, s in out.items()}
    share_server_latency(shared)
    for rank, s in shared.items():
        out[rank].update({k: v for k, v in s.items() if v is not None and out[rank].get(k) is None})
    return out
