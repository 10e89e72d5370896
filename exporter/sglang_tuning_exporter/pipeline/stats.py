"""Mergeable aggregates of a rank's samples: exact value histograms (plain or frozen for transfer),
per-kind sample statistics and the time bucket that holds them (pure)."""

from __future__ import annotations

import array
import bisect
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

# Builds a FrozenHist's (typecode, sorted values, cumulative counts) in one call: the C accelerator's
# freeze_hist, handed by the caller that loads it (the pipeline imports no source, and holds no global
# switch): the same result as FrozenHist.of's Python path, which tests hold it to.
Freezer = Callable[[dict[int, int]], tuple[str, bytes, bytes]]


class FrozenHist(Mapping[int, int]):
    """A read-only value -> count histogram held as sorted machine-int values and their cumulative
    counts.  It pickles as two byte strings (a diagnose worker's histograms reach the parent without
    a dict built value by value) and answers a quantile with one binary search.  Writers thaw it."""

    __slots__ = ("cum", "values_sorted")

    def __init__(self, values_sorted: array.array[int], cum: array.array[int]) -> None:
        self.values_sorted = values_sorted
        self.cum = cum

    @classmethod
    def of(cls, hist: dict[int, int], freezer: Freezer | None = None) -> FrozenHist:
        """The frozen copy of a histogram of int counts, built by `freezer` when given (OverflowError
        past int64; TypeError or ValueError when it is no such histogram)."""
        if freezer is not None:
            return cls.of_arrays(*freezer(hist))
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


def hist_pairs(h: Mapping[int, int]) -> Iterable[tuple[int, int]]:
    """(value, count) of a histogram, dict or FrozenHist, without building a dict."""
    return h.pairs() if type(h) is FrozenHist else h.items()


def _merge_counts(into: dict[int, int], add: Mapping[int, int]) -> None:
    if not into:
        into.update(hist_pairs(add))
        return
    for k, v in hist_pairs(add):
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

    def freeze(self, freezer: Freezer | None = None) -> None:
        """Hold the histograms as FrozenHists (cheap to pickle; built by `freezer` when given); no-op past
        int64 or when all are empty (four empty dicts pickle smaller than four empty FrozenHists)."""
        if self.frozen or not (self.queue or self.running or self.missed or self.capped_cand):
            return
        try:
            hists = [FrozenHist.of(h, freezer) for h in (self.queue, self.running, self.missed, self.capped_cand)]
        except (OverflowError, TypeError, ValueError):
            return  # not plain int counts: stays a dict
        self.queue, self.running, self.missed, self.capped_cand = hists  # type: ignore[assignment]
        self.frozen = True

    def thaw(self) -> None:
        """Make the histograms writable dicts again."""
        if self.frozen:
            self.queue, self.running, self.missed, self.capped_cand = (
                dict(hist_pairs(h)) for h in (self.queue, self.running, self.missed, self.capped_cand))
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
            for k, v in hist_pairs(sub):
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

    __slots__ = ("counts", "decode", "disabled_steps", "eager_passes", "graph_passes", "latency", "oom", "pools",
                 "prefill", "prefill_cached", "prefill_n", "prefill_new", "retracted", "retractions")

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
        # Latency histograms (scrape only): latency -> bucket upper bound -> requests in the cumulative bucket.
        self.latency: dict[str, dict[float, float]] = {}
        # Hybrid-pool sums of Decode lines (observations.pool_pairs): name -> sum.
        self.pools: dict[str, float] = {}
        # The counted event kinds (core/events.Count): observation name -> the amount counted.
        self.counts: dict[str, float] = {}

    def add_latency(self, latency: str, le: float, count: float) -> None:
        """Add requests to one cumulative bucket of a latency histogram."""
        h = self.latency.get(latency)
        if h is None:
            h = self.latency[latency] = {}
        h[le] = h.get(le, 0.0) + count

    def freeze(self, freezer: Freezer | None = None) -> None:
        """Hold the sample histograms as FrozenHists (see SampleStats.freeze)."""
        self.decode.freeze(freezer)
        self.prefill.freeze(freezer)

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
        for latency, h in o.latency.items():
            mine = self.latency.get(latency)
            if mine is None:
                self.latency[latency] = dict(h)
            else:
                for le, c in h.items():
                    mine[le] = mine.get(le, 0.0) + c
        for name, total in o.pools.items():
            self.pools[name] = self.pools.get(name, 0.0) + total
        for name, total in o.counts.items():
            self.counts[name] = self.counts.get(name, 0.0) + total

    def is_active(self) -> bool:
        """True when the bucket holds any sample or event."""
        return bool(self.decode.queue_n or self.decode.running_n or self.prefill.queue_n or self.retractions
                    or self.oom or self.prefill_n or self.graph_passes or self.eager_passes
                    or self.disabled_steps or self.pools or self.counts)


_Value = TypeVar("_Value", int, float)  # histogram keys: queue lengths (int) or batch sizes (float)


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


def bucket_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile of a cumulative histogram (upper bound -> count) as Prometheus'
    `histogram_quantile` computes it: buckets made monotonic, linear interpolation inside the bucket
    the rank falls in, the lowest bucket starting at 0 (its own bound when that is <= 0), the +Inf
    bucket answering the highest finite bound. None where PromQL answers NaN (no +Inf bucket, fewer
    than two buckets, no request)."""
    if math.isnan(q) or not buckets:
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bounds = sorted(buckets)
    if len(bounds) < 2 or bounds[-1] != math.inf:
        return None
    counts: list[float] = []
    top = 0.0
    for b in bounds:  # a restart between scrapes can leave a bucket below the one before: as PromQL, raise it
        top = max(top, buckets[b])
        counts.append(top)
    n = counts[-1]
    if n <= 0:
        return None
    rank = q * n
    i = bisect.bisect_left(counts, rank, 0, len(counts) - 1)
    if i == len(counts) - 1:
        return bounds[-2]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[i], counts[i]
    if i > 0:
        start = bounds[i - 1]
        count -= counts[i - 1]
        rank -= counts[i - 1]
    if count <= 0:
        return None  # q = 0 over an empty first bucket: PromQL's 0/0
    return start + (end - start) * (rank / count)
