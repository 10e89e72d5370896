"""Our /metrics: a custom prometheus_client Collector building fresh families from a state snapshot.

Every family comes from `catalog.CATALOG` (name, type, help, labels); nothing here invents a name.
Register it on a private `CollectorRegistry`, never on the global REGISTRY.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

from sglang_tuning_exporter import __version__
from sglang_tuning_exporter.core.build import build_revision
from sglang_tuning_exporter.core.catalog import (
    BY_NAME,
    CATALOG,
    OOM_PHASES,
    PREFIX,
    RANK_GAUGES,
    RANK_LABELS,
    SIGNAL_FAMILIES,
    SIGNAL_UNITS,
    MetricSpec,
)
from sglang_tuning_exporter.core.model import STATUS_CODE, Rank
from sglang_tuning_exporter.guide.suggest import default_schedule_policy
from sglang_tuning_exporter.pipeline.signals import COUNT_NAMES
from sglang_tuning_exporter.sidecar.state import SOURCES, Snapshot

# Server args exported as gauges: the knobs the guide tunes plus the topology they depend on.
TUNING_ARGS = (
    "mem_fraction_static", "schedule_conservativeness", "chunked_prefill_size", "max_running_requests",
    "max_total_tokens", "max_prefill_tokens", "cuda_graph_max_bs", "cuda_graph_max_bs_decode",
    "disable_cuda_graph", "disable_radix_cache", "page_size", "tp_size", "dp_size", "pp_size", "ep_size",
    "enable_dp_attention", "enable_torch_compile", "torch_compile_max_bs", "decode_log_interval",
    "enable_metrics", "context_length", "max_queued_requests", "enable_mixed_chunk",
    "num_continuous_decode_steps", "stream_interval", "max_total_num_tokens",
)
# Per-rank counters: catalog short name -> (state family, extra label name or None).
RANK_COUNTERS: tuple[tuple[str, str, str | None], ...] = (
    ("decode_samples_total", "decode_samples", "cuda_graph"),
    ("retractions_total", "retractions", None),
    ("retracted_requests_total", "retracted_requests", None),
    ("prefill_tokens_total", "prefill_tokens", "source"),
    ("oom_events_total", "oom_events", "phase"),
    *((f"{name}_total", name, None) for name in COUNT_NAMES),  # the counted event kinds (core/events.Count)
)


# Event counters exported at 0 for every tracked rank before the first event: a series born at 1
# has no increase() in Prometheus, so the first OOM or retraction would never page.
ZERO_COUNTERS: dict[tuple[str, str], float] = {
    ("retractions", ""): 0.0, ("retracted_requests", ""): 0.0,
    **{("oom_events", phase): 0.0 for phase in OOM_PHASES},
    **{(name, ""): 0.0 for name in COUNT_NAMES},
}


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """Exporter build facts (injected so golden files do not depend on the build)."""

    version: str
    python_version: str
    revision: str = "unknown"


def current_build() -> BuildInfo:
    """This process's build facts."""
    return BuildInfo(__version__, platform.python_version(), build_revision())


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def format_value(v: float) -> str:
    """A sample value in Go's float formatting, as prometheus_client writes it."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    text = repr(v)
    dot = text.find(".")
    if v > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


# Status codes and flags repeat across thousands of rows: format them once.
_COMMON_VALUES = {v: format_value(v) for v in (-1.0, 0.0, 1.0, 2.0)}


class Family(Metric):
    """A catalog family whose rows keep label values and their rendered text.

    `samples` (what generic consumers such as `generate_latest` read) is built on demand; our
    /metrics encoder writes the pre-rendered rows instead, which is what keeps a scrape at
    64 ranks within a few milliseconds (bench/bench_sidecar.py).
    """

    def __init__(self, spec: MetricSpec) -> None:
        base = spec.name.removesuffix("_total") if spec.type == "counter" else (
            spec.name.removesuffix("_info") if spec.type == "info" else spec.name)
        super().__init__(base, spec.help, spec.type)
        self.spec = spec
        self.labelnames = spec.labels
        self.rows: list[tuple[tuple[str, ...], str, float]] = []
        self.frozen_text: str | None = None  # sample lines, kept once a family is shared across scrapes

    @property
    def samples(self) -> list[Sample]:
        """prometheus_client samples for the rows."""
        return [Sample(self.spec.name, dict(zip(self.labelnames, values, strict=True)), value, None, None)
                for values, _, value in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        pass  # Metric.__init__ assigns []; the rows are the storage

    def add(self, values: tuple[str, ...], value: float, labelstr: str | None = None) -> None:
        """One row; `labelstr` is the rendered `k="v",...` text when the caller has it."""
        if labelstr is None:
            labelstr = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(self.labelnames, values, strict=True))
        self.rows.append((values, labelstr, value))


def _sample_lines(m: Family) -> str:
    name = m.spec.name
    common = _COMMON_VALUES.get
    return "".join(f"{name}{{{labelstr}}} {common(v) or format_value(v)}\n" if labelstr
                   else f"{name} {common(v) or format_value(v)}\n" for _, labelstr, v in m.rows)


def encode_text(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4 for our families (generic Metric objects are accepted too)."""
    out: list[str] = []
    for m in families:
        mname, mtype = m.name, m.type
        if mtype == "counter":
            mname += "_total"
        elif mtype == "info":
            mname, mtype = mname + "_info", "gauge"
        doc = m.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n")
        if isinstance(m, Family):
            out.append(m.frozen_text if m.frozen_text is not None else _sample_lines(m))
        else:
            for s in m.samples:
                labelstr = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
                out.append(f"{s.name}{{{labelstr}}} {format_value(s.value)}\n" if labelstr
                           else f"{s.name} {format_value(s.value)}\n")
    return "".join(out).encode()


def _numeric(v: Any) -> float | None:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


def rank_label_values(model: str, rank: Rank | Mapping[str, int]) -> tuple[str, ...]:
    """Values for RANK_LABELS in catalog order."""
    r = rank if isinstance(rank, Rank) else Rank.from_dict(dict(rank))
    lab = r.labels()
    return (model, lab["dp_rank"], lab["pp_rank"], lab["tp_rank"], lab["moe_ep_rank"])


class _RankLabels:
    """Rendered rank label text, built once per rank per scrape."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._cache: dict[Rank | tuple[tuple[str, int], ...], tuple[tuple[str, ...], str]] = {}

    def get(self, rank: Rank | Mapping[str, int]) -> tuple[tuple[str, ...], str]:
        # Findings carry their rank as a dict: key those by their items, without building a Rank.
        key = rank if isinstance(rank, Rank) else tuple(rank.items())
        hit = self._cache.get(key)
        if hit is None:
            values = rank_label_values(self.model, rank)
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(RANK_LABELS, values, strict=True))
            hit = self._cache[key] = (values, text)
        return hit


EVALUATION_FAMILIES = tuple(PREFIX + n for n in (*SIGNAL_FAMILIES, "check_level", "signal", "check_status",
                                                  "suggested_value", "current_value",
                                                  "decode_batch_size_without_graph"))


def evaluation_families(snap: Snapshot) -> tuple[Family, ...]:
    """The families that only change when the guide is re-evaluated: signals, verdicts, suggestions."""
    fams = {name: Family(BY_NAME[name]) for name in EVALUATION_FAMILIES}
    ranks = _RankLabels(snap.model_name)

    def add(short: str, labels: tuple[str, ...], value: float | None, labelstr: str) -> None:
        if value is not None and math.isfinite(value):
            fams[PREFIX + short].add(labels, float(value), labelstr)

    # The big per-rank families append rows directly (thousands of rows at 64 ranks).
    signal_rows = fams[PREFIX + "signal"].rows.append  # deprecated: every signal in its docs/signals.md unit
    unit_rows = {short: fams[PREFIX + short].rows.append for short in SIGNAL_FAMILIES}
    for rank, values in snap.signals:
        base, text = ranks.get(rank)
        # The window's own cuda_graph_miss_batch_p90 under the name the dashboards plot.
        add("decode_batch_size_without_graph", base, values.get("cuda_graph_miss_batch_p90"), text)
        for name, value in sorted(values.items()):
            if math.isfinite(value):
                signal_rows(((*base, name), f'{text},signal="{_escape(name)}"', float(value)))
                unit = SIGNAL_UNITS.get(name)
                if unit is not None:
                    short, label, scale = unit
                    unit_rows[short](((*base, label), f'{text},signal="{_escape(label)}"', float(value) * scale))
    status_rows = fams[PREFIX + "check_status"].rows.append
    level_rows = fams[PREFIX + "check_level"].rows.append
    for f in snap.findings:
        base, text = ranks.get(f.rank)
        check = _escape(f.check)
        level = STATUS_CODE.get(f.status, -1.0)
        level_rows(((*base, f.check), f'{text},check="{check}"', level))
        status_rows(((*base, f.check, f.severity), f'{text},check="{check}",severity="{_escape(f.severity)}"', level))
        if f.flag:
            tail = f'{text},check="{check}",flag="{_escape(f.flag)}"'
            if f.status in ("warning", "critical"):
                add("suggested_value", (*base, f.check, f.flag), _numeric(f.suggested), tail)
            add("current_value", (*base, f.check, f.flag), _numeric(f.current), tail)
    return tuple(fams.values())


def build_families(snap: Snapshot, build: BuildInfo, evaluation: tuple[Family, ...] | None = None) -> list[Family]:
    """Fresh metric families for one scrape, in catalog order; families without samples are left out.

    `evaluation`: the evaluation families already built for this snapshot's evaluation (shared,
    read-only), so a scrape does not rebuild thousands of unchanged rows.
    """
    fams: dict[str, Family] = {m.name: Family(m) for m in CATALOG}

    def add(short: str, labels: tuple[str, ...], value: float | None, labelstr: str | None = None) -> None:
        if value is None or not math.isfinite(value):
            return  # unknown is absent, never NaN
        fams[PREFIX + short].add(labels, float(value), labelstr)

    model = snap.model_name
    ranks = _RankLabels(model)
    for r in snap.ranks:
        base, text = ranks.get(r.rank)
        for short, obs, scale in RANK_GAUGES:
            v = r.gauges.get(obs)
            if v is not None:
                add(short, base, v * scale, text)
        counters = {**ZERO_COUNTERS, **r.counters}
        for short, family, extra in RANK_COUNTERS:
            for (fam_name, label), total in sorted(counters.items()):
                if fam_name == family:
                    if extra:
                        add(short, (*base, label), total, f'{text},{extra}="{_escape(label)}"')
                    else:
                        add(short, base, total, text)
    evaluated = evaluation or evaluation_families(snap)
    for fam in evaluated:
        fams[fam.spec.name] = fam
    for arg in TUNING_ARGS:
        add("server_arg", (arg,), _numeric(snap.args.get(arg)))
    if snap.version or model:
        # The effective policy: the server's own arg, else its version's default (what the advisor judges).
        policy = snap.args.get("schedule_policy") or default_schedule_policy(snap.version) or ""
        add("server_info", (snap.version or "", model, str(policy)), 1.0)
    if snap.server_info_endpoint:
        add("sglang_endpoint_info", (snap.server_info_endpoint,), 1.0)
    # --- self health
    metrics = snap.sources["metrics"]
    if metrics.enabled:  # log-only: no `up` at all, rather than a 0 that reads as "SGLang is down"
        add("up", (), 1.0 if snap.up else 0.0)
    for source in SOURCES:
        st = snap.sources[source]
        add("source_enabled", (source,), 1.0 if st.enabled else 0.0)
        if st.enabled:
            add("source_up", (source,), 1.0 if st.up else 0.0)
            add("source_duration_seconds", (source,), st.duration_s)
    for (source, reason), n in sorted(snap.source_failures.items()):
        add("source_failures_total", (source, reason), n)
    for (source, limit), n in sorted(snap.input_truncations.items()):
        add("input_truncations_total", (source, limit), n)
    if metrics.enabled:
        add("scrape_duration_seconds", (), metrics.duration_s)
        add("scrape_garbage_lines_total", (), snap.scrape_garbage)
        add("scrape_samples", (), snap.scrape_samples)
        add("sglang_restarts_total", (), snap.restarts)
    elif snap.restarts:
        add("sglang_restarts_total", (), snap.restarts)
    if snap.sources["log"].enabled:
        for kind, n in sorted(snap.log_lines.items()):
            add("log_lines_total", (kind,), n)
        add("log_unparsed_lines_total", (), snap.log_unparsed)
        add("log_implausible_times_total", (), snap.log_implausible)
        add("log_last_line_timestamp_seconds", (), snap.log_last_line_time)
        add("log_rotations_total", (), snap.log_rotations)
        add("log_truncations_total", (), snap.log_truncations)
        add("log_oversized_lines_total", (), snap.log_oversized)
        add("log_unread_bytes_total", (), snap.log_unread_bytes)
    add("tracked_ranks", (), float(len(snap.ranks)))
    add("ranks_expired_total", (), snap.ranks_expired)
    add("evaluation_timestamp_seconds", (), snap.evaluated_at)
    add("build_info", (build.version, build.revision, build.python_version), 1.0)
    return [f for f in fams.values() if f.rows]


class TuningCollector(Collector):
    """Yields the catalog's families built from `snapshot()` on every collect().

    The evaluation families (signals, check verdicts, suggestions) change only when the guide is
    re-evaluated; `warm()` (called by the sidecar after each evaluation, off the request path)
    builds and renders them once, and scrapes reuse them until the next evaluation.
    """

    def __init__(self, snapshot: Callable[[], Snapshot], build: BuildInfo | None = None) -> None:
        self._snapshot = snapshot
        self._build = build or current_build()
        self._cached: tuple[tuple[float | None, str], tuple[Family, ...]] | None = None

    def describe(self) -> list[Metric]:
        """Nothing up front: keeps registration from calling collect() (state may not be ready)."""
        return []

    def _evaluation(self, snap: Snapshot) -> tuple[Family, ...]:
        key = (snap.evaluated_at, snap.model_name)
        cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1]
        fams = evaluation_families(snap)
        for f in fams:
            f.frozen_text = _sample_lines(f)
        self._cached = (key, fams)
        return fams

    def warm(self) -> None:
        """Build the evaluation families for the current state (call after an evaluation)."""
        self._evaluation(self._snapshot())

    def collect(self) -> Iterator[Metric]:
        """Families from a fresh snapshot."""
        snap = self._snapshot()
        yield from build_families(snap, self._build, self._evaluation(snap))


def make_registry(collector: TuningCollector, *extra: Collector, process: bool = True) -> CollectorRegistry:
    """A private registry: our collector and `extra` ones, then the process and platform metrics of
    prometheus_client (`process_*`, `python_info`; ProcessCollector reads /proc, so off Linux it adds nothing).

    `process=False` leaves them out where an exposition must not depend on the machine (golden files).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    for c in extra:
        registry.register(c)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return registry


def catalog_markdown() -> str:
    """The metric table for the docs, generated from the catalog."""
    rows = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for m in CATALOG:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        rows.append(f"| `{m.name}` | {m.type} | {labels} | {m.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
