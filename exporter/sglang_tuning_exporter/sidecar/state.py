"""The sidecar's live state: what the collector and the status page read, as immutable snapshots.

All mutation goes through `LiveState` methods that take `now` explicitly (no clock here). The
loop thread writes, HTTP threads call `snapshot()`; one lock keeps the two consistent.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.catalog import RANK_GAUGES
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Finding, Observation, Rank, Sample, ServerState
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.pipeline.observations import COUNT_OF, count_amount, oom_phase
from sglang_tuning_exporter.pipeline.signals import FACT_NAMES
from sglang_tuning_exporter.pipeline.window import server_facts_for
from sglang_tuning_exporter.sources.scrape import COUNTED

SOURCES = ("log", "metrics", "server_info")
# Observation names kept as "latest value" gauges per rank: exactly the ones the collector exports.
GAUGE_NAMES = frozenset(obs for _, obs, _ in RANK_GAUGES)
# The counted event kinds (observations.COUNT_OF) each add to their counter `<name>_total`.
_COUNTED_KINDS = frozenset({"decode", "retract", "prefill", "oom", *COUNT_OF})
_DECODE_TRUE, _DECODE_FALSE, _DECODE_UNKNOWN = (("decode_samples", v) for v in ("true", "false", "unknown"))
_PREFILL_KEYS = (("num_new_tokens", ("prefill_tokens", "new")), ("num_cached_tokens", ("prefill_tokens", "cached")))


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Health of one input source."""

    enabled: bool
    up: bool | None = None  # None: not attempted yet
    duration_s: float | None = None
    last_attempt: float | None = None
    detail: str = ""
    last_ok: float | None = None  # when it last worked: what it gave since is stale while it is down
    down_since: float | None = None  # the first failed attempt of the current outage


@dataclass(frozen=True, slots=True)
class RankSnapshot:
    """Everything we expose for one rank."""

    rank: Rank
    last_seen: float
    gauges: Mapping[str, float]
    counters: Mapping[tuple[str, str], float]  # (family, extra label value) -> total


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent copy of the live state at one instant."""

    now: float
    model_name: str
    version: str | None
    args: Mapping[str, Any]
    ranks: tuple[RankSnapshot, ...]
    sources: Mapping[str, SourceStatus]
    log_lines: Mapping[str, float]
    log_unparsed: float
    log_implausible: float
    log_rotations: float
    log_truncations: float
    log_oversized: float
    log_last_line_time: float | None
    ranks_expired: float
    restarts: float
    scrape_garbage: float
    scrape_samples: float | None
    server_info_endpoint: str | None
    signals: tuple[tuple[Rank, Mapping[str, float]], ...]  # keyed by the window's ranks (TP folded)
    findings: tuple[Finding, ...]
    document: Callable[[], Mapping[str, Any]] | None  # built on demand (only /api/findings needs it)
    evaluated_at: float | None
    window_s: float
    source_failures: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (source, reason)
    input_truncations: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (source, limit)
    log_unread_bytes: float = 0.0
    # `--from-start` read the whole file and no line came since: the log time it ended at (judged there).
    log_replay_end: float | None = None

    @property
    def up(self) -> bool:
        """The SGLang /metrics scrape worked at its last attempt."""
        return bool(self.sources["metrics"].up)


@dataclass(slots=True)
class _RankData:
    last_seen: float
    gauges: dict[str, float] = field(default_factory=dict)


def rank_key(rank: Rank) -> tuple[int, ...]:
    """Sort key for ranks (None dimensions first; Rank's own ordering cannot compare None with int)."""
    return tuple(-1 if v is None else v for v in (rank.dp, rank.pp, rank.tp, rank.ep))


class LiveState:
    """Mutable live state guarded by one lock; read through `snapshot()`."""

    def __init__(self, *, window_s: float, max_ranks: int, expire_after_s: float,
                 enabled: Mapping[str, bool]) -> None:
        self._lock = threading.Lock()
        self.window_s = window_s
        self.max_ranks = max_ranks
        self.expire_after_s = expire_after_s
        self._ranks: dict[Rank, _RankData] = {}
        self._rank_of: dict[tuple[tuple[str, int], ...], Rank] = {}  # event rank dict -> Rank (bounded below)
        # Counters outlive rank expiry so they stay monotonic for the life of the process.
        self._counters: dict[Rank, dict[tuple[str, str], float]] = {}
        self._sources = {s: SourceStatus(enabled=bool(enabled.get(s, False))) for s in SOURCES}
        self._server = ServerState()
        self._server_facts: tuple[Mapping[str, float], ...] = ()  # set_server_facts
        self._model_from_metrics: str | None = None
        self._log_lines: dict[str, float] = {}
        self._log_unparsed = 0.0
        self._log_implausible = 0.0
        self._rotations = 0.0
        self._truncations = 0.0
        self._oversized = 0.0
        self._unread_bytes = 0.0
        self._failures: dict[tuple[str, str], float] = {}
        self._truncations_by: dict[tuple[str, str], float] = {}
        self._last_line_time: float | None = None
        self._replay_end: float | None = None
        self._expired = 0.0
        self._restarts = 0.0
        self._garbage = 0.0
        self._scrape_samples: float | None = None
        self._endpoint: str | None = None
        self._signals: dict[Rank, dict[str, float]] = {}
        self._findings: tuple[Finding, ...] = ()
        self._document: Callable[[], Mapping[str, Any]] | None = None
        self._evaluated_at: float | None = None

    # --- ranks -------------------------------------------------------------------------------
    def _touch(self, rank: Rank, now: float) -> _RankData:
        data = self._ranks.get(rank)
        if data is None:
            if len(self._ranks) >= self.max_ranks:
                # Bounded: evict the least recently seen rank to make room. The dict is kept in the order
                # ranks were last seen (below), so that is the first: O(1), not a scan per new rank (a
                # scrape naming 3000 ranks past a 256 cap took seconds of scans).
                del self._ranks[next(iter(self._ranks))]
                self._expired += 1
            data = self._ranks[rank] = _RankData(last_seen=now)
        elif now > data.last_seen:
            data.last_seen = now
            self._ranks[rank] = self._ranks.pop(rank)  # to the end: the most recently seen
        return data

    def _new_startup(self) -> None:
        for r in list(self._ranks):
            data = self._ranks[r]
            for k in FACT_NAMES & data.gauges.keys():
                del data.gauges[k]
            if not data.gauges:
                del self._ranks[r]

    def _count(self, rank: Rank, family: str, label: str, amount: float) -> None:
        if amount <= 0 or not math.isfinite(amount):
            return  # counters only ever grow
        per_rank = self._counters.setdefault(rank, {})
        per_rank[(family, label)] = per_rank.get((family, label), 0.0) + amount

    def expire(self, now: float) -> int:
        """Drop ranks not seen within `expire_after_s`; returns how many were dropped."""
        with self._lock:
            if len(self._rank_of) > 4 * self.max_ranks:
                self._rank_of.clear()
            stale = [r for r, d in self._ranks.items()
                     if now - d.last_seen > self.expire_after_s and d.gauges.keys() - FACT_NAMES]
            for r in stale:
                data = self._ranks[r]
                facts = {k: v for k, v in data.gauges.items() if k in FACT_NAMES}
                if facts:
                    # Startup facts describe the running server, not recent traffic: they stay until the
                    # next startup (docs/signals.md, "Sticky facts").
                    self._ranks[r] = _RankData(last_seen=data.last_seen, gauges=facts)
                else:
                    del self._ranks[r]
            self._expired += len(stale)
            retired = [r for r in self._counters if r not in self._ranks]
            # Keep retired counters (a returning rank continues its series) but bounded.
            for r in retired[: max(0, len(self._counters) - 4 * self.max_ranks)]:
                del self._counters[r]
            return len(stale)

    # --- inputs -------------------------------------------------------------------------------
    def add_observations(self, observations: Iterable[Observation | Sample], now: float) -> None:
        """Latest gauges per rank; counter deltas from the metrics source (a Sample: a Decode line's gauges)."""
        last_rank: Rank | None = None
        data: _RankData | None = None
        touched: dict[int, tuple[Rank, _RankData]] = {}  # id(rank) -> (rank kept alive, its data)
        expired = self._expired
        with self._lock:
            for o in observations:
                if isinstance(o, Sample):
                    _, rank, prefill, q, r, u, tp, *_ = o
                    if prefill:
                        continue  # prefill_* sample names are not gauges
                    if q is None and r is None and u is None and tp is None:
                        continue
                    hit = touched.get(id(rank))
                    if hit is None:
                        sd = self._touch(rank, now)
                        if self._expired != expired:
                            touched.clear()  # a rank was evicted to make room: cached entries may be gone
                            expired = self._expired
                        touched[id(rank)] = (rank, sd)
                    else:
                        sd = hit[1]
                    gauges = sd.gauges
                    if q is not None:
                        gauges["num_queue_reqs"] = q
                    if r is not None:
                        gauges["num_running_reqs"] = r
                    if u is not None:
                        gauges["token_usage"] = u
                    if tp is not None:
                        gauges["gen_throughput"] = tp
                    last_rank = None  # the observation path below re-touches its rank
                    continue
                gauge = o.name in GAUGE_NAMES
                if not gauge and (o.source == "log" or o.name not in COUNTED):
                    continue  # log counters come from events (add_events), not twice
                if o.rank is not last_rank or data is None:
                    # One event's observations share their Rank object: touch it once.
                    data, last_rank = self._touch(o.rank, now), o.rank
                    if self._expired != expired:
                        touched.clear()
                        expired = self._expired
                if gauge:
                    data.gauges[o.name] = o.value
                if o.source == "log":
                    continue
                if o.name == "retraction":
                    self._count(o.rank, "retractions", "", 1)
                    self._count(o.rank, "retracted_requests", "", o.value)
                elif o.name == "decode_cuda_graph_passes":
                    self._count(o.rank, "decode_samples", "true", o.value)
                elif o.name == "decode_eager_passes":
                    self._count(o.rank, "decode_samples", "false", o.value)
                elif o.name == "prefill_new_tokens":
                    self._count(o.rank, "prefill_tokens", "new", o.value)
                elif o.name == "prefill_cached_tokens":
                    self._count(o.rank, "prefill_tokens", "cached", o.value)

    def add_events(self, events: Iterable[Event], now: float) -> None:
        """Counters from log events: decode samples, retractions, prefill tokens, OOMs."""
        with self._lock:
            # A poll's events share `now`: each rank is looked up and touched once per call.
            seen: dict[tuple[tuple[str, int], ...], list[Any]] = {}  # -> [rank, its counters or None]
            expired = self._expired
            counters = self._counters
            for e in events:
                kind = e.kind
                if kind == "server_args":  # a new start: the last one's startup facts no longer hold
                    self._new_startup()
                    seen.clear()
                    continue
                if kind not in _COUNTED_KINDS:
                    continue  # config and startup events are not per-rank activity
                key = tuple(e.rank.items())
                hit = seen.get(key)
                if hit is None:
                    rank = self._rank_of.get(key)
                    if rank is None:
                        rank = self._rank_of[key] = Rank.from_dict(e.rank)
                    self._touch(rank, now)
                    if self._expired != expired:
                        seen.clear()  # a rank was evicted to make room: cached entries may be gone
                        expired = self._expired
                    hit = seen[key] = [rank, counters.get(rank)]
                else:
                    rank = hit[0]
                f = e.fields
                if kind == "decode":
                    cg = f.get("cuda_graph")
                    k = _DECODE_TRUE if cg is True else (_DECODE_FALSE if cg is False else _DECODE_UNKNOWN)
                    per_rank = hit[1]
                    if per_rank is None:
                        per_rank = hit[1] = counters.setdefault(rank, {})
                    per_rank[k] = per_rank.get(k, 0.0) + 1
                elif kind == "prefill":
                    for field_name, k in _PREFILL_KEYS:
                        v = f.get(field_name)
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            amount = float(v)
                            if amount > 0 and math.isfinite(amount):  # as `_count`: counters only grow
                                per_rank = hit[1]
                                if per_rank is None:
                                    per_rank = hit[1] = counters.setdefault(rank, {})
                                per_rank[k] = per_rank.get(k, 0.0) + amount
                elif kind == "retract":
                    self._count(rank, "retractions", "", 1)
                    n = f.get("num_retracted_reqs")
                    self._count(rank, "retracted_requests", "", float(n) if isinstance(n, (int, float)) else 0)
                    hit[1] = counters.get(rank)
                elif kind == "oom":
                    self._count(rank, "oom_events", oom_phase(f), 1)  # the window's rule
                    hit[1] = counters.get(rank)
                else:  # a counted kind: as the window counts it (observations.EventConverter.convert)
                    count = COUNT_OF[kind]
                    v = count_amount(count, f)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        self._count(rank, count.name, "", float(v))
                        hit[1] = counters.get(rank)

    def count_log_lines(self, lines: int, events_by_kind: Mapping[str, int], now: float | None) -> None:
        """Lines read; each event counts for its kind, the remaining lines as `other`."""
        with self._lock:
            events = 0
            for kind, n in events_by_kind.items():
                if n > 0:
                    self._log_lines[kind] = self._log_lines.get(kind, 0.0) + n
                    events += n
            other = lines - events
            if other > 0:
                self._log_lines["other"] = self._log_lines.get("other", 0.0) + other
            if lines > 0 and now is not None:
                self._last_line_time = now

    def set_log_totals(self, *, unparsed: float, rotations: float, truncations: float,
                       oversized: float = 0.0, unread_bytes: float = 0.0, implausible: float = 0.0) -> None:
        """Totals kept by the reader/follower; never allowed to go down (a new reader starts at 0)."""
        with self._lock:
            self._unread_bytes = max(self._unread_bytes, unread_bytes)
            self._log_unparsed = max(self._log_unparsed, unparsed)
            self._log_implausible = max(self._log_implausible, implausible)
            self._rotations = max(self._rotations, rotations)
            self._truncations = max(self._truncations, truncations)
            self._oversized = max(self._oversized, oversized)

    def set_replay_end(self, log_time: float | None) -> None:
        """A replayed log (`--from-start`) ended at `log_time` (None: lines arrive again, the log is live)."""
        with self._lock:
            self._replay_end = log_time

    def record_source(self, source: str, *, ok: bool, duration_s: float | None, now: float,
                      detail: str = "", reason: str | None = None) -> None:
        """Outcome of one attempt to read a source; a failure with a `reason` is counted under it."""
        with self._lock:
            if not ok and reason:
                key = (source, reason)
                self._failures[key] = self._failures.get(key, 0.0) + 1
            old = self._sources[source]
            down_since = None if ok else (old.down_since if old.up is False else now)
            self._sources[source] = SourceStatus(old.enabled, ok, duration_s, now, detail,
                                                 now if ok else old.last_ok, down_since)

    def count_truncations(self, source: str, limit: str, n: int) -> None:
        """`n` inputs of `source` cut or skipped at `limit` (see limits.py)."""
        if n > 0:
            with self._lock:
                key = (source, limit)
                self._truncations_by[key] = self._truncations_by.get(key, 0.0) + n

    def source_up(self, source: str) -> bool | None:
        """Whether `source` worked at its last attempt (None: not tried)."""
        with self._lock:
            return self._sources[source].up

    def record_scrape(self, *, garbage_lines: int, samples: int | None, model_name: str | None,
                      restarted: bool) -> None:
        """Facts from one successful scrape."""
        with self._lock:
            self._garbage += max(0, garbage_lines)
            self._scrape_samples = float(samples) if samples is not None else None
            if model_name:  # SGLang's model_name label: a served name may be a URL with credentials
                self._model_from_metrics = redact_text(model_name)
            if restarted:
                self._restarts += 1

    def count_restart(self) -> None:
        """SGLang restarted (detected outside a scrape: new server-info start time or version)."""
        with self._lock:
            self._restarts += 1

    def set_server(self, *, version: str | None = None, args: Mapping[str, Any] | None = None,
                   model_name: str | None = None, endpoint: str | None = None, source: str = "log") -> None:
        """Merge what we learned about the server's configuration; at most MAX_SERVER_ARGS arguments
        are kept (limits.merge_args), the names dropped counted under `source`."""
        with self._lock:
            if version:
                self._server.version = version
            if args:
                dropped = limits.merge_args(self._server.args, args)
                if dropped:
                    key = (source, "server_args")
                    self._truncations_by[key] = self._truncations_by.get(key, 0.0) + dropped
            if model_name:
                self._server.model_name = model_name
            if endpoint:
                self._endpoint = endpoint

    def set_server_facts(self, by_dp: Sequence[Mapping[str, float]]) -> None:
        """Startup facts from the server-info document, one mapping per DP rank: the fact gauges of
        ranks whose own lines did not give them (a sidecar without a log)."""
        with self._lock:
            self._server_facts = tuple(by_dp)

    def server_version(self) -> str | None:
        """The release known so far (`>=X.Y.Z` when only line formats told)."""
        with self._lock:
            return self._server.version

    def server_state(self) -> ServerState:
        """A copy of the server configuration, for the advisor."""
        with self._lock:
            return ServerState(self._server.version, dict(self._server.args), self._current_model())

    def set_evaluation(self, *, signals: Mapping[Rank, Mapping[str, float | None]],
                       findings: Iterable[Finding], document: Callable[[], Mapping[str, Any]] | None,
                       now: float, exported: frozenset[str] | None = None) -> None:
        """Store the latest evaluation of the guide (`exported`: the signal names to keep, None = all)."""
        with self._lock:
            self._signals = {r: {k: float(v) for k, v in s.items()
                                 if v is not None and math.isfinite(v) and (exported is None or k in exported)}
                             for r, s in signals.items()}
            self._findings = tuple(findings)
            self._document = document
            self._evaluated_at = now

    # --- output -------------------------------------------------------------------------------
    def _current_model(self) -> str | None:
        return self._server.model_name or self._model_from_metrics

    def snapshot(self, now: float) -> Snapshot:
        """A consistent, immutable copy for one /metrics scrape or status page."""
        with self._lock:
            ranks = []
            for rank in sorted(self._ranks, key=rank_key):
                data = self._ranks[rank]
                gauges = ({**server_facts_for(self._server_facts, rank.dp), **data.gauges} if self._server_facts
                          else dict(data.gauges))
                ranks.append(RankSnapshot(
                    rank=rank, last_seen=data.last_seen, gauges=gauges,
                    counters=dict(self._counters.get(rank, {}))))
            return Snapshot(
                now=now, model_name=self._current_model() or "", version=self._server.version,
                args=dict(self._server.args), ranks=tuple(ranks), sources=dict(self._sources),
                log_lines=dict(self._log_lines), log_unparsed=self._log_unparsed,
                log_implausible=self._log_implausible,
                log_rotations=self._rotations, log_truncations=self._truncations, log_oversized=self._oversized,
                log_last_line_time=self._last_line_time, ranks_expired=self._expired,
                restarts=self._restarts, scrape_garbage=self._garbage, scrape_samples=self._scrape_samples,
                server_info_endpoint=self._endpoint,
                signals=tuple((r, dict(self._signals[r])) for r in sorted(self._signals, key=rank_key)),
                findings=self._findings, document=self._document,
                evaluated_at=self._evaluated_at, window_s=self.window_s,
                source_failures=dict(self._failures), input_truncations=dict(self._truncations_by),
                log_unread_bytes=self._unread_bytes, log_replay_end=self._replay_end)
