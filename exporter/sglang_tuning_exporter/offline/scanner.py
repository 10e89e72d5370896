"""`diagnose`'s reader: the event reader over blocks of bytes, with the C accelerator's drop-in summing
dated Decode/Prefill lines into per-rank time buckets; chunk by chunk, one range of a plain file per
worker."""

from __future__ import annotations

import dataclasses
import gc
import heapq
import math
import mmap
import operator
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from sglang_tuning_exporter.core.events import RETRACT, Event
from sglang_tuning_exporter.core.timeparse import (
    BACKWARD_TOLERANCE_S,
    EARLIEST_PLAUSIBLE,
    LATEST_PLAUSIBLE,
    event_seconds,
    plausible_seconds,
)
from sglang_tuning_exporter.core.versions import version_tuple
from sglang_tuning_exporter.pipeline.observations import number
from sglang_tuning_exporter.pipeline.signals import Bucket, FrozenHist, use_freezer
from sglang_tuning_exporter.pipeline.window import EventKey, bucket_start, tp_dedup
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logreader import EventReader, line_at
from sglang_tuning_exporter.sources.logrecords import MAX_BLOCK_LINES

if SCAN is not None:
    use_freezer(SCAN.freeze_hist)  # the frozen histograms diagnose's workers send, built in C
_ACC = struct.Struct(f"{len(SCAN.ACC_FIELDS)}d") if SCAN is not None else None
_BucketKey = tuple[int | None, int | None, float]


@dataclass(slots=True)
class ChunkResult:
    """What scanning a run of lines produced (picklable; sent back from workers)."""

    lines: int = 0
    fast: int = 0
    buckets: dict[_BucketKey, Bucket] = field(default_factory=dict)
    rank_span: dict[tuple[int | None, int | None], list[float]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    unparsed: int = 0
    first_t: float | None = None
    last_t: float | None = None
    nul_lines: int = 0
    # The highest release floor the lines summed here reveal (`cuda graph:` 0.4.7, `#new_tokens_gained`
    # 0.5.7): converting them as events would have noted it before any evaluation, so the parent does.
    version_floor: str | None = None
    first_line: int = 1  # the scanner's number for the chunk's first line (its events are numbered alike)
    last_oom: tuple[int, str] | None = None  # the reader's last OOM (line, message) after this chunk
    blind_check: int | None = None  # line of a re-raised-OOM check made before any OOM was known
    summed_events: int = 0  # retraction events summed into `buckets` here instead of sent (still events)
    retract_keys: dict[tuple[int | None, int | None], EventKey] = field(default_factory=dict)  # dedup state after


def _iso_of(t: float) -> str:
    whole = int(t)
    frac = t - whole
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return text + (f"{frac:.3f}"[1:] if frac > 0 else "")


class Scanner:
    """Scans bytes into per-rank buckets (Decode/Prefill lines summed by the C accelerator) and events
    (everything else, and every line without the accelerator), chunk by chunk."""

    def __init__(self, resolution_s: float, usage_good: float, band: tuple[float, float] = (100.0, 2000.0), *,
                 fast: bool = True, known_oom: tuple[int, str] | None = None, origin_s: float = 0.0) -> None:
        # One reader for the scanner's whole stream: a traceback or OOM message that continues past the
        # end of one scan call is completed by the next (its lines are numbered from 1 across calls).
        self.reader = EventReader(1)
        self.reader._last_oom = known_oom  # an OOM logged just before this stream (parallel ranges)
        self.use_fast = fast  # False: the accelerator is not used (tests compare both)
        self.res = resolution_s
        self.origin = origin_s
        self.usage_good = usage_good
        self.band = band
        self._last_t: float | None = None  # last dated time seen (fast lines and dated events)
        # Decode and Prefill lines summed by the C accelerator: bucket key -> [totals, 4 histograms]
        self._cols: tuple[dict[_BucketKey, list[Any]], dict[_BucketKey, list[Any]]] = ({}, {})
        self._c_retracts: list[Event] = []  # retraction events read in C (summed in _end when possible)

    def _flush_columns(self, res: ChunkResult) -> None:
        """The buckets of the lines the C accelerator summed (the same statistics as `add` per line)."""
        if _ACC is None or SCAN is None:
            return
        names = SCAN.ACC_FIELDS
        for kind, groups in enumerate(self._cols):
            for key, (acc, hists) in groups.items():
                b = res.buckets.get(key)
                if b is None:
                    b = res.buckets[key] = Bucket()
                t = dict(zip(names, _ACC.unpack(acc), strict=True))
                queue, running, missed, capped = (FrozenHist.of_arrays(*h) for h in SCAN.group_hists(hists))
                if kind == 0:
                    b.decode.add_totals(t, queue, running, missed, capped)
                    if t["graph_n"]:
                        _note_floor(res, "0.4.7")
                else:
                    b.prefill.add_totals(t, queue, running, missed, capped)
                    b.prefill_new += t["new_sum"]
                    b.prefill_n += int(t["new_n"])
                    b.prefill_cached += t["cached_sum"]
                self._span_bounds(res, key, t["t_min"], t["t_max"])
            groups.clear()

    @staticmethod
    def _span_bounds(res: ChunkResult, key: _BucketKey, lo: float, hi: float) -> None:
        span = res.rank_span.get(key[:2])
        if span is None:
            res.rank_span[key[:2]] = [lo, hi]
        else:
            span[0] = min(span[0], lo)
            span[1] = max(span[1], hi)
        if res.first_t is None or lo < res.first_t:
            res.first_t = lo
        if res.last_t is None or hi > res.last_t:
            res.last_t = hi

    def _begin(self) -> tuple[ChunkResult, int]:
        return ChunkResult(first_line=self.reader.next_line), self.reader.stats.unparsed

    def _end(self, res: ChunkResult, unparsed0: int, final: bool) -> ChunkResult:
        reader = self.reader
        if final:
            for e in reader.flush():
                res.events.append(self._timed(e, res))
        self._sum_retractions(res)
        self._flush_columns(res)
        res.lines = reader.next_line - res.first_line
        res.unparsed = reader.stats.unparsed - unparsed0
        res.last_oom = reader._last_oom
        res.blind_check = reader.first_blind_oom_check
        return res

    def _sum_retractions(self, res: ChunkResult) -> None:
        """Sum the retractions read in C into their buckets (the parent then converts no event per
        retraction), with the window's TP de-duplication (signals.tp_dedup) in the parent's order (by
        time, stable).  Per replica, the leading prints that share the first one's time and value depend
        on the previous chunk's last retraction: they stay events for the parent, and the state after
        the rest is handed over in `retract_keys`."""
        evs, self._c_retracts = self._c_retracts, []
        if not evs:
            return
        timed = [(event_seconds(e.time), number(e.fields.get("num_retracted_reqs", 1)), e) for e in evs]
        if any(e.kind == RETRACT for e in res.events) or any(
                t is None or v is None or not math.isfinite(v) for t, v, _ in timed) or _set_back(
                [t for t, _, _ in timed]):
            # Retractions read in Python interleave with these (or one is odd): all go to the parent.
            res.events = list(heapq.merge(res.events, evs, key=operator.attrgetter("line")))
            return
        if any("num_new_tokens_gained" in e.fields for e in evs):
            _note_floor(res, "0.5.7")
        lead: list[Event] = []
        first: dict[tuple[int | None, int | None], tuple[float, float]] = {}
        known = res.retract_keys
        timed.sort(key=operator.itemgetter(0))
        for t, v, e in cast(list[tuple[float, float, Event]], timed):
            rank = e.rank
            replica = (rank.get("dp"), rank.get("pp"))
            tp = rank.get("tp")
            if tp is not None:
                prev = known.get(replica)
                if prev is None:
                    if first.setdefault(replica, (t, v)) == (t, v):
                        lead.append(e)  # the parent de-duplicates it against the previous chunk
                        continue
                    known[replica] = (t, v, frozenset({tp}))  # differs from the lead: counts whatever came before
                else:
                    counts, known[replica] = tp_dedup(prev, t, v, tp)
                    if not counts:
                        continue
            key = (replica[0], replica[1], bucket_start(t, self.res, self.origin))
            b = res.buckets.get(key)
            if b is None:
                b = res.buckets[key] = Bucket()
            b.retractions += 1
            b.retracted += v
            self._span_bounds(res, key, t, t)
        res.summed_events = len(evs) - len(lead)
        if lead:
            lead.sort(key=operator.attrgetter("line"))
            res.events = list(heapq.merge(res.events, lead, key=operator.attrgetter("line")))

    def _feed(self, lines: list[str], res: ChunkResult) -> None:
        """Lines that hold no fast-path head, through the event reader (which numbers them)."""
        for line in lines:
            if "\x00" in line:
                res.nul_lines += 1
        out = self.reader.feed_lines(lines)
        for e in out:
            res.events.append(self._timed(e, res))

    def scan_text(self, text: str, *, final: bool = True) -> ChunkResult:
        """Scan text made of whole lines (the last may lack its newline) through the event reader."""
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return self.scan(lines, final=final)

    def scan(self, lines: Iterable[str], *, final: bool = True) -> ChunkResult:
        """Scan a run of lines through the event reader (the one Python read path)."""
        res, unparsed0 = self._begin()
        self._feed(list(lines), res)
        return self._end(res, unparsed0, final)

    def scan_bytes(self, data: bytes | mmap.mmap, *, final: bool = True, start: int = 0) -> ChunkResult:
        """Scan UTF-8 bytes from offset `start` (invalid bytes replaced). With the C accelerator (the
        optional drop-in), runs of lines no multi-line record needs are read in C: access and chatter lines
        skipped, each Decode/Prefill line's time and columns summed into its bucket group (`self._cols`),
        retractions returned as the reader would make them; the lines it hands back go through the event
        reader.  `data` may be a read-only mmap of the file (the workers' way: no copy of the range)."""
        scan = SCAN
        if scan is None or not self.use_fast:
            return self.scan_text(data[start:].decode("utf-8", errors="replace"), final=final)
        res, unparsed0 = self._begin()
        reader = self.reader
        groups = self._cols
        size = len(data)
        pos = start
        while pos < size:
            if reader._block is None:
                out: list[Event] = []
                pos, n, nd, np_, _, last_t = scan.scan_buckets(data, pos, reader._next, out, groups[0], groups[1],
                                                                self.res, self.usage_good, *self.band,
                                                                self._last_t or 0.0, BACKWARD_TOLERANCE_S, self.origin,
                                                                EARLIEST_PLAUSIBLE, LATEST_PLAUSIBLE)
                reader._next = n
                res.fast += nd + np_
                for e in out:  # retractions, read in C as the reader would
                    self._c_retracts.append(self._timed(e, res))
                if last_t is not None:
                    self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
                if pos >= size:
                    break
            line, nxt = line_at(data, pos)
            blk = reader._block
            if blk is not None and (blk.count >= MAX_BLOCK_LINES or not blk.accepts(line)):
                # The line ends the open record: emit it now, then read the line again.
                for e in reader.flush():
                    res.events.append(self._timed(e, res))
                continue
            pos = nxt
            self._feed([line], res)
        return self._end(res, unparsed0, final)

    def _timed(self, e: Event, res: ChunkResult) -> Event:
        t = plausible_seconds(e.time)
        if t is not None:
            if e.time and "T" in e.time and (self._last_t is None or t > self._last_t):
                self._last_t = t
            if res.first_t is None or t < res.first_t:
                res.first_t = t
            if res.last_t is None or t > res.last_t:
                res.last_t = t
            return e
        if e.time is None and self._last_t is not None:
            return dataclasses.replace(e, time=_iso_of(self._last_t))
        return e


def _set_back(times: list[float | None]) -> bool:
    """Whether a time (in line order) falls more than the tolerance behind the latest before it: then
    the log clock (timeparse.LogClock) times those lines, not a bucket sum (across chunks, the parent's
    ClockSetBack catches it)."""
    top = -math.inf
    for t in times:
        if t is None:
            continue
        if t < top - BACKWARD_TOLERANCE_S:
            return True
        top = max(top, t)
    return False


def _note_floor(res: ChunkResult, version: str) -> None:
    cur = res.version_floor
    if cur == version:
        return  # the common case: once per bucket group, the same floor
    if cur is None or version_tuple(version) > version_tuple(cur):
        res.version_floor = version


_Job = tuple[str, int, int, float, float, float, float, tuple[int, str] | None, float]


def _scan_range(job: _Job) -> ChunkResult:
    """Worker: scan bytes [start, end) of a plain file (lines numbered from 1 within the range)."""
    path, start, end, res_s, usage_good, low, high, known_oom, origin = job
    collecting = gc.isenabled()
    gc.disable()  # a range makes few cycles: cycle collections were ~3 % of a worker's time
    try:
        return _scan_mapped(path, start, end, Scanner(res_s, usage_good, (low, high), known_oom=known_oom,
                                                         origin_s=origin))
    finally:
        if collecting:
            gc.enable()


def _scan_mapped(path: str, start: int, end: int, scanner: Scanner) -> ChunkResult:
    """Scan a range through a read-only map of it (a read where mapping fails); the buckets come back
    frozen (cheap to pickle)."""
    with open(path, "rb") as fh:
        # A map of the range, not a read: reading copies it into fresh pages (a third of a worker's time).
        base = start - start % mmap.ALLOCATIONGRANULARITY
        try:
            m = mmap.mmap(fh.fileno(), end - base, offset=base, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # no mmap here, an empty range, or a file shrunk since the split
            fh.seek(start)
            res = scanner.scan_bytes(fh.read(max(0, end - start)))  # what is left of it
        else:
            with m:
                res = scanner.scan_bytes(m, start=start - base)
    for b in res.buckets.values():
        b.freeze()  # the parent unpickles two byte strings per histogram, not a dict built value by value
    return res
