"""SGLang /metrics text -> samples -> canonical observations (pure: no I/O, no clock).

Two layers: `parse_exposition` reads the Prometheus text format tolerantly (bad lines are counted,
never fatal) and `ScrapeInterpreter` maps SGLang's metric names, in either spelling (`sglang:x` or
`sglang_x`, or Ray Serve's `ray_sglang_x`) and across releases, to the observation names the log parser
also produces. Counters
become deltas between scrapes; a counter going backwards means SGLang restarted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.catalog import LATENCY_HISTOGRAMS
from sglang_tuning_exporter.core.model import Observation, Rank, latency_bucket_name

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^\s*({_NAME})\s*(\{{.*\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_NAME_RE = re.compile(_NAME)
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposition sample as written: raw name (any spelling), labels, value, 1-based line."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    line: int

    def label_map(self) -> dict[str, str]:
        """The labels as a dict."""
        return dict(self.labels)


@dataclass(frozen=True, slots=True)
class Exposition:
    """The result of parsing one /metrics body."""

    samples: tuple[Sample, ...]
    types: Mapping[str, str]
    garbage_lines: int  # lines that are neither comments, blank, nor valid samples
    lines: int
    sample_lines: int = 0  # sample lines seen, including those skipped by `keep`
    # What the limits cut (docs/sidecar.md, "Limits"): lines past MAX_EXPOSITION_LINE_CHARS (skipped,
    # not counted as garbage), label values cut to MAX_LABEL_VALUE_CHARS, samples past MAX_SCRAPE_SAMPLES.
    long_lines: int = 0
    clipped_labels: int = 0
    dropped_samples: int = 0


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value  # the usual label value: nothing to undo
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def _parse_labels(body: str, clipped: list[int]) -> tuple[tuple[str, str], ...] | None:
    inner = body[1:-1].strip()
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(inner):
        m = _LABEL_RE.match(inner, pos)
        if m is None:
            return None
        # e.g. a 256 KiB model_name would be copied onto every series we export
        value, cut = limits.clip_text(_unescape(m.group(2)))
        if cut:
            clipped[0] += 1
        labels.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(labels))


def _parse_value(text: str) -> float | None:
    try:
        return float(text)  # accepts NaN, +Inf, -Inf, exponents
    except ValueError:
        return None


def parse_exposition(text: str, keep: Callable[[str], bool] | None = None) -> Exposition:
    """Parse Prometheus text exposition; garbage lines are counted, never raised.

    `keep(name)`: when given, well-formed samples of other families are skipped unparsed (a scrape
    only needs a dozen of SGLang's hundreds of series); they still count in `sample_lines`. `keep`
    must be pure: it is asked once per distinct name.
    """
    samples: list[Sample] = []
    types: dict[str, str] = {}
    garbage = 0
    skipped = 0
    long_lines = dropped = 0
    clipped = [0]
    max_line, max_samples = limits.MAX_EXPOSITION_LINE_CHARS, limits.MAX_SCRAPE_SAMPLES
    unread_names: dict[str, bool] = {}  # name -> a well-formed name `keep` rejects
    # Label sets as written -> (parsed, values cut): families repeat one rank's label set.
    label_sets: dict[str, tuple[tuple[tuple[str, str], ...] | None, int]] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        stripped = line.strip()
        if not stripped:
            continue
        if len(stripped) > max_line:
            long_lines += 1  # bounded work per line whatever a hostile server sends
            continue
        if stripped.startswith("#"):
            parts = stripped.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        if keep is not None:
            head = stripped.split("{", 1)[0].split(None, 1)
            if not head:
                garbage += 1  # `{} 1`: a sample without a name
                continue
            name = head[0]
            unread = unread_names.get(name)
            if unread is None:
                # A family's lines (histogram buckets, one per rank) share the name: decide it once.
                unread = unread_names[name] = not keep(name) and _NAME_RE.fullmatch(name) is not None
            if unread and ("}" in stripped or "{" not in stripped):
                try:
                    float(stripped.rsplit(None, 1)[-1])  # `_parse_value` inline: a well-formed value
                except ValueError:
                    pass
                else:
                    skipped += 1
                    continue
        if len(samples) >= max_samples:
            dropped += 1  # past the cap: not even parsed (a line of a family we read, well-formed or not)
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            garbage += 1
            continue
        body = m.group(2)
        labels: tuple[tuple[str, str], ...] | None = ()
        if body:
            known = label_sets.get(body)
            if known is None:
                cut = [0]
                known = label_sets[body] = (_parse_labels(body, cut), cut[0])
            labels = known[0]
            clipped[0] += known[1]
        value = _parse_value(m.group(3))
        if labels is None or value is None:
            garbage += 1
            continue
        samples.append(Sample(m.group(1), labels, value, no))
    return Exposition(tuple(samples), types, garbage, len(lines), len(samples) + skipped + dropped,
                      long_lines, clipped[0], dropped)


# Under Ray Serve (0.5.15+, srt/observability/ray_wrappers.py) `sglang:x` is `sglang_x` with a `ReplicaId`
# label, which Ray's metrics agent exposes as `ray_sglang_x`.
RAY_PREFIX = "ray_"
REPLICA_LABEL = "ReplicaId"


def base_name(name: str) -> str | None:
    """`sglang:token_usage`, `sglang_token_usage` or `ray_sglang_token_usage` -> `token_usage`; None for
    other families."""
    if name.startswith(RAY_PREFIX):
        name = name[len(RAY_PREFIX):]
        return name[7:] if name.startswith("sglang_") and not name.startswith("sglang_tuning_") else None
    if name.startswith("sglang:"):
        return name[7:]
    if name.startswith("sglang_") and not name.startswith("sglang_tuning_"):
        return name[7:]
    return None


# Gauges that map one-to-one onto observation names (log parser vocabulary).
GAUGES: dict[str, str] = {
    "num_queue_reqs": "num_queue_reqs",
    "num_running_reqs": "num_running_reqs",
    "token_usage": "token_usage",
    "gen_throughput": "gen_throughput",
    "num_used_tokens": "num_used_tokens",
    "max_total_num_tokens": "max_total_num_tokens",
    "max_running_requests": "max_running_requests",  # 0.3.x only
    "context_len": "context_len",
    "startup_available_gpu_memory_gb": "available_gpu_mem_gb",
    "weight_memory_usage_gb": "weights_gb",  # 0.5.17+, set once at start-up
    "kv_cache_memory_usage_gb": "kv_cache_gb",  # 0.5.17+: the KV pools' size (the log's `KV Cache is allocated`)
}
# Hybrid models' per-pool gauges (full 0.5.10+, SWA 0.5.2+, mamba 0.5.5+, mamba state slots 0.5.12+), named
# as the Decode line's fields (the pipeline reads them as such a line: observations.scraped_pool_pairs).
POOL_GAUGES: dict[str, str] = {"full_token_usage": "full_token_usage", "swa_token_usage": "swa_token_usage",
                               "mamba_usage": "mamba_usage", "mamba_used_tokens": "mamba_num"}
# SGLang exports the SWA and mamba gauges at 0 on a model without that pool: a pool is there once its
# usage is above 0 or its slots (used + available, 0.5.12+) are.
_POOL_SLOTS: dict[str, str] = {"swa_used_tokens": "swa_token_usage", "swa_available_tokens": "swa_token_usage",
                               "mamba_used_tokens": "mamba_usage", "mamba_available_tokens": "mamba_usage"}
_POOL_READ = frozenset((*POOL_GAUGES, *_POOL_SLOTS))
_MAX_POOL_RANKS = 4096  # ranks whose pools the interpreter remembers; the oldest is forgotten first
# Gauges with one series per `phase` label summed into one observation per rank: the memory the captured
# graphs took (0.5.17+; phases prefill, decode, target_verify, draft_*), the log's capture `mem usage`.
PHASE_SUMS: dict[str, str] = {"graph_memory_usage_gb": "graph_memory_gb"}
# Counters (or cumulative gauges) turned into deltas: (base name, mode label or None) -> observation.
COUNTERS: dict[tuple[str, str | None], str] = {
    ("num_retracted_requests_total", None): "retraction",
    ("total_retracted_reqs", None): "retraction",  # 0.4.10-0.5.2: a cumulative gauge
    ("cuda_graph_passes_total", "decode_cuda_graph"): "decode_cuda_graph_passes",
    ("cuda_graph_passes_total", "decode_none"): "decode_eager_passes",
    ("realtime_tokens_total", "prefill_cache"): "prefill_cached_tokens",
    ("realtime_tokens_total", "prefill_compute"): "prefill_new_tokens",
    # PD prefill nodes' optimistic-prefill retries (0.5.8+): read and counted, no check judges them yet.
    ("num_prefill_retries_total", None): "prefill_retries",
}
COUNTED = frozenset(COUNTERS.values())  # observations that are counter deltas (the log has them line by line)
# Tokenizer-side counters: the prefill-token fallback before realtime_tokens_total (0.5.7).
TOKENIZER_COUNTERS = ("cached_tokens_total", "prompt_tokens_total")
# Known broken or misleading families (sglang-metrics.md): never read.
IGNORED = frozenset({"is_cuda_graph", "utilization", "num_retracted_reqs", "cache_hit_rate",
                     "max_running_requests_under_SLO"})
# Latency histograms (cumulative `_bucket` series, one per `le`) -> the latency they measure (docs/signals.md,
# declared in core/catalog): their bucket deltas reach the window as `latency_bucket_name` observations.
HISTOGRAMS = LATENCY_HISTOGRAMS
_BUCKET_FAMILIES = {f"{base}_bucket": latency for base, latency in HISTOGRAMS.items()}
_RANK_LABELS = (("dp_rank", "dp"), ("pp_rank", "pp"), ("tp_rank", "tp"), ("moe_ep_rank", "ep"))


_WANTED = frozenset((*GAUGES, *_POOL_READ, *PHASE_SUMS, *(k[0] for k in COUNTERS), *TOKENIZER_COUNTERS, *_BUCKET_FAMILIES))


def wanted(name: str) -> bool:
    """Whether the interpreter reads this family (the `keep` filter for parse_exposition)."""
    base = base_name(name)
    return base is not None and base in _WANTED


def rank_of(labels: Mapping[str, str]) -> Rank:
    """The scheduler rank named by SGLang's labels (absent or non-numeric -> None)."""
    values: dict[str, int] = {}
    for label, key in _RANK_LABELS:
        raw = labels.get(label, "").strip()
        # A rank is a small number: a 4300-digit label is not one (int() would raise past Python's limit).
        if 0 < len(raw) <= 9 and raw.lstrip("-").isdigit():
            values[key] = int(raw)
    return Rank.from_dict(values)


def replica_key(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """A Ray Serve replica and its SGLang DP rank (`ReplicaId`, `dp_rank`), or None off Ray."""
    replica = labels.get(REPLICA_LABEL, "")
    return (replica, labels.get("dp_rank", "")) if replica else None


def model_of(labels: Mapping[str, str]) -> str | None:
    """`model_name`, or `name` in the first metrics release (0.3.x)."""
    return labels.get("model_name") or labels.get("name") or None


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """What one scrape told us."""

    observations: tuple[Observation, ...]
    model_name: str | None
    restarted: bool  # a counter went backwards: SGLang restarted since the previous scrape
    garbage_lines: int
    samples: int


@dataclass(slots=True)
class ScrapeInterpreter:
    """Maps successive expositions to observations; remembers counters to produce deltas."""

    _last: dict[tuple[str, Rank], float] = field(default_factory=dict)
    # Each Ray Serve replica (and DP rank within it) is a data-parallel copy of the server: it gets a dp
    # index of its own, in the order first seen, kept so counters stay paired; at MAX_RAY_REPLICAS the oldest
    # is forgotten (replicas come and go), and an index is never given twice.
    _replicas: dict[tuple[str, str], int] = field(default_factory=dict)
    _next_replica: int = 0
    # Ranks whose SWA or mamba pool was seen (its usage gauge name): from then on its gauge counts, zeros too.
    _pools: dict[Rank, set[str]] = field(default_factory=dict)

    def _rank(self, labels: Mapping[str, str]) -> Rank:
        rank = rank_of(labels)
        key = replica_key(labels)
        if key is None:
            return rank
        dp = self._replicas.get(key)
        if dp is None:
            if len(self._replicas) >= limits.MAX_RAY_REPLICAS:
                del self._replicas[next(iter(self._replicas))]
            dp = self._replicas[key] = self._next_replica
            self._next_replica += 1
        return Rank(dp=dp, pp=rank.pp, tp=rank.tp, ep=rank.ep)

    def reset(self) -> None:
        """Forget counter baselines and the pools seen (e.g. after SGLang was found restarted by other means)."""
        self._last.clear()
        self._pools.clear()

    def interpret(self, exposition: Exposition, now: float) -> ScrapeResult:
        """Observations at time `now` from one exposition."""
        obs: list[Observation] = []
        totals: dict[tuple[str, Rank], float] = {}
        tokenizer: dict[str, float] = {}
        tokenizer_by_source: dict[str, dict[str, float]] = {}
        model: str | None = None
        seen_new_retraction_counter: set[Rank] = set()
        phase_sums: dict[tuple[str, Rank], float] = {}
        pools: dict[Rank, dict[str, float]] = {}  # rank -> its pool gauges (POOL_GAUGES) and slot sums
        # (latency, rank, le) -> cumulative count, summed over the labels that split it (is_streaming)
        hist: dict[tuple[str, Rank, float], float] = {}
        ranks: dict[tuple[tuple[str, str], ...], Rank] = {}  # label set -> rank: decided once per set

        def rank_of_set(label_set: tuple[tuple[str, str], ...], labels: Mapping[str, str]) -> Rank:
            rank = ranks.get(label_set)
            if rank is None:
                rank = ranks[label_set] = self._rank(labels)
            return rank

        for s in exposition.samples:
            base = base_name(s.name)
            if base is None or base in IGNORED:
                continue
            labels = s.label_map()
            if labels.get("priority", "") != "":
                continue  # per-priority breakdown: the total is the priority="" series
            model = model or model_of(labels)
            if base in GAUGES:
                if math.isfinite(s.value):
                    obs.append(Observation(now, GAUGES[base], s.value, rank_of_set(s.labels, labels), "metrics"))
                continue
            if base in _POOL_READ:
                if math.isfinite(s.value):
                    per_rank = pools.setdefault(rank_of_set(s.labels, labels), {})
                    if base in POOL_GAUGES:
                        per_rank[POOL_GAUGES[base]] = s.value
                    if base in _POOL_SLOTS:
                        slots = _POOL_SLOTS[base] + ":slots"
                        per_rank[slots] = per_rank.get(slots, 0.0) + s.value
                continue
            if base in PHASE_SUMS:
                if math.isfinite(s.value):
                    pk = (PHASE_SUMS[base], rank_of_set(s.labels, labels))
                    phase_sums[pk] = phase_sums.get(pk, 0.0) + s.value
                continue
            key = (base, labels.get("mode"))
            if key not in COUNTERS:
                key = (base, None)
            if key in COUNTERS:
                rank = rank_of_set(s.labels, labels)
                if base == "num_retracted_requests_total":
                    seen_new_retraction_counter.add(rank)
                name = COUNTERS[key]
                # The cumulative gauge is only a fallback for releases without the counter.
                tag = "legacy" if base == "total_retracted_reqs" else name
                k = (tag, rank)
                totals[k] = totals.get(k, 0.0) + s.value
                continue
            latency = _BUCKET_FAMILIES.get(base)
            if latency is not None:
                le = _parse_value(labels.get("le", ""))
                if le is not None and not math.isnan(le) and math.isfinite(s.value):
                    hk = (latency, rank_of_set(s.labels, labels), le)
                    hist[hk] = hist.get(hk, 0.0) + s.value
                continue
            if base in TOKENIZER_COUNTERS:
                source = labels.get("cache_source")
                if base == "cached_tokens_total" and source is not None:
                    tokenizer_by_source.setdefault(base, {})
                    d = tokenizer_by_source[base]
                    d[source] = d.get(source, 0.0) + s.value
                else:
                    tokenizer[base] = tokenizer.get(base, 0.0) + s.value
        obs.extend(Observation(now, name, v, rank, "metrics") for (name, rank), v in phase_sums.items())
        obs.extend(self._pool_gauges(pools, now))
        for base, by_source in tokenizer_by_source.items():
            # `total` when SGLang has no breakdown; otherwise sum the sources.
            tokenizer[base] = tokenizer.get(base, 0.0) + by_source.get(
                "total", sum(v for k, v in by_source.items() if k != "total"))
        has_realtime = any(tag in ("prefill_cached_tokens", "prefill_new_tokens") for tag, _ in totals)
        if not has_realtime and "cached_tokens_total" in tokenizer and "prompt_tokens_total" in tokenizer:
            cached = tokenizer["cached_tokens_total"]
            totals[("prefill_cached_tokens", Rank())] = cached
            totals[("prefill_new_tokens", Rank())] = max(0.0, tokenizer["prompt_tokens_total"] - cached)
        restarted = self._histogram_deltas(hist, now, obs)
        for (tag, rank), value in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            if not math.isfinite(value):
                continue
            if tag == "legacy" and rank in seen_new_retraction_counter:
                continue
            name = "retraction" if tag == "legacy" else tag
            prev = self._last.get((tag, rank))
            self._last[(tag, rank)] = value
            if prev is None:
                continue  # first sight: a baseline, not something that happened now
            delta = value - prev
            if delta < 0:
                restarted = True
                delta = value  # counter reset: everything since the restart is new
            if delta > 0:
                obs.append(Observation(now, name, delta, rank, "metrics"))
        return ScrapeResult(tuple(obs), model, restarted, exposition.garbage_lines,
                            max(exposition.sample_lines, len(exposition.samples)))

    def _pool_gauges(self, pools: Mapping[Rank, Mapping[str, float]], now: float) -> list[Observation]:
        """Each rank's pool gauges, those of a pool it has (see _POOL_SLOTS), as observations."""
        out: list[Observation] = []
        for rank, gauges in pools.items():
            seen = self._pools.get(rank)
            for usage in ("swa_token_usage", "mamba_usage"):
                if gauges.get(usage, 0.0) > 0 or gauges.get(usage + ":slots", 0.0) > 0:
                    if seen is None:
                        if len(self._pools) >= _MAX_POOL_RANKS:
                            del self._pools[next(iter(self._pools))]  # bounded: ranks come and go
                        seen = self._pools[rank] = set()
                    seen.add(usage)
            if not seen:
                continue  # a model without hybrid pools: nothing to read
            for name, value in gauges.items():
                if name == "full_token_usage" or (name == "mamba_num" and "mamba_usage" in seen) or name in seen:
                    out.append(Observation(now, name, value, rank, "metrics"))
        return out

    def _histogram_deltas(self, hist: Mapping[tuple[str, Rank, float], float], now: float,
                          obs: list[Observation]) -> bool:
        """Each bucket's requests since the previous scrape (zeros too: the histogram is exported);
        whether a bucket went backwards (SGLang restarted: its whole count is new)."""
        restarted = False
        for (latency, rank, le), value in sorted(hist.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            key = (latency_bucket_name(latency, le), rank)
            prev = self._last.get(key)
            self._last[key] = value
            if prev is None:
                continue  # first sight: a baseline
            delta = value - prev
            if delta < 0:
                restarted = True
                delta = value
            obs.append(Observation(now, key[0], delta, rank, "metrics"))
        return restarted
