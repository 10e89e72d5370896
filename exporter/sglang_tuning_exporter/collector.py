"""Our /metrics: a custom prometheus_client Collector building fresh families from a state snapshot.

Every family comes from `catalog.CATALOG` (name, type, help, labels); nothing here invents a name.
Register it on a private `CollectorRegistry`, never on the global REGISTRY.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from . import __version__
from .catalog import BY_NAME, CATALOG, PREFIX, MetricSpec
from .model import STATUS_CODE, Rank
from .state import SOURCES, Snapshot

GIB = float(1 << 30)  # SGLang's "GB" is get_available_gpu_memory() / 2**30
# Server args exported as gauges: the knobs the guide tunes plus the topology they depend on.
TUNING_ARGS = (
    "mem_fraction_static", "schedule_conservativeness", "chunked_prefill_size", "max_running_requests",
    "max_total_tokens", "max_prefill_tokens", "cuda_graph_max_bs", "cuda_graph_max_bs_decode",
    "disable_cuda_graph", "disable_radix_cache", "page_size", "tp_size", "dp_size", "pp_size", "ep_size",
    "enable_dp_attention", "enable_torch_compile", "torch_compile_max_bs", "decode_log_interval",
    "enable_metrics", "context_length", "max_queued_requests", "enable_mixed_chunk",
    "num_continuous_decode_steps", "stream_interval", "max_total_num_tokens",
)
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
# Per-rank counters: catalog short name -> (state family, extra label name or None).
RANK_COUNTERS: tuple[tuple[str, str, str | None], ...] = (
    ("decode_samples_total", "decode_samples", "cuda_graph"),
    ("retractions_total", "retractions", None),
    ("retracted_requests_total", "retracted_requests", None),
    ("prefill_tokens_total", "prefill_tokens", "source"),
    ("oom_events_total", "oom_events", "phase"),
)


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """Exporter build facts (injected so golden files do not depend on the build)."""

    version: str
    python_version: str


def current_build() -> BuildInfo:
    """This process's build facts."""
    return BuildInfo(__version__, platform.python_version())


def _spec(short: str) -> MetricSpec:
    return BY_NAME[PREFIX + short]


def _family(spec: MetricSpec) -> Metric:
    # prometheus_client appends `_total`/`_info` itself; the catalog names carry the suffix.
    if spec.type == "counter":
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=list(spec.labels))
    if spec.type == "info":
        return InfoMetricFamily(spec.name.removesuffix("_info"), spec.help, labels=list(spec.labels))
    return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))


def _numeric(v: Any) -> float | None:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


def rank_label_values(model: str, rank: Rank | Mapping[str, int]) -> list[str]:
    """Values for RANK_LABELS in catalog order."""
    r = rank if isinstance(rank, Rank) else Rank.from_dict(dict(rank))
    lab = r.labels()
    return [model, lab["dp_rank"], lab["pp_rank"], lab["tp_rank"], lab["moe_ep_rank"]]


def build_families(snap: Snapshot, build: BuildInfo) -> list[Metric]:
    """Fresh metric families for one scrape, in catalog order; families without samples are left out."""
    fams: dict[str, Metric] = {m.name: _family(m) for m in CATALOG}

    def add(short: str, labels: list[str], value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return  # unknown is absent, never NaN
        fam = fams[PREFIX + short]
        assert isinstance(fam, (GaugeMetricFamily, CounterMetricFamily)), short
        fam.add_metric(labels, value)

    def add_info(short: str, values: dict[str, str]) -> None:
        fam = fams[PREFIX + short]
        assert isinstance(fam, InfoMetricFamily)
        fam.add_metric([], values)

    model = snap.model_name
    for r in snap.ranks:
        base = rank_label_values(model, r.rank)
        for short, obs, scale in RANK_GAUGES:
            v = r.gauges.get(obs)
            add(short, base, None if v is None else v * scale)
        for short, family, extra in RANK_COUNTERS:
            for (fam_name, label), total in sorted(r.counters.items()):
                if fam_name == family:
                    add(short, base + ([label] if extra else []), total)
        add("decode_batch_size_without_graph", base, r.no_graph_batch_p90)
    for rank, values in snap.signals:
        base = rank_label_values(model, rank)
        for name, value in sorted(values.items()):
            add("signal", [*base, name], value)
    for f in snap.findings:
        base = rank_label_values(model, f.rank)
        add("check_status", [*base, f.check, f.severity], STATUS_CODE.get(f.status, -1.0))
        if f.flag:
            if f.status in ("warning", "critical"):
                add("suggested_value", [*base, f.check, f.flag], _numeric(f.suggested))
            add("current_value", [*base, f.check, f.flag], _numeric(f.current))
    for arg in TUNING_ARGS:
        add("server_arg", [arg], _numeric(snap.args.get(arg)))
    if snap.version or model:
        add_info("server_info", {"version": snap.version or "", "model_name": model,
                                 "schedule_policy": str(snap.args.get("schedule_policy") or "")})
    if snap.server_info_endpoint:
        add_info("sglang_endpoint_info", {"endpoint": snap.server_info_endpoint})
    # --- self health
    add("up", [], 1.0 if snap.up else 0.0)
    metrics = snap.sources["metrics"]
    for source in SOURCES:
        st = snap.sources[source]
        add("source_enabled", [source], 1.0 if st.enabled else 0.0)
        if st.enabled:
            add("source_up", [source], 1.0 if st.up else 0.0)
            add("source_duration_seconds", [source], st.duration_s)
    if metrics.enabled:
        add("scrape_duration_seconds", [], metrics.duration_s)
        add("scrape_garbage_lines_total", [], snap.scrape_garbage)
        add("scrape_samples", [], snap.scrape_samples)
        add("sglang_restarts_total", [], snap.restarts)
    elif snap.restarts:
        add("sglang_restarts_total", [], snap.restarts)
    if snap.sources["log"].enabled:
        for kind, n in sorted(snap.log_lines.items()):
            add("log_lines_total", [kind], n)
        add("log_unparsed_lines_total", [], snap.log_unparsed)
        add("log_last_line_timestamp_seconds", [], snap.log_last_line_time)
        add("log_rotations_total", [], snap.log_rotations)
        add("log_truncations_total", [], snap.log_truncations)
        add("log_oversized_lines_total", [], snap.log_oversized)
    add("tracked_ranks", [], float(len(snap.ranks)))
    add("ranks_expired_total", [], snap.ranks_expired)
    add("evaluation_timestamp_seconds", [], snap.evaluated_at)
    add_info("build_info", {"version": build.version, "python_version": build.python_version})
    return [f for f in fams.values() if f.samples]


class TuningCollector(Collector):
    """Yields the catalog's families built from `snapshot()` on every collect()."""

    def __init__(self, snapshot: Callable[[], Snapshot], build: BuildInfo | None = None) -> None:
        self._snapshot = snapshot
        self._build = build or current_build()

    def describe(self) -> list[Metric]:
        """Nothing up front: keeps registration from calling collect() (state may not be ready)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Families from a fresh snapshot."""
        yield from build_families(self._snapshot(), self._build)


def make_registry(collector: TuningCollector) -> CollectorRegistry:
    """A private registry holding only our collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def catalog_markdown() -> str:
    """The metric table for the docs, generated from the catalog."""
    rows = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for m in CATALOG:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        rows.append(f"| `{m.name}` | {m.type} | {labels} | {m.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
