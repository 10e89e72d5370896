"""The sliding window: per rank, a deque of time buckets (`resolution_s` wide) holding mergeable
aggregates; adding is O(1), pruning pops whole buckets, and `diagnose` merges buckets built in its
workers (`add_bucket`).  `signals(now)` gives every rank's signals (pipeline/signals.py)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sglang_tuning_exporter.core.model import (
    LATENCY_PREFIX,
    Observation,
    Rank,
    Sample,
    finite_number,
    parse_latency_bucket,
)
from sglang_tuning_exporter.pipeline.signals import (
    COUNT_NAMES,
    EVENT_NAMES,
    FACT_NAMES,
    FACTS_KEPT_MAX,
    FACTS_KEPT_MIN,
    PREFILL_SAMPLE_NAMES,
    SAMPLE_NAMES,
    SCRAPED_POOL,
    SERVER_START,
    SignalParams,
    compute_signals,
    share_server_latency,
)
from sglang_tuning_exporter.pipeline.stats import Bucket


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


@dataclass(frozen=True, slots=True)
class RankPart:
    """One rank's share of a window filled elsewhere (diagnose's workers): its buckets (oldest first),
    the times it was seen between, and its de-duplication state, for another window's `add_bucket` and
    `carry_event_key`."""

    rank: Rank
    first_seen: float
    last_seen: float
    buckets: tuple[tuple[float, Bucket], ...]
    event_keys: Mapping[str, EventKey]


_COUNTED = frozenset(COUNT_NAMES)


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


def bucket_start(t: float, resolution_s: float, origin_s: float = 0.0) -> float:
    """The start of the window bucket holding time `t` (the window's rule, shared with diagnose)."""
    return math.floor((t - origin_s) / resolution_s) * resolution_s + origin_s


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
        self.origin_s = 0.0  # bucket starts are origin_s + k * resolution_s (diagnose ends its grid at the log's end)
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
        start = bucket_start(t, self.resolution_s, self.origin_s)
        b = st.buckets
        if b and b[-1][0] == start:
            return b[-1][1]
        if not b or b[-1][0] < start:
            if b:
                # Sealed: its histograms become compact arrays (a writer of late data thaws it again).
                b[-1][1].freeze()
            nb = Bucket()
            b.append((start, nb))
            return nb
        # Late data (rare live; diagnose's ranges add their retractions after their lines): an older
        # bucket changes, so the sums kept for signals() start over. Found (or placed) by bisection.
        st.summed = None
        lo, hi = 0, len(b)
        while lo < hi:
            mid = (lo + hi) // 2
            if b[mid][0] < start:
                lo = mid + 1
            else:
                hi = mid
        if b[lo][0] == start:  # lo < len(b): the newest bucket starts after `start`
            return b[lo][1]
        nb = Bucket()
        b.insert(lo, (start, nb))
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
            counted = name in _COUNTED
            if self.fold_tp and (counted or name == "retraction" or name.startswith("oom_")) and obs.rank.tp is not None:
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
            elif counted:
                b.counts[name] = b.counts.get(name, 0.0) + obs.value
            else:  # a hybrid-pool sum (POOL_EVENT_NAMES); a scrape's kept apart (SCRAPED_POOL)
                key = name if obs.source == "log" else SCRAPED_POOL + name
                b.pools[key] = b.pools.get(key, 0.0) + obs.value
        elif name.startswith(LATENCY_PREFIX):
            bucket = parse_latency_bucket(name)
            if bucket is not None:
                self._bucket(st, obs.time).add_latency(bucket[0], bucket[1], obs.value)
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
        pairs = tuple((name, finite_number(v)) for name, v in s.pairs())
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
                    if start == bucket_start(o.time, self.resolution_s, self.origin_s):
                        seen[id(o.rank)] = (o.rank, o.time, st, bucket)

    def set_fact(self, rank: Rank, name: str, value: float, *, tp: int | None = None,
                 time: float | None = None) -> None:
        """Record a startup fact for an (already folded) rank."""
        st = self._ranks.get(rank)
        if st is None:
            st = self._state(rank, time if time is not None else 0.0)
        old = st.facts.get(name)
        if old is not None and name in FACTS_KEPT_MIN and tp is not None:
            st.facts[name] = min(old, value)
        elif old is not None and name in FACTS_KEPT_MAX and tp is not None:
            st.facts[name] = max(old, value)
        else:
            st.facts[name] = value

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

    def hand_over(self, *, keep_open: bool = False) -> list[RankPart]:
        """Every rank's buckets (pending samples committed), span and de-duplication state: what a
        window filled over one range of a log hands to the window that merges the ranges.
        `keep_open`: a sample the next line may still complete stays out (see `open_samples`)."""
        if not keep_open:
            for st in self._ranks.values():
                self._commit(st)
        return [RankPart(rank, st.first_seen, st.last_seen, tuple(st.buckets), dict(st.last_event_key))
                for rank, st in self._ranks.items()]

    def open_samples(self) -> dict[Rank, _Pending]:
        """The samples still open (a partial line the next line of the same time may complete)."""
        return {rank: st.pending for rank, st in self._ranks.items() if st.pending is not None}

    def reopen(self, samples: Mapping[Rank, _Pending]) -> None:
        """Take over another window's open samples: the next chunk of a log completes them as one
        window reading the whole log would."""
        for rank, p in samples.items():
            self._state(rank, p.time).pending = p

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
        out = {rank: self._rank_signals(rank, st, now) for rank, st in sorted(self._ranks.items())}
        share_server_latency(out)
        return out

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
