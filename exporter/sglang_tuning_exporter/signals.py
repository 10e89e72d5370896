"""Guide signals over a sliding window of observations, per rank (see docs/signals.md).

Pure: time is whatever the observations and the caller's `now` say.  A signal is `None`
(unknown) when the window holds too few samples to judge it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from .model import Observation, Rank

# Per-sample values of a Decode line (or a scrape); observations of one line share a time.
SAMPLE_NAMES = frozenset({"num_queue_reqs", "num_running_reqs", "token_usage", "gen_throughput",
                          "num_used_tokens", "cuda_graph"})
# One observation = one thing that happened (value = its size).
EVENT_NAMES = frozenset({"retraction", "oom_prefill", "oom_decode", "oom_startup", "oom_unknown",
                         "oom_capture", "prefill_new_tokens", "prefill_cached_tokens",
                         "decode_cuda_graph_passes", "decode_eager_passes"})
# Facts stated once (startup lines, server info): kept while the rank lives, not windowed.
FACT_NAMES = frozenset({"available_gpu_mem_gb", "avail_mem_after_pool_gb", "gpu_mem_total_gb", "weights_gb",
                        "max_total_num_tokens", "max_running_requests", "cuda_graph_max_bs_captured",
                        "chunked_prefill_size", "context_len", "metrics_enabled"})
# Facts that differ between TP ranks of one replica: keep the worst when folding TP ranks.
_FACT_MIN = frozenset({"available_gpu_mem_gb", "avail_mem_after_pool_gb", "gpu_mem_total_gb"})
_FACT_MAX = frozenset({"weights_gb"})

# Which sample count decides whether a signal is known (the advisor applies check.min_samples to it).
SAMPLE_COUNT_OF: dict[str, str] = {
    "queue_empty_ratio": "queue_samples", "queue_over_band_ratio": "queue_samples",
    "queue_under_band_ratio": "queue_samples", "queue_p50": "queue_samples",
    "kv_underused_ratio": "kv_samples", "token_usage_max": "kv_samples", "token_usage_mean": "kv_samples",
    "cuda_graph_miss_ratio": "graph_samples", "cuda_graph_miss_batch_p90": "graph_samples",
    "decode_batch_p90": "decode_samples", "running_max": "decode_samples",
    "running_capped_ratio": "decode_samples", "prefix_cache_hit_ratio": "prefill_samples",
}

# Signals the Window computes (plus the *_samples counts); docs/signals.md describes each.
SIGNAL_NAMES = (
    "queue_empty_ratio", "queue_over_band_ratio", "queue_under_band_ratio", "queue_p50",
    "kv_underused_ratio", "token_usage_max", "token_usage_mean", "retractions_per_minute",
    "retracted_requests_per_minute", "cuda_graph_miss_ratio", "cuda_graph_miss_batch_p90",
    "decode_batch_p90", "running_max", "running_capped_ratio", "prefix_cache_hit_ratio",
    "oom_prefill_count", "oom_decode_count", "oom_startup_count", "oom_unknown_count", "oom_capture_count",
    "available_gpu_mem_gb", "available_gpu_mem_from_summary", "gpu_mem_total_gb", "weights_gb",
    "max_total_num_tokens", "max_running_requests", "cuda_graph_max_bs_captured", "cuda_graph_ceiling_ratio",
    "chunked_prefill_size", "context_len", "metrics_enabled", "gen_throughput_mean",
    "decode_samples", "queue_samples", "kv_samples", "graph_samples", "prefill_samples",
)


@dataclass(frozen=True, slots=True)
class SignalParams:
    """Thresholds that shape the signals themselves (from the guide profile and config)."""

    queue_band: tuple[float, float] = (100.0, 2000.0)
    usage_good: float = 0.9  # the guide's `token usage > 0.9 means good utilization`
    capped_fraction: float = 0.95  # running >= 95 % of max_running_requests counts as capped
    min_samples: int = 3  # below this a windowed ratio is unknown


@dataclass(slots=True)
class _Sample:
    time: float
    queue: float | None = None
    running: float | None = None
    usage: float | None = None
    graph: float | None = None
    throughput: float | None = None


@dataclass(slots=True)
class _RankState:
    first_seen: float
    last_seen: float
    samples: deque[_Sample] = field(default_factory=deque)
    events: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    facts: dict[str, float] = field(default_factory=dict)
    pending: _Sample | None = None
    pending_names: set[str] = field(default_factory=set)
    from_log: bool = False
    last_event_key: dict[str, tuple[float, float, frozenset[int | None]]] = field(default_factory=dict)


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in 0-1) of a non-empty list."""
    ordered = sorted(values)
    idx = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


def _fold(rank: Rank) -> Rank:
    # TP/EP ranks of one DP replica print the same batch numbers: one series per (dp, pp).
    return Rank(dp=rank.dp, pp=rank.pp)


class Window:
    """Sliding window of observations per rank; `signals(now)` gives the guide's signals."""

    def __init__(self, length_s: float = 600.0, max_ranks: int = 256, *,
                 params: SignalParams | None = None, expire_s: float | None = None,
                 fold_tp: bool = True) -> None:
        if length_s <= 0:
            raise ValueError("window length must be positive")
        self.length_s = float(length_s)
        self.max_ranks = max(1, int(max_ranks))
        self.params = params or SignalParams()
        self.expire_s = 3 * self.length_s if expire_s is None else expire_s
        self.fold_tp = fold_tp
        self.expired = 0  # ranks dropped for staleness or the cap
        self._ranks: dict[Rank, _RankState] = {}

    # ---------------------------------------------------------------- input
    def ranks(self) -> list[Rank]:
        """The ranks currently tracked."""
        return sorted(self._ranks)

    def _state(self, rank: Rank, t: float) -> _RankState:
        st = self._ranks.get(rank)
        if st is None:
            if len(self._ranks) >= self.max_ranks:
                oldest = min(self._ranks, key=lambda r: self._ranks[r].last_seen)
                del self._ranks[oldest]
                self.expired += 1
            st = _RankState(first_seen=t, last_seen=t)
            self._ranks[rank] = st
        return st

    def add(self, obs: Observation) -> None:
        """Add one observation (any order of names; a sample's values share a time)."""
        if not math.isfinite(obs.value) or not math.isfinite(obs.time):
            return
        rank = _fold(obs.rank) if self.fold_tp else obs.rank
        st = self._state(rank, obs.time)
        st.last_seen = max(st.last_seen, obs.time)
        st.first_seen = min(st.first_seen, obs.time)
        if obs.source == "log":
            st.from_log = True
        name = obs.name
        if name in SAMPLE_NAMES:
            p = st.pending
            if p is not None and (p.time != obs.time or name in st.pending_names):
                self._commit(st)
                p = None
            if p is None:
                p = st.pending = _Sample(obs.time)
            st.pending_names.add(name)
            if name == "num_queue_reqs":
                p.queue = obs.value
            elif name == "num_running_reqs":
                p.running = obs.value
            elif name == "token_usage":
                p.usage = obs.value
            elif name == "cuda_graph":
                p.graph = obs.value
            elif name == "gen_throughput":
                p.throughput = obs.value
        elif name in EVENT_NAMES:
            if self.fold_tp and name in ("retraction", "oom_prefill", "oom_decode", "oom_startup",
                                         "oom_unknown", "oom_capture") and obs.rank.tp is not None:
                # The same event printed by every TP rank of the replica counts once.
                prev = st.last_event_key.get(name)
                if prev is not None and prev[0] == obs.time and prev[1] == obs.value and obs.rank.tp not in prev[2]:
                    st.last_event_key[name] = (prev[0], prev[1], prev[2] | {obs.rank.tp})
                    return
                st.last_event_key[name] = (obs.time, obs.value, frozenset({obs.rank.tp}))
            st.events.setdefault(name, deque()).append((obs.time, obs.value))
        elif name in FACT_NAMES:
            old = st.facts.get(name)
            if old is not None and name in _FACT_MIN and obs.rank.tp is not None:
                st.facts[name] = min(old, obs.value)
            elif old is not None and name in _FACT_MAX and obs.rank.tp is not None:
                st.facts[name] = max(old, obs.value)
            else:
                st.facts[name] = obs.value

    def add_all(self, observations: Iterable[Observation]) -> None:
        """Add many observations."""
        for o in observations:
            self.add(o)

    @staticmethod
    def _commit(st: _RankState) -> None:
        if st.pending is not None:
            st.samples.append(st.pending)
            st.pending = None
            st.pending_names.clear()

    def prune(self, now: float) -> None:
        """Drop samples older than the window and ranks not seen for `expire_s`."""
        start = now - self.length_s
        for rank in list(self._ranks):
            st = self._ranks[rank]
            if now - st.last_seen > self.expire_s:
                del self._ranks[rank]
                self.expired += 1
                continue
            while st.samples and st.samples[0].time < start:
                st.samples.popleft()
            for dq in st.events.values():
                while dq and dq[0][0] < start:
                    dq.popleft()

    # ---------------------------------------------------------------- output
    def signals(self, now: float) -> dict[Rank, dict[str, float | None]]:
        """Every signal for every tracked rank at `now` (prunes first)."""
        for st in self._ranks.values():
            self._commit(st)
        self.prune(now)
        return {rank: self._rank_signals(st, now) for rank, st in sorted(self._ranks.items())}

    def _rank_signals(self, st: _RankState, now: float) -> dict[str, float | None]:
        p = self.params
        start = now - self.length_s
        low, high = p.queue_band
        out: dict[str, float | None] = dict.fromkeys(SIGNAL_NAMES)
        queues: list[float] = []
        running: list[float] = []
        usages: list[float] = []
        kv_n = kv_under = 0
        graph_n = graph_miss = 0
        missed_bs: list[float] = []
        throughput: list[float] = []
        capped_n = capped = 0
        max_running = st.facts.get("max_running_requests")
        for s in st.samples:
            if s.time < start or s.time > now:
                continue
            if s.queue is not None:
                queues.append(s.queue)
            if s.running is not None:
                running.append(s.running)
            if s.throughput is not None:
                throughput.append(s.throughput)
            if s.usage is not None and s.queue is not None:
                kv_n += 1
                usages.append(s.usage)
                if s.usage < p.usage_good and s.queue > 0:
                    kv_under += 1
            if s.graph is not None:
                graph_n += 1
                if s.graph < 0.5:
                    graph_miss += 1
                    if s.running is not None:
                        missed_bs.append(s.running)
            if max_running and s.running is not None and s.queue is not None and s.usage is not None:
                capped_n += 1
                if s.running >= p.capped_fraction * max_running and s.queue > 0 and s.usage < p.usage_good:
                    capped += 1
        enough = p.min_samples
        out["queue_samples"] = float(len(queues))
        out["decode_samples"] = float(len(running))
        out["kv_samples"] = float(kv_n)
        if len(queues) >= enough:
            nq = len(queues)
            out["queue_empty_ratio"] = sum(1 for q in queues if q == 0) / nq
            out["queue_over_band_ratio"] = sum(1 for q in queues if q > high) / nq
            out["queue_under_band_ratio"] = sum(1 for q in queues if q < low) / nq
            out["queue_p50"] = quantile(queues, 0.5)
        if kv_n >= enough:
            out["kv_underused_ratio"] = kv_under / kv_n
            out["token_usage_max"] = max(usages)
            out["token_usage_mean"] = sum(usages) / kv_n
        if len(running) >= enough:
            out["decode_batch_p90"] = quantile(running, 0.9)
            out["running_max"] = max(running)
        if throughput:
            out["gen_throughput_mean"] = sum(throughput) / len(throughput)
        if capped_n >= enough:
            out["running_capped_ratio"] = capped / capped_n
        # CUDA graph coverage: exact counters (scrape) win over sampled Decode lines.
        passes = self._sum(st, "decode_cuda_graph_passes", start, now)
        eager = self._sum(st, "decode_eager_passes", start, now)
        if passes + eager > 0:
            out["graph_samples"] = passes + eager
            out["cuda_graph_miss_ratio"] = eager / (passes + eager)
        else:
            out["graph_samples"] = float(graph_n)
            if graph_n >= enough:
                out["cuda_graph_miss_ratio"] = graph_miss / graph_n
        if missed_bs:
            out["cuda_graph_miss_batch_p90"] = quantile(missed_bs, 0.9)
        new = self._sum(st, "prefill_new_tokens", start, now)
        cached = self._sum(st, "prefill_cached_tokens", start, now)
        n_prefill = self._count(st, "prefill_new_tokens", start, now)
        out["prefill_samples"] = float(n_prefill)
        if n_prefill >= enough and new + cached > 0:
            out["prefix_cache_hit_ratio"] = cached / (new + cached)
        active = bool(running or queues or st.events)
        if active:
            span_min = max(1.0, min(self.length_s, now - st.first_seen) / 60.0)
            out["retractions_per_minute"] = self._count(st, "retraction", start, now) / span_min
            out["retracted_requests_per_minute"] = self._sum(st, "retraction", start, now) / span_min
        if st.from_log:
            # OOMs are only observable from the log; metrics-only ranks leave them unknown.
            for phase in ("prefill", "decode", "startup", "unknown", "capture"):
                out[f"oom_{phase}_count"] = float(self._count(st, f"oom_{phase}", start, now))
        f = st.facts
        for name in ("gpu_mem_total_gb", "weights_gb", "max_total_num_tokens", "max_running_requests",
                     "cuda_graph_max_bs_captured", "chunked_prefill_size", "context_len", "metrics_enabled"):
            out[name] = f.get(name)
        if "available_gpu_mem_gb" in f:
            out["available_gpu_mem_gb"] = f["available_gpu_mem_gb"]
            out["available_gpu_mem_from_summary"] = 1.0
        elif "avail_mem_after_pool_gb" in f:
            out["available_gpu_mem_gb"] = f["avail_mem_after_pool_gb"]
            out["available_gpu_mem_from_summary"] = 0.0
        captured, cap = f.get("cuda_graph_max_bs_captured"), f.get("max_running_requests")
        if captured is not None and cap:
            out["cuda_graph_ceiling_ratio"] = captured / cap
        return out

    @staticmethod
    def _sum(st: _RankState, name: str, start: float, now: float) -> float:
        dq = st.events.get(name)
        return sum(v for t, v in dq if start <= t <= now) if dq else 0.0

    @staticmethod
    def _count(st: _RankState, name: str, start: float, now: float) -> int:
        dq = st.events.get(name)
        return sum(1 for t, _ in dq if start <= t <= now) if dq else 0
