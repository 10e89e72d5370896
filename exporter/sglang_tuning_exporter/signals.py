"""Guide signals over a sliding window of observations, per rank (see docs/signals.md).

Pure: time is whatever the observations and the caller's `now` say.  A signal is `None`
(unknown) when the window holds too few samples to judge it.

The window keeps, per rank, a deque of time buckets (`resolution_s` wide) holding mergeable
aggregates: counts and exact value histograms.  Adding is O(1), pruning pops whole buckets, and
`diagnose` can build buckets in worker processes and merge them here (`add_bucket`).
"""

from __future__ import annotations

import array
import bisect
import itertools
import math
import operator
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .accel import SCAN
from .model import Observation, Rank, Sample

# Per-sample values of a Decode line (or a scrape); observations of one line share a time.
SAMPLE_NAMES = frozenset({"num_queue_reqs", "num_running_reqs", "token_usage", "gen_throughput",
                          "num_used_tokens", "cuda_graph"})
# The same values from a Prefill line: used only for ranks without Decode samples (PD prefill nodes).
PREFILL_SAMPLE_NAMES = {"prefill_num_queue_reqs": "num_queue_reqs",
                        "prefill_num_running_reqs": "num_running_reqs",
                        "prefill_token_usage": "token_usage"}
OOM_PHASES = ("prefill", "decode", "startup", "unknown", "capture")
# One observation = one thing that happened (value = its size).
EVENT_NAMES = frozenset({"retraction", *(f"oom_{p}" for p in OOM_PHASES), "prefill_new_tokens",
                         "prefill_cached_tokens", "decode_cuda_graph_passes", "decode_eager_passes",
                         "cuda_graph_disabled_steps"})
# Facts stated once (startup lines, server info): kept until the next startup, not windowed.
FACT_NAMES = frozenset({"available_gpu_mem_gb", "avail_mem_after_pool_gb", "gpu_mem_total_gb", "weights_gb",
                        "max_total_num_tokens", "max_running_requests", "cuda_graph_max_bs_captured",
                        "chunked_prefill_size", "context_len", "metrics_enabled", "avail_after_weights_gb",
                        "kv_cache_gb", "cuda_graph_gb"})
SERVER_START = "server_start"  # a `server_args` line: the observation that resets startup facts
# Facts that differ between TP ranks of one replica: keep the worst when folding TP ranks.
_FACT_MIN = frozenset({"available_gpu_mem_gb", "avail_mem_after_pool_gb", "gpu_mem_total_gb",
                       "avail_after_weights_gb"})
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
    *(f"oom_{p}_count" for p in OOM_PHASES),
    "available_gpu_mem_gb", "available_gpu_mem_from_summary", "gpu_mem_total_gb", "weights_gb",
    "max_total_num_tokens", "max_running_requests", "cuda_graph_max_bs_captured", "cuda_graph_ceiling_ratio",
    "chunked_prefill_size", "context_len", "metrics_enabled", "gen_throughput_mean", "kv_cache_gb",
    "cuda_graph_gb",
    "mem_fraction_static_estimate", "cuda_graph_disabled_steps",
    "decode_samples", "queue_samples", "kv_samples", "graph_samples", "prefill_samples",
)


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


@dataclass(frozen=True, slots=True)
class SignalParams:
    """Thresholds that shape the signals themselves (from the guide profile and config)."""

    queue_band: tuple[float, float] = (100.0, 2000.0)
    usage_good: float = 0.9  # the guide's `token usage > 0.9 means good utilization`
    capped_fraction: float = 0.95  # running >= 95 % of max_running_requests counts as capped
    min_samples: int = 3  # below this a windowed ratio is unknown


class FrozenHist(Mapping[int, int]):
    """A read-only value -> count histogram held as sorted machine-int values and their cumulative
    counts.  It pickles as two byte strings (a diagnose worker's histograms reach the parent without
    a dict built value by value) and answers a quantile with one binary search.  Writers thaw it."""

    __slots__ = ("cum", "values_sorted")

    def __init__(self, values_sorted: array.array[int], cum: array.array[int]) -> None:
        self.values_sorted = values_sorted
        self.cum = cum

    @classmethod
    def of(cls, hist: dict[int, int]) -> FrozenHist:
        """The frozen copy of a histogram of int counts (OverflowError past int64; TypeError or
        ValueError when it is no such histogram)."""
        if SCAN is not None:
            return cls.of_arrays(*SCAN.freeze_hist(hist))
        if not all(type(k) is int and type(c) is int and c > 0 for k, c in hist.items()):
            raise TypeError("a histogram of positive int counts")
        ordered = sorted(hist)
        return cls(array.array("q", ordered), array.array("q", itertools.accumulate(map(hist.__getitem__, ordered))))

    @classmethod
    def of_arrays(cls, code: str, values: bytes, cum: bytes) -> FrozenHist:
        """From the C accelerator's (typecode, sorted values, cumulative counts) byte strings."""
        vals, counts = array.array(code), array.array(code)
        vals.frombytes(values)
        counts.frombytes(cum)
        return cls(vals, counts)

    def __getitem__(self, key: int) -> int:
        vals = self.values_sorted
        try:
            i = bisect.bisect_left(vals, key)
        except TypeError:
            raise KeyError(key) from None  # not a number: absent, as in a dict
        if i == len(vals) or vals[i] != key:
            raise KeyError(key)
        return self.cum[i] - (self.cum[i - 1] if i else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(self.values_sorted)

    def __len__(self) -> int:
        return len(self.values_sorted)

    def __reduce__(self) -> tuple[type[FrozenHist], tuple[array.array[int], array.array[int]]]:
        return FrozenHist, (self.values_sorted, self.cum)

    def pairs(self) -> Iterator[tuple[int, int]]:
        """(value, count) in value order."""
        cum = self.cum
        return zip(self.values_sorted, map(operator.sub, cum, itertools.chain((0,), cum)), strict=False)

    def total(self) -> int:
        """The sum of the counts."""
        return self.cum[-1] if self.cum else 0


def _pairs(h: Mapping[int, int]) -> Iterable[tuple[int, int]]:
    return h.pairs() if type(h) is FrozenHist else h.items()


def _merge_counts(into: dict[int, int], add: Mapping[int, int]) -> None:
    if not into:
        into.update(_pairs(add))
        return
    for k, v in _pairs(add):
        into[k] = into.get(k, 0) + v


def hist_max(hist: Mapping[int, int]) -> int:
    """The largest value of a non-empty histogram."""
    return hist.values_sorted[-1] if type(hist) is FrozenHist else max(hist)


def hist_at_least(hist: Mapping[int, int], floor: float) -> int:
    """The count of values >= floor."""
    if type(hist) is FrozenHist:
        i = bisect.bisect_left(hist.values_sorted, floor)
        return hist.total() - (hist.cum[i - 1] if i else 0)
    return sum(map(hist.__getitem__, filter(floor.__le__, hist)))


class SampleStats:
    """Mergeable statistics of batch samples (queue, running, usage, graph, throughput)."""

    __slots__ = ("capped_base", "capped_cand", "frozen", "graph_miss", "graph_n", "kv_n", "kv_under", "missed",
                 "queue", "queue_n", "queue_over", "queue_under", "queue_zero", "running", "running_n", "tp_n",
                 "tp_sum", "usage_max", "usage_sum")


    def __init__(self) -> None:
        self.queue_n = 0
        self.queue_zero = 0
        self.queue_over = 0  # above the band's high end
        self.queue_under = 0  # below the band's low end
        self.queue: dict[int, int] = {}  # queue length -> count (for the median)
        self.running_n = 0
        self.running: dict[int, int] = {}
        self.kv_n = 0
        self.kv_under = 0
        self.usage_sum = 0.0
        self.usage_max = -1.0
        self.graph_n = 0
        self.graph_miss = 0
        self.missed: dict[int, int] = {}
        self.tp_n = 0
        self.tp_sum = 0.0
        self.capped_base = 0  # samples with running, queue and usage
        self.capped_cand: dict[int, int] = {}  # running values of those with queue > 0 and usage < good
        self.frozen = False  # the four histograms are FrozenHists (read-only): writers thaw them first

    def freeze(self) -> None:
        """Hold the histograms as FrozenHists (cheap to pickle); no-op past int64 or when all are empty
        (four empty dicts pickle smaller than four empty FrozenHists)."""
        if self.frozen or not (self.queue or self.running or self.missed or self.capped_cand):
            return
        try:
            hists = [FrozenHist.of(h) for h in (self.queue, self.running, self.missed, self.capped_cand)]
        except (OverflowError, TypeError, ValueError):
            return  # not plain int counts: stays a dict
        self.queue, self.running, self.missed, self.capped_cand = hists  # type: ignore[assignment]
        self.frozen = True

    def thaw(self) -> None:
        """Make the histograms writable dicts again."""
        if self.frozen:
            self.queue, self.running, self.missed, self.capped_cand = (
                dict(_pairs(h)) for h in (self.queue, self.running, self.missed, self.capped_cand))
            self.frozen = False

    def add(self, queue: float | None, running: float | None, usage: float | None, graph: float | None,
            throughput: float | None, usage_good: float, band: tuple[float, float]) -> None:
        """Add one sample; None = the line did not have that field."""
        if self.frozen:
            self.thaw()
        if queue is not None:
            self.queue_n += 1
            if queue == 0:
                self.queue_zero += 1
            if queue > band[1]:
                self.queue_over += 1
            elif queue < band[0]:
                self.queue_under += 1
            k = int(queue)
            h = self.queue
            h[k] = h.get(k, 0) + 1
        if running is not None:
            self.running_n += 1
            r = int(running)
            h = self.running
            h[r] = h.get(r, 0) + 1
        if usage is not None and queue is not None:
            self.kv_n += 1
            self.usage_sum += usage
            if usage > self.usage_max:
                self.usage_max = usage
            under = usage < usage_good and queue > 0
            if under:
                self.kv_under += 1
            if running is not None:
                self.capped_base += 1
                if under:
                    r = int(running)
                    h = self.capped_cand
                    h[r] = h.get(r, 0) + 1
        if graph is not None:
            self.graph_n += 1
            if graph < 0.5:
                self.graph_miss += 1
                if running is not None:
                    r = int(running)
                    h = self.missed
                    h[r] = h.get(r, 0) + 1
        if throughput is not None:
            self.tp_n += 1
            self.tp_sum += throughput

    def add_text_columns(self, running: Sequence[str], usage: Sequence[str | None], graph: Sequence[str | None],
                         throughput: Sequence[str | None], queue: Sequence[str], usage_good: float,
                         band: tuple[float, float]) -> None:
        """add_columns of text fields as the diagnose regexes capture them (graph 'True'/'False', and
        None or "" when absent)."""
        self.add_columns(list(map(int, running)), [None if u is None else float(u) for u in usage],
                         [None if not g else g == "True" for g in graph],
                         [float(x) if x else None for x in throughput], list(map(int, queue)), usage_good, band)

    def add_columns(self, running: Sequence[int], usage: Sequence[float | None], graph: Sequence[bool | None],
                    throughput: Sequence[float | None], queue: Sequence[int], usage_good: float,
                    band: tuple[float, float]) -> None:
        """Add many Decode samples at once (aligned columns; running and queue always present, None =
        the line did not have that field): the same result as `add` per sample, with C-level builtins."""
        if self.frozen:
            self.thaw()
        n = len(queue)
        if n == 0:
            return
        qs, rs = queue, running
        self.queue_n += n
        counts = Counter(qs)
        self.queue_zero += counts.get(0, 0)
        self.queue_over += sum(c for q, c in counts.items() if q > band[1])
        self.queue_under += sum(c for q, c in counts.items() if q < band[0])
        _merge_counts(self.queue, counts)
        self.running_n += n
        _merge_counts(self.running, Counter(rs))
        if None in usage:
            rows = [(q, r, u) for q, r, u in zip(qs, rs, usage, strict=True) if u is not None]
            qk, rk, us = [q for q, _, _ in rows], [r for _, r, _ in rows], [u for _, _, u in rows]
        else:
            qk, rk, us = qs, rs, usage  # type: ignore[assignment]
        if us:
            self.kv_n += len(us)
            self.capped_base += len(us)
            self.usage_sum += sum(us)
            self.usage_max = max(self.usage_max, max(us))
            low = map(operator.lt, us, itertools.repeat(usage_good))
            waiting = map(operator.gt, qk, itertools.repeat(0))
            under = list(itertools.compress(rk, map(operator.and_, low, waiting)))
            self.kv_under += len(under)
            _merge_counts(self.capped_cand, Counter(under))
        ng = n - graph.count(None)
        if ng:
            self.graph_n += ng
            misses = list(itertools.compress(rs, map(operator.is_, graph, itertools.repeat(False))))
            self.graph_miss += len(misses)
            _merge_counts(self.missed, Counter(misses))
        tps = [x for x in throughput if x is not None]
        self.tp_n += len(tps)
        self.tp_sum += sum(tps)

    def add_totals(self, totals: Mapping[str, float], queue: Mapping[int, int], running: Mapping[int, int],
                   missed: Mapping[int, int], capped: Mapping[int, int]) -> None:
        """Add samples already summed elsewhere (the C accelerator's accumulator, which does what `add`
        does per sample): counts and sums by field name, and the four value histograms (FrozenHists
        are adopted as they are by stats that hold no sample yet)."""
        hists = (queue, running, missed, capped)
        adopt = (not (self.queue or self.running or self.missed or self.capped_cand)
                 and all(type(h) is FrozenHist for h in hists))
        if self.frozen and not adopt:
            self.thaw()
        t = totals
        self.queue_n += int(t["queue_n"])
        self.queue_zero += int(t["queue_zero"])
        self.queue_over += int(t["queue_over"])
        self.queue_under += int(t["queue_under"])
        self.running_n += int(t["running_n"])
        self.kv_n += int(t["kv_n"])
        self.kv_under += int(t["kv_under"])
        self.usage_sum += t["usage_sum"]
        if t["usage_max"] > self.usage_max:
            self.usage_max = t["usage_max"]
        self.capped_base += int(t["capped_base"])
        self.graph_n += int(t["graph_n"])
        self.graph_miss += int(t["graph_miss"])
        self.tp_n += int(t["tp_n"])
        self.tp_sum += t["tp_sum"]
        if adopt:
            self.queue, self.running, self.missed, self.capped_cand = hists  # type: ignore[assignment]
            self.frozen = True
            return
        _merge_counts(self.queue, queue)
        _merge_counts(self.running, running)
        _merge_counts(self.missed, missed)
        _merge_counts(self.capped_cand, capped)

    def merge(self, o: SampleStats) -> None:
        """Add another aggregate into this one."""
        if self.frozen:
            self.thaw()
        _merge_counts(self.queue, o.queue)
        _merge_counts(self.running, o.running)
        _merge_counts(self.missed, o.missed)
        _merge_counts(self.capped_cand, o.capped_cand)
        self.merge_scalars(o)

    def subtract_histograms(self, o: SampleStats) -> None:
        """Remove the value histograms of `o` (merged into this one earlier); scalars are left alone."""
        if self.frozen:
            self.thaw()
        for into, sub in ((self.queue, o.queue), (self.running, o.running), (self.missed, o.missed),
                          (self.capped_cand, o.capped_cand)):
            for k, v in _pairs(sub):
                left = into[k] - v
                if left:
                    into[k] = left
                else:
                    del into[k]

    def merge_scalars(self, o: SampleStats) -> None:
        """Add the counts and sums of `o` (not its histograms)."""
        self.queue_n += o.queue_n
        self.queue_zero += o.queue_zero
        self.queue_over += o.queue_over
        self.queue_under += o.queue_under
        self.running_n += o.running_n
        self.kv_n += o.kv_n
        self.kv_under += o.kv_under
        self.usage_sum += o.usage_sum
        if o.usage_max > self.usage_max:
            self.usage_max = o.usage_max
        self.graph_n += o.graph_n
        self.graph_miss += o.graph_miss
        self.tp_n += o.tp_n
        self.tp_sum += o.tp_sum
        self.capped_base += o.capped_base


class Bucket:
    """Everything that happened on one rank in one time bucket (mergeable)."""

    __slots__ = ("decode", "disabled_steps", "eager_passes", "graph_passes", "oom", "prefill", "prefill_cached",
                 "prefill_n", "prefill_new", "retracted", "retractions")

    def __init__(self) -> None:
        self.decode = SampleStats()
        self.prefill = SampleStats()  # samples from Prefill lines
        self.retractions: float = 0  # log lines, or retracted requests a scrape delta stands for
        self.retracted = 0.0
        self.oom: dict[str, int] = {}
        self.prefill_new = 0.0
        self.prefill_cached = 0.0
        self.prefill_n = 0
        self.graph_passes = 0.0
        self.eager_passes = 0.0
        # Eager decode steps SGLang's cuda_graph_warner reported (5 per warning): evidence, not a ratio.
        self.disabled_steps = 0.0

    def freeze(self) -> None:
        """Hold the sample histograms as FrozenHists (see SampleStats.freeze)."""
        self.decode.freeze()
        self.prefill.freeze()

    def copy(self) -> Bucket:
        """An independent copy."""
        c = Bucket()
        c.merge(self)
        return c

    def merge(self, o: Bucket) -> None:
        """Add another bucket into this one."""
        self.decode.merge(o.decode)
        self.prefill.merge(o.prefill)
        self._merge_own(o)

    def merge_scalars(self, o: Bucket) -> None:
        """Add everything of `o` except the value histograms of its sample stats."""
        self.decode.merge_scalars(o.decode)
        self.prefill.merge_scalars(o.prefill)
        self._merge_own(o)

    def _merge_own(self, o: Bucket) -> None:
        self.retractions += o.retractions
        self.retracted += o.retracted
        for k, v in o.oom.items():
            self.oom[k] = self.oom.get(k, 0) + v
        self.prefill_new += o.prefill_new
        self.prefill_cached += o.prefill_cached
        self.prefill_n += o.prefill_n
        self.graph_passes += o.graph_passes
        self.eager_passes += o.eager_passes
        self.disabled_steps += o.disabled_steps

    def is_active(self) -> bool:
        """True when the bucket holds any sample or event."""
        return bool(self.decode.queue_n or self.decode.running_n or self.prefill.queue_n or self.retractions
                    or self.oom or self.prefill_n or self.graph_passes or self.eager_passes
                    or self.disabled_steps)


@dataclass(slots=True)
class _Pending:
    time: float
    prefill: bool
    names: set[str] = field(default_factory=set)
    queue: float | None = None
    running: float | None = None
    usage: float | None = None
    graph: float | None = None
    throughput: float | None = None


@dataclass(slots=True)
class _WindowSum:
    """The merge of a run of a rank's buckets (all but its newest), kept between evaluations.

    Counts and histograms are exact integers, so buckets leaving the window are subtracted; the
    float sums are re-added in bucket order instead, so the result equals a fresh merge bit for bit."""

    members: list[Bucket]  # oldest first; never a rank's newest bucket, so only late data changes them
    total: Bucket
    scalars_stale: bool = False


EventKey = tuple[float, float, frozenset[int | None]]  # (time, value, TP ranks) of the last counted event


@dataclass(slots=True)
class _RankState:
    first_seen: float
    last_seen: float
    buckets: deque[tuple[float, Bucket]] = field(default_factory=deque)
    facts: dict[str, float] = field(default_factory=dict)
    pending: _Pending | None = None
    from_log: bool = False
    last_event_key: dict[str, EventKey] = field(default_factory=dict)
    summed: _WindowSum | None = None


_Value = TypeVar("_Value", int, float)  # histogram keys: queue lengths (int) or batch sizes (float)


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in 0-1) of a non-empty list."""
    ordered = sorted(values)
    idx = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


def hist_quantile(hist: Mapping[_Value, int], q: float) -> float | None:
    """Nearest-rank quantile of a value -> count histogram (the first value whose cumulative count
    reaches rank ceil(q * n); cumulative sums and the search run at C level)."""
    if type(hist) is FrozenHist:
        n = hist.total()
        if n == 0:
            return None
        fk = hist.values_sorted
        i = bisect.bisect_left(hist.cum, max(1, math.ceil(q * n)))
        return float(fk[i] if i < len(fk) else fk[-1])
    n = sum(hist.values())
    if n == 0:
        return None
    need = max(1, math.ceil(q * n))
    keys = sorted(hist)
    cum = list(itertools.accumulate(map(hist.__getitem__, keys)))
    i = bisect.bisect_left(cum, need)
    return float(keys[i] if i < len(keys) else keys[-1])


def tp_dedup(prev: EventKey | None, t: float, value: float, tp: int) -> tuple[bool, EventKey]:
    """The same event printed by every TP rank of a replica counts once: whether this print counts,
    and the replica's state after it (the one rule for the window and diagnose's workers)."""
    if prev is not None and prev[0] == t and prev[1] == value and tp not in prev[2]:
        return False, (t, value, prev[2] | {tp})
    return True, (t, value, frozenset({tp}))


def server_facts_for(by_dp: Sequence[Mapping[str, float]], dp: int | None) -> Mapping[str, float]:
    """A rank's share of the server-info facts (one mapping per DP rank; a single one serves all)."""
    if not by_dp:
        return {}
    return by_dp[dp] if dp is not None and 0 <= dp < len(by_dp) else by_dp[0]


def bucket_start(t: float, resolution_s: float) -> float:
    """The start of the window bucket holding time `t` (the window's rule, shared with diagnose)."""
    return math.floor(t / resolution_s) * resolution_s


def fold_rank(rank: Rank) -> Rank:
    """TP/EP ranks of one DP replica print the same batch numbers: one series per (dp, pp)."""
    return Rank(dp=rank.dp, pp=rank.pp)


class Window:
    """Sliding window of observations per rank; `signals(now)` gives the guide's signals."""

    def __init__(self, length_s: float = 600.0, max_ranks: int = 256, *,
                 params: SignalParams | None = None, expire_s: float | None = None,
                 fold_tp: bool = True, resolution_s: float | None = None) -> None:
        if length_s <= 0 or (resolution_s is not None and resolution_s <= 0):
            raise ValueError("window length and resolution must be positive")
        self.length_s = float(length_s)
        # 60 buckets per window (10 s for 10 min): signals() merges at most ~60 buckets per rank.
        self.resolution_s = float(resolution_s) if resolution_s is not None else self.length_s / 60.0
        self.max_ranks = max(1, int(max_ranks))
        self.params = params or SignalParams()
        self.expire_s = 3 * self.length_s if expire_s is None else expire_s
        self.fold_tp = fold_tp
        self.expired = 0  # ranks dropped for staleness or the cap
        self._ranks: dict[Rank, _RankState] = {}
        self._folded: dict[Rank, Rank] = {}  # rank -> its folded rank (bounded in _fold)
        self._server_facts: tuple[Mapping[str, float], ...] = ()  # set_server_facts

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
        else:
            if t > st.last_seen:
                st.last_seen = t
            if t < st.first_seen:
                st.first_seen = t
        return st

    def _fold(self, rank: Rank) -> Rank:
        if not self.fold_tp:
            return rank
        folded = self._folded.get(rank)
        if folded is None:
            if len(self._folded) >= 4 * self.max_ranks:
                self._folded.clear()  # bounded: ranks come and go
            folded = self._folded[rank] = fold_rank(rank)
        return folded

    def _bucket(self, st: _RankState, t: float) -> Bucket:
        start = bucket_start(t, self.resolution_s)
        b = st.buckets
        if b and b[-1][0] == start:
            return b[-1][1]
        if not b or b[-1][0] < start:
            nb = Bucket()
            b.append((start, nb))
            return nb
        # Late data (rare): an older bucket changes, so the sums kept for signals() start over.
        st.summed = None
        for s, bucket in reversed(b):  # merge into its bucket
            if s == start:
                return bucket
        nb = Bucket()
        b.append((start, nb))
        b2 = sorted(b, key=lambda x: x[0])
        b.clear()
        b.extend(b2)
        return nb

    def add(self, obs: Observation) -> None:
        """Add one observation (any order of names; a sample's values share a time)."""
        if not math.isfinite(obs.value) or not math.isfinite(obs.time):
            return
        rank = self._fold(obs.rank)
        st = self._state(rank, obs.time)
        if obs.source == "log":
            st.from_log = True
        name = obs.name
        prefill = name in PREFILL_SAMPLE_NAMES
        if prefill or name in SAMPLE_NAMES:
            self._sample_value(st, PREFILL_SAMPLE_NAMES.get(name, name), obs.value, obs.time, prefill)
        elif name in EVENT_NAMES:
            if self.fold_tp and (name == "retraction" or name.startswith("oom_")) and obs.rank.tp is not None:
                counts, st.last_event_key[name] = tp_dedup(st.last_event_key.get(name), obs.time, obs.value,
                                                           obs.rank.tp)
                if not counts:
                    return
            b = self._bucket(st, obs.time)
            if name == "retraction":
                # A log line is one retraction; a scrape's counter delta is that many retracted
                # requests, the most retractions it can stand for (as PromQL's rate reads it).
                b.retractions += 1 if obs.source == "log" else obs.value
                b.retracted += obs.value
            elif name.startswith("oom_"):
                b.oom[name] = b.oom.get(name, 0) + 1
            elif name == "prefill_new_tokens":
                b.prefill_new += obs.value
                b.prefill_n += 1
            elif name == "prefill_cached_tokens":
                b.prefill_cached += obs.value
            elif name == "decode_cuda_graph_passes":
                b.graph_passes += obs.value
            elif name == "decode_eager_passes":
                b.eager_passes += obs.value
            elif name == "cuda_graph_disabled_steps":
                b.disabled_steps += obs.value
        elif name in FACT_NAMES:
            self.set_fact(rank, name, obs.value, tp=obs.rank.tp, time=obs.time)
        elif name == SERVER_START:
            self.new_startup()

    def new_startup(self) -> None:
        """A new server start (its `server_args` line): the startup facts of the last one no longer hold.
        Windowed data stays: it happened within the window."""
        for rank in list(self._ranks):
            st = self._ranks[rank]
            st.facts.clear()
            if not st.buckets and st.pending is None:
                del self._ranks[rank]  # a rank known only by its facts

    def _sample_value(self, st: _RankState, key: str, value: float, t: float, prefill: bool) -> None:
        # Values of one line share a time; a repeated name (or a new time) starts the next sample.
        p = st.pending
        if p is not None and (p.time != t or key in p.names or p.prefill != prefill):
            self._commit(st)
            p = None
        if p is None:
            p = st.pending = _Pending(t, prefill)
        p.names.add(key)
        if key == "num_queue_reqs":
            p.queue = value
        elif key == "num_running_reqs":
            p.running = value
        elif key == "token_usage":
            p.usage = value
        elif key == "cuda_graph":
            p.graph = value
        elif key == "gen_throughput":
            p.throughput = value

    def add_sample(self, s: Sample) -> None:
        """Add one line's sample: the same result as `add` of each of its observations, in one step."""
        t = s.time
        if not math.isfinite(t):
            return
        if s.new_tokens is not None or s.cached_tokens is not None:
            self._add_tokens(s, t)
        q, r, u = s.queue, s.running, s.usage
        # The common line: every field present and finite (the sum is finite only when each value is).
        if (q is not None and r is not None and u is not None
                and (s.prefill or (s.throughput is not None and s.used is not None and s.graph is not None))
                and math.isfinite(q + r + u + (0.0 if s.prefill else s.throughput + s.used + s.graph))  # type: ignore[operator]
                and self._add_complete(s, t)):
            return
        # Non-finite values are dropped, as `add` drops such observations.
        pairs = tuple((name, _finite(v)) for name, v in s.pairs())
        names = [name for name, v in pairs if v is not None]
        if not names:
            return
        st = self._state(self._fold(s.rank), t)
        if s.source == "log":
            st.from_log = True
        prefill = s.prefill
        p = st.pending
        if p is not None and p.time == t and p.prefill == prefill and names[0] not in p.names:
            for name, v in pairs:  # rare: the line completes a partial sample
                if v is not None:
                    self._sample_value(st, name, v, t, prefill)
            return
        if p is not None:
            self._commit(st)
        q, r, u = pairs[0][1], pairs[1][1], pairs[2][1]
        tp, g = (None, None) if prefill else (pairs[3][1], pairs[5][1])
        if len(names) == len(pairs):
            # Every field present: any later value of this rank starts a new sample, so commit now.
            b = self._bucket(st, t)
            (b.prefill if prefill else b.decode).add(q, r, u, g, tp, self.params.usage_good,
                                                     self.params.queue_band)
        else:
            st.pending = _Pending(t, prefill, set(names), q, r, u, g, tp)

    def _add_tokens(self, s: Sample, t: float) -> None:
        # As `add` of prefill_new_tokens then prefill_cached_tokens observations.
        for new, v in ((True, s.new_tokens), (False, s.cached_tokens)):
            if v is None or not math.isfinite(v):
                continue
            st = self._state(self._fold(s.rank), t)
            if s.source == "log":
                st.from_log = True
            b = self._bucket(st, t)
            if new:
                b.prefill_new += v
                b.prefill_n += 1
            else:
                b.prefill_cached += v

    def _add_complete(self, s: Sample, t: float) -> bool:
        # Every field present: any later value of this rank starts a new sample, so commit now.
        # False (nothing done) when the line's first value would still join a partial pending sample.
        rank = s.rank
        folded = self._folded.get(rank) if self.fold_tp else rank
        st = self._state(folded if folded is not None else self._fold(rank), t)
        p = st.pending
        if p is not None:
            if p.time == t and p.prefill == s.prefill and "num_queue_reqs" not in p.names:
                return False
            self._commit(st)
        if s.source == "log":
            st.from_log = True
        b = self._bucket(st, t)
        if s.prefill:
            b.prefill.add(s.queue, s.running, s.usage, None, None, self.params.usage_good, self.params.queue_band)
        else:
            b.decode.add(s.queue, s.running, s.usage, s.graph, s.throughput, self.params.usage_good,
                         self.params.queue_band)
        return True

    def add_items(self, items: Iterable[Observation | Sample]) -> None:
        """Add observations and samples, in order: the same result as `add`/`add_sample` one by one.

        A poll's lines share a time, so each rank's state and bucket are looked up once per call
        (by Rank object: the converter hands out one object per rank)."""
        seen: dict[int, tuple[Rank, float, _RankState, Bucket]] = {}  # id(rank) -> rank (kept alive), t, ...
        shape = (len(self._ranks), self.expired)
        good, band = self.params.usage_good, self.params.queue_band
        finite = math.isfinite
        for o in items:
            if not isinstance(o, Sample):
                self.add(o)
                if (len(self._ranks), self.expired) != shape:
                    seen.clear()  # a rank was created or evicted: cached states may be gone
                    shape = (len(self._ranks), self.expired)
                continue
            t, rank, prefill, q, r, u, tp, used, g, source, nt, ct = o  # one unpack: read once per line
            hit = seen.get(id(rank))
            if (hit is not None and hit[1] == t and q is not None and r is not None and u is not None
                    and source == "log" and hit[2].pending is None):
                if prefill:
                    if finite(q + r + u) and (nt is None or finite(nt)) and (ct is None or finite(ct)):
                        b = hit[3]
                        if nt is not None:
                            b.prefill_new += nt
                            b.prefill_n += 1
                        if ct is not None:
                            b.prefill_cached += ct
                        b.prefill.add(q, r, u, None, None, good, band)
                        continue
                elif tp is not None and used is not None and g is not None and finite(q + r + u + tp + used + g):
                    hit[3].decode.add(q, r, u, g, tp, good, band)
                    continue
            self.add_sample(o)
            now_shape = (len(self._ranks), self.expired)
            if now_shape != shape:
                seen.clear()  # a rank was created or evicted: cached states may be gone
                shape = now_shape
            if o.source == "log" and math.isfinite(o.time):
                st = self._ranks.get(self._fold(o.rank))
                if st is not None and st.pending is None and st.from_log and st.buckets:
                    start, bucket = st.buckets[-1]
                    if start == math.floor(o.time / self.resolution_s) * self.resolution_s:
                        seen[id(o.rank)] = (o.rank, o.time, st, bucket)

    def set_fact(self, rank: Rank, name: str, value: float, *, tp: int | None = None,
                 time: float | None = None) -> None:
        """Record a startup fact for an (already folded) rank."""
        st = self._ranks.get(rank)
        if st is None:
            st = self._state(rank, time if time is not None else 0.0)
        old = st.facts.get(name)
        if old is not None and name in _FACT_MIN and tp is not None:
            st.facts[name] = min(old, value)
        elif old is not None and name in _FACT_MAX and tp is not None:
            st.facts[name] = max(old, value)
        else:
            st.facts[name] = value

    def add_all(self, observations: Iterable[Observation]) -> None:
        """Add many observations."""
        for o in observations:
            self.add(o)

    def add_bucket(self, rank: Rank, start: float, bucket: Bucket, *, from_log: bool = True,
                   first: float | None = None, last: float | None = None) -> None:
        """Merge a pre-aggregated bucket (built elsewhere, e.g. in a worker) for `rank`."""
        rank = self._fold(rank)
        st = self._state(rank, start if first is None else first)
        if last is not None and last > st.last_seen:
            st.last_seen = last
        st.from_log = st.from_log or from_log
        b = st.buckets
        if not b or b[-1][0] < start:
            b.append((start, bucket))  # adopt: the caller hands the bucket over
        else:
            self._bucket(st, start).merge(bucket)

    def carry_event_key(self, rank: Rank, name: str, key: EventKey) -> None:
        """The de-duplication state after events of `rank` summed elsewhere (diagnose's workers)."""
        st = self._ranks.get(self._fold(rank))
        if st is not None:
            st.last_event_key[name] = key

    def _commit(self, st: _RankState) -> None:
        p = st.pending
        if p is not None:
            b = self._bucket(st, p.time)
            stats = b.prefill if p.prefill else b.decode
            stats.add(p.queue, p.running, p.usage, p.graph, p.throughput, self.params.usage_good,
                      self.params.queue_band)
            st.pending = None

    def prune(self, now: float) -> None:
        """Drop buckets older than the window and ranks not seen for `expire_s`; a stale rank's startup
        facts stay until the next startup (they describe the running server, not recent traffic)."""
        start = now - self.length_s
        for rank in list(self._ranks):
            st = self._ranks[rank]
            if now - st.last_seen > self.expire_s:
                if st.facts:
                    if st.buckets or st.pending is not None:
                        self.expired += 1
                        st.buckets.clear()
                        st.pending = None
                        st.summed = None
                    continue
                del self._ranks[rank]
                self.expired += 1
                continue
            b = st.buckets
            while b and b[0][0] < start:
                b.popleft()

    # ---------------------------------------------------------------- output
    def signals(self, now: float) -> dict[Rank, dict[str, float | None]]:
        """Every signal for every tracked rank at `now` (prunes first)."""
        for st in self._ranks.values():
            self._commit(st)
        self.prune(now)
        return {rank: self._rank_signals(rank, st, now) for rank, st in sorted(self._ranks.items())}

    def set_server_facts(self, by_dp: Sequence[Mapping[str, float]]) -> None:
        """Startup facts from the server-info document, one mapping per DP rank: each rank's fallback
        for the facts its own log lines did not give (without a log, the only source). Adds no rank."""
        self._server_facts = tuple(by_dp)

    def _rank_signals(self, rank: Rank, st: _RankState, now: float) -> dict[str, float | None]:
        p = self.params
        start = now - self.length_s
        inside = [b for s, b in st.buckets if start <= s <= now]
        if len(inside) == 1:
            total = inside[0]  # read only: no copy needed
        elif len(inside) <= 3:
            total = Bucket()
            for b in inside:
                total.merge(b)
        else:
            total = self._sum_of(st, inside[:-1]).copy()  # the same as merging them all afresh
            total.merge(inside[-1])
        facts = st.facts
        if self._server_facts:
            facts = {**server_facts_for(self._server_facts, rank.dp), **facts}
        return compute_signals(total, facts, p, span_s=min(self.length_s, max(0.0, now - st.first_seen)),
                               from_log=st.from_log)


    @staticmethod
    def _sum_of(st: _RankState, sealed: list[Bucket]) -> Bucket:
        """The merge of `sealed` (oldest first), reusing the previous evaluation's merge."""
        ws = st.summed
        if ws is not None:
            members = ws.members
            first = sealed[0]
            i = next((k for k, b in enumerate(members) if b is first), -1)
            kept = members[i:] if i >= 0 else []
            if i < 0 or len(kept) > len(sealed) or any(b is not sealed[k] for k, b in enumerate(kept)):
                ws = None  # reordered or merged buckets: start over
            elif i > 0:
                for b in members[:i]:  # left the window: take their histograms out
                    ws.total.decode.subtract_histograms(b.decode)
                    ws.total.prefill.subtract_histograms(b.prefill)
                ws.members = kept
                ws.scalars_stale = True
        if ws is None:
            ws = st.summed = _WindowSum([], Bucket())
        total = ws.total
        if ws.scalars_stale:
            # Float sums are not subtracted (rounding would show): add them up again in order.
            fresh = Bucket()
            for b in ws.members:
                fresh.merge_scalars(b)
            for mine, theirs in ((fresh.decode, total.decode), (fresh.prefill, total.prefill)):
                mine.queue, mine.running, mine.missed, mine.capped_cand = (
                    theirs.queue, theirs.running, theirs.missed, theirs.capped_cand)
            ws.total = total = fresh
            ws.scalars_stale = False
        for b in sealed[len(ws.members):]:
            total.merge(b)
            ws.members.append(b)
        return total


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
        out[FEW + "queue_min"] = float(min(k for k, _ in _pairs(s.queue)))
        out[FEW + "queue_max"] = float(hist_max(s.queue))
    if s.kv_n:
        out[FEW + "kv_samples"] = float(s.kv_n)
        out[FEW + "kv_underused_ratio"] = s.kv_under / s.kv_n
        out[FEW + "token_usage_max"] = s.usage_max
    if s.running_n:
        out[FEW + "decode_samples"] = float(s.running_n)
        out[FEW + "running_min"] = float(min(k for k, _ in _pairs(s.running)))
        out[FEW + "running_max"] = float(hist_max(s.running))
    if s.graph_n:
        out[FEW + "graph_samples"] = float(s.graph_n)
        out[FEW + "cuda_graph_miss_ratio"] = s.graph_miss / s.graph_n
    return out


def compute_signals(total: Bucket, facts: dict[str, float], p: SignalParams, *, span_s: float,
                    from_log: bool) -> dict[str, float | None]:
    """The signals of one rank from its merged window bucket and its startup facts (pure)."""
    out: dict[str, float | None] = dict.fromkeys(SIGNAL_NAMES)
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
    if total.is_active():
        minutes = max(1.0, span_s / 60.0)
        out["retractions_per_minute"] = total.retractions / minutes
        out["retracted_requests_per_minute"] = total.retracted / minutes
    if from_log:
        # OOMs are only observable from the log; metrics-only ranks leave them unknown.
        for phase in OOM_PHASES:
            out[f"oom_{phase}_count"] = float(total.oom.get(f"oom_{phase}", 0))
    for name in ("gpu_mem_total_gb", "weights_gb", "max_total_num_tokens", "max_running_requests",
                 "cuda_graph_max_bs_captured", "chunked_prefill_size", "context_len", "metrics_enabled",
                 "kv_cache_gb", "cuda_graph_gb"):
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
    return out
