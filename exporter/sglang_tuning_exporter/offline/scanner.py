"""`diagnose`'s reader: the sidecar's intake run over one range of a log (one worker each), on the log's
clock.  Lines go through the event reader; dated Decode/Prefill lines and retractions go on through the
sidecar's conversion (pipeline/observations) into a window of the range's own (pipeline/window), whose
buckets are handed over frozen; every other event goes to the parent in line order.  With the C
accelerator, runs of lines no multi-line record needs are read in C, which does parse, convert and
bucket-sum for the Decode/Prefill lines it reads (the same sums, merged into that window)."""

from __future__ import annotations

import gc
import heapq
import math
import mmap
import operator
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core.events import DECODE, PREFILL, RETRACT, Event
from sglang_tuning_exporter.core.model import Rank, ServerState
from sglang_tuning_exporter.core.timeparse import (
    BACKWARD_TOLERANCE_S,
    EARLIEST_PLAUSIBLE,
    LATEST_PLAUSIBLE,
    SEED_STAMPS,
    LogClock,
    event_stamp,
    has_date,
    plausible_seconds,
)
from sglang_tuning_exporter.pipeline.observations import MAMBA_SIZE_MIN, POOL_FULL, EventConverter, number
from sglang_tuning_exporter.pipeline.signals import SignalParams
from sglang_tuning_exporter.pipeline.stats import Bucket, Freezer, FrozenHist
from sglang_tuning_exporter.pipeline.window import EventKey, Window
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logfiles import may_hold_long_line
from sglang_tuning_exporter.sources.logreader import EventReader, line_at
from sglang_tuning_exporter.sources.logrecords import MAX_BLOCK_LINES
from sglang_tuning_exporter.sources.tail import MAX_LINE_BYTES

# The frozen histograms diagnose's workers send, built in C when the accelerator is loaded.
FREEZER: Freezer | None = SCAN.freeze_hist if SCAN is not None else None
_ACC = struct.Struct(f"{len(SCAN.ACC_FIELDS)}d") if SCAN is not None else None
_BucketKey = tuple[int | None, int | None, float]
_TEXT_BLOCK = 1 << 20  # bytes decoded at once without the accelerator (a range is never decoded whole)
# Where a log's section starts (offline/changes splits it there): a startup's arguments, or arguments changed
# without a restart. No word overlaps another, so their counts add up to the matches of their alternation.
SECTION_MARKS = (b"server_args=", b"Config updated via context override: ", b"Global server args updated! ")
_RANKS = 1 << 30  # the range's window tracks every rank it sees (the parent's caps them)


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
    blind_init: int | None = None  # line of a phase-less OOM judged before the start state was known
    before_batches: bool | None = None  # the reader's state after this chunk (EventReader.before_batches)
    summed_events: int = 0  # events summed into `buckets` here instead of sent (still events)
    retract_keys: dict[tuple[int | None, int | None], EventKey] = field(default_factory=dict)  # dedup state after
    # Stamps more than the tolerance off the latest (either way): the log clock may take them as outliers
    # or move, which only the full path decides as the sidecar does (the parent reads the file again).
    clock_irregular: int = 0
    oversized: int = 0  # lines longer than the scanner's max_line_bytes: skipped (an empty line instead)
    implausible_times: int = 0  # stamps the scanner's log clock took at a neighbour's time in this chunk
    implausible_example: str | None = None  # the first of them (LogClock.example)
    # SECTION_MARKS in the range's bytes (a parallel worker counts them while the parent merges: `changes`
    # then needs no pass of its own over the file); None where not counted.
    section_marks: int | None = None


# The pool sums of hybrid Decode lines the C accelerator read, as observations.pool_pairs names them: each
# present where pool_pairs would have given it (the count that says so; None: the sum's own count).
_POOL_SUMS = (("pool_samples", None), ("full_samples", None), ("full_usage_sum", "full_samples"),
              ("swa_samples", None), ("swa_usage_sum", "swa_samples"), ("mamba_num_sum", "mamba_n"), ("mamba_usage_sum", "mamba_n"),
              ("mamba_bound", None), ("swa_bound", None))


def count_marks(buf: bytes | mmap.mmap, start: int = 0, end: int | None = None, enough: int = -1) -> int:
    """How many SECTION_MARKS buf[start:end] holds (counting stops at `enough` when it is positive): each word
    looked for with find, several times faster over a large log than their regex alternation, which the
    engine tries at every byte."""
    stop = len(buf) if end is None else end
    seen = 0
    for word in SECTION_MARKS:
        at = buf.find(word, start, stop)
        while at >= 0:
            seen += 1
            if seen == enough:
                return seen
            at = buf.find(word, at + len(word), stop)
    return seen


_C_NAME = {"full_samples": "full_n"}  # the accelerator's name of a sum, where it differs


def _add_pools(pools: dict[str, float], totals: dict[str, float]) -> None:
    """Add the accelerator's hybrid-pool sums into a bucket's pools (Bucket.pools: name -> sum)."""
    for name, count in _POOL_SUMS:
        if totals[_C_NAME.get(count or name, count or name)]:
            pools[name] = pools.get(name, 0.0) + totals[_C_NAME.get(name, name)]


class Scanner:
    """Scans bytes, chunk by chunk, into the buckets of the sidecar's own intake (dated Decode/Prefill
    lines and retractions) and events (everything else) for the parent."""

    def __init__(self, resolution_s: float, usage_good: float, band: tuple[float, float] = (100.0, 2000.0), *,
                 fast: bool = True, known_oom: tuple[int, str] | None = None, origin_s: float = 0.0,
                 before_batches: bool | None = None) -> None:
        # One reader for the scanner's whole stream: a traceback or OOM message that continues past the
        # end of one scan call is completed by the next (its lines are numbered from 1 across calls).
        self.reader = EventReader(1)
        self.reader._last_oom = known_oom  # an OOM logged just before this stream (parallel ranges)
        self.reader.before_batches = before_batches  # a start seen before this stream and no batch yet
        # False: every event goes to the parent, whose log clock times each line (a clock set back),
        # and the accelerator is not used.
        self.use_fast = fast
        self.max_line_bytes = MAX_LINE_BYTES  # a longer line is skipped and counted (bounded memory)
        self.res = resolution_s
        self.origin = origin_s
        self.usage_good = usage_good
        self.band = band
        self._last_t: float | None = None  # the log clock's latest time (summed lines and dated events)
        # The sidecar's log clock over the dated stamps read here (the C reader's only fit it): a stamp it
        # holds or drops takes the latest time, as in the sidecar; a clock set back makes the chunk
        # irregular (the parent reads the file again, every line through its own log clock).
        self._clock = LogClock()
        self._counted = 0  # its outliers already reported in a chunk
        # The sidecar's conversion; its server state only gathers the release floors line formats reveal.
        # Decode/Prefill lines reach it in line order, retractions (a converter of their own) in time
        # order, their stamps judged by `_clock` already: taken as written.
        self._floors = ServerState()
        self._conv = EventConverter(server=self._floors, judge_dated=False)
        self._retract_conv = EventConverter(server=self._floors, judge_dated=False)
        self._window = self._new_window()
        self._summed = 0  # events of this chunk summed into the window (Decode/Prefill lines, retractions)
        # Decode and Prefill lines summed by the C accelerator: bucket key -> [totals, 4 histograms]
        self._cols: tuple[dict[_BucketKey, list[Any]], dict[_BucketKey, list[Any]]] = ({}, {})
        self._retracts: list[Event] = []  # retraction events of this chunk (summed in _end when possible)

    def _new_window(self) -> Window:
        w = Window(params=SignalParams(queue_band=self.band, usage_good=self.usage_good), expire_s=math.inf,
                   max_ranks=_RANKS, resolution_s=self.res)
        w.origin_s = self.origin  # the parent's grid
        return w

    def _flush_columns(self) -> None:
        """The buckets of the lines the C accelerator summed (the same statistics as the window's intake
        per line), merged into the range's window."""
        if _ACC is None or SCAN is None:
            return
        names = SCAN.ACC_FIELDS
        buckets: dict[_BucketKey, tuple[Bucket, list[float]]] = {}
        for kind, groups in enumerate(self._cols):
            for key, (acc, hists) in groups.items():
                got = buckets.get(key)
                t = dict(zip(names, _ACC.unpack(acc), strict=True))
                if got is None:
                    got = buckets[key] = (Bucket(), [t["t_min"], t["t_max"]])
                else:
                    got[1][:] = [min(got[1][0], t["t_min"]), max(got[1][1], t["t_max"])]
                b = got[0]
                queue, running, missed, capped = (FrozenHist.of_arrays(*h) for h in SCAN.group_hists(hists))
                if kind == 0:
                    b.decode.add_totals(t, queue, running, missed, capped)
                    if t["graph_n"]:
                        self._conv.note_version_floor("0.4.7")  # as converting one such line does
                    if t["pool_samples"]:
                        _add_pools(b.pools, t)
                else:
                    b.prefill.add_totals(t, queue, running, missed, capped)
                    b.prefill_new += t["new_sum"]
                    b.prefill_n += int(t["new_n"])
                    b.prefill_cached += t["cached_sum"]
            groups.clear()
        for (dp, pp, start), (b, (lo, hi)) in sorted(buckets.items(), key=lambda kv: kv[0][2]):
            self._window.add_bucket(Rank(dp=dp, pp=pp), start, b, first=lo, last=hi)

    def _begin(self) -> tuple[ChunkResult, int]:
        return ChunkResult(first_line=self.reader.next_line), self.reader.stats.unparsed

    def _end(self, res: ChunkResult, unparsed0: int, final: bool) -> ChunkResult:
        reader = self.reader
        if final:
            self._take(reader.flush(), res)
        self._flush_columns()  # first: the window adopts these buckets whole, retractions only add counts
        self._sum_retractions(res)
        self._hand_over(res, final)
        res.lines = reader.next_line - res.first_line
        res.unparsed = reader.stats.unparsed - unparsed0
        res.last_oom = reader._last_oom
        res.blind_check = reader.first_blind_oom_check
        clock = self._clock
        if final:
            clock.settle()  # a stamp still held at the end (a last stray line) is an outlier too
        res.implausible_times, self._counted = clock.implausible - self._counted, clock.implausible
        res.implausible_example = clock.example
        res.blind_init = reader.first_blind_init
        res.before_batches = reader.before_batches
        return res

    def _hand_over(self, res: ChunkResult, final: bool) -> None:
        """The range's window into the chunk: its buckets, rank spans and de-duplication state. Before
        the stream's end, a sample still open goes on to the next chunk's window (its next line may
        complete it, as in the sidecar's one window)."""
        still_open = {} if final else self._window.open_samples()
        for part in self._window.hand_over(keep_open=not final):
            replica = (part.rank.dp, part.rank.pp)
            for start, b in part.buckets:
                res.buckets[(*replica, start)] = b
            res.rank_span[replica] = [part.first_seen, part.last_seen]
            key = part.event_keys.get("retraction")
            if key is not None:
                res.retract_keys[replica] = key
            if res.first_t is None or part.first_seen < res.first_t:
                res.first_t = part.first_seen
            if res.last_t is None or part.last_seen > res.last_t:
                res.last_t = part.last_seen
        self._window = self._new_window()
        self._window.reopen(still_open)
        res.summed_events += self._summed
        self._summed = 0
        floor = self._floors.version
        if floor is not None and floor.startswith(">="):
            res.version_floor = floor[2:]

    def _sum_retractions(self, res: ChunkResult) -> None:
        """Sum the chunk's retractions into the range's window, in the parent's order (by time, stable),
        so the window's TP de-duplication counts them as the parent would.  Per replica, the leading
        prints that share the first one's time and value depend on the previous chunk's last retraction:
        they stay events for the parent, and the window's state after the rest is handed over."""
        evs, self._retracts = self._retracts, []
        if not evs:
            return
        timed = [(plausible_seconds(e.time) if has_date(e.time) else None,
                  number(e.fields.get("num_retracted_reqs", 1)), e) for e in evs]
        if any(t is None or v is None or not math.isfinite(v) for t, v, _ in timed) or _set_back(
                [t for t, _, _ in timed]):
            # An undated or odd one: the parent's log clock times them all.
            res.events = list(heapq.merge(res.events, evs, key=operator.attrgetter("line")))
            return
        lead: list[Event] = []
        first: dict[tuple[int | None, int | None], tuple[float | None, float | None]] = {}
        past_lead: set[tuple[int | None, int | None]] = set()  # the window de-duplicates from here
        summed: list[Event] = []
        timed.sort(key=operator.itemgetter(0))
        for t, v, e in timed:
            rank = e.rank
            if rank.get("tp") is not None:
                replica = (rank.get("dp"), rank.get("pp"))
                if replica not in past_lead:
                    if first.setdefault(replica, (t, v)) == (t, v):
                        lead.append(e)  # the parent de-duplicates it against the previous chunk
                        continue
                    past_lead.add(replica)  # differs from the lead: counts whatever came before
            summed.append(e)
        self._window.add_items(self._retract_conv.convert_batch(summed))
        self._summed += len(summed)
        if lead:
            lead.sort(key=operator.attrgetter("line"))
            res.events = list(heapq.merge(res.events, lead, key=operator.attrgetter("line")))

    def _take(self, events: Iterable[Event], res: ChunkResult) -> None:
        """Events of the event reader: dated Decode/Prefill lines (within the clock's tolerance) through
        the sidecar's conversion into the window, retractions kept for `_sum_retractions`, every other
        event to the parent (timed as the parent would)."""
        if not self.use_fast:
            res.events.extend(self._timed(e, res) for e in events)
            return
        batch: list[Event] = []
        for e in events:
            kind = e.kind
            if kind in (DECODE, PREFILL):
                if has_date(e.time):
                    e = self._judged(e, res)
                    if has_date(e.time) and not res.clock_irregular:
                        batch.append(e)
                        continue
            elif kind == RETRACT:
                self._retracts.append(self._timed(e, res))
                continue
            res.events.append(self._timed(e, res))
        if batch:
            self._summed += len(batch)
            self._window.add_items(self._conv.convert_batch(batch))

    def _feed(self, lines: list[str], res: ChunkResult) -> None:
        """Lines that hold no fast-path head, through the event reader (which numbers them)."""
        for line in lines:
            if "\x00" in line:
                res.nul_lines += 1
        self._take(self.reader.feed_lines(lines), res)

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

    def _scan_blocks(self, data: bytes | mmap.mmap, start: int, final: bool) -> ChunkResult:
        """Without the accelerator: the bytes decoded a block of whole lines at a time (memory stays
        that of a block however large the range)."""
        res, unparsed0 = self._begin()
        size = len(data)
        pos = start
        limit = self.max_line_bytes
        while pos < size:
            cut = data.rfind(b"\n", pos, min(size, pos + _TEXT_BLOCK)) + 1 if pos + _TEXT_BLOCK < size else size
            if cut <= pos:  # a line longer than a block
                cut = data.find(b"\n", pos) + 1 or size
            if cut - pos > limit and may_hold_long_line(data[pos:cut], limit):
                # Lines past the limit are emptied and counted, as the C reader hands them back.
                lines = []
                while pos < cut:
                    nl = data.find(b"\n", pos, cut)
                    end = cut if nl < 0 else nl
                    if end - pos > limit:
                        res.oversized += 1
                        lines.append("")
                    else:
                        lines.append(data[pos:end].decode("utf-8", errors="replace"))
                    pos = end + 1
            else:
                lines = data[pos:cut].decode("utf-8", errors="replace").split("\n")
                if lines[-1] == "":
                    lines.pop()
            self._feed(lines, res)
            pos = cut
        return self._end(res, unparsed0, final)

    def scan_bytes(self, data: bytes | mmap.mmap, *, final: bool = True, start: int = 0) -> ChunkResult:
        """Scan UTF-8 bytes from offset `start` (invalid bytes replaced). With the C accelerator (the
        optional drop-in), runs of lines no multi-line record needs are read in C: access and chatter lines
        skipped, each Decode/Prefill line's time and columns summed into its bucket group (`self._cols`),
        retractions returned as the reader would make them; the lines it hands back go through the event
        reader.  `data` may be a read-only mmap of the file (the workers' way: no copy of the range)."""
        if self.use_fast and self._clock.latest is None:
            self._seed(data, start)
        scan = SCAN
        if scan is None or not self.use_fast:
            return self._scan_blocks(data, start, final)
        res, unparsed0 = self._begin()
        reader = self.reader
        groups = self._cols
        size = len(data)
        pos = start
        while pos < size:
            if not reader.holding:
                out: list[Event] = []
                pos, n, nd, np_, _, last_t = scan.scan_buckets(data, pos, reader._next, out, groups[0], groups[1],
                                                                self.res, self.usage_good, *self.band,
                                                                self._last_t or 0.0, BACKWARD_TOLERANCE_S, self.origin,
                                                                EARLIEST_PLAUSIBLE, LATEST_PLAUSIBLE, self.max_line_bytes,
                                                                self._held(), POOL_FULL, MAMBA_SIZE_MIN)
                reader._next = n
                res.fast += nd + np_
                if nd or np_:
                    reader.batches_read()
                for e in out:  # retractions, read in C as the reader would (and within the tolerance)
                    self._retracts.append(self._timed(e, res, checked=True))
                if last_t is not None:  # stamps that fit the clock (C hands back the others)
                    self._clock.note(last_t)
                    self._last_t = self._clock.latest
                if pos >= size:
                    break
            nl = data.find(b"\n", pos)
            if (size if nl < 0 else nl) - pos > self.max_line_bytes:
                res.oversized += 1  # skipped: an empty line in its place (never decoded whole)
                line, nxt = "", size + 1 if nl < 0 else nl + 1
            else:
                line, nxt = line_at(data, pos)
            blk = reader._block
            if blk is not None and (blk.count >= MAX_BLOCK_LINES or not blk.accepts(line)):
                # The line ends the open record: emit it now, then read the line again.
                self._take(reader.end_record(), res)
                continue
            pos = nxt
            self._feed([line], res)
        return self._end(res, unparsed0, final)

    def _seed(self, data: bytes | mmap.mmap, start: int) -> None:
        """The log clock seeded with the first stamps ahead (LogClock.seed: a stray first stamp is no
        anchor); the C reader then judges against that time."""
        head = bytes(data[start:start + 64 * 1024]).decode("utf-8", "replace").split("\n")[:SEED_STAMPS]
        reader = EventReader(1)
        self._clock.seed(e.time for e in [*reader.feed_lines(head[:-1]), *reader.flush()])
        self._last_t = self._clock.latest

    def _judged(self, e: Event, res: ChunkResult) -> Event:
        """A dated event timed by the log clock: as written, or (an outlier, held, implausible) stamped
        with the latest time (the sidecar's neighbour's time), or undated before any time."""
        clock = self._clock
        jumps = clock.jumps
        t = clock.take(e.time)
        self._last_t = clock.latest
        if clock.jumps != jumps:
            res.clock_irregular += 1  # set back: only the full path re-anchors (LogClock's offsets)
        if t is None:
            return e._replace(time=None if clock.latest is None else event_stamp(clock.latest))
        return e

    def _held(self) -> set[tuple[int | None, int | None]] | None:
        """Replicas whose window holds an open sample (a partial line): their next line must reach the
        window (it completes or commits that sample), so the C reader hands it back."""
        open_ = self._window.open_samples()
        return {(r.dp, r.pp) for r in open_} if open_ else None

    def _timed(self, e: Event, res: ChunkResult, *, checked: bool = False) -> Event:
        """An event for the parent. Fast path: a dated one judged by the log clock (`_judged`; the C
        reader's `checked` ones fit it), an undated one stamped with the latest time. Full path: as read
        (the parent's log clock times it), only the first stamp noted (lines before it take it)."""
        if not self.use_fast:
            t0 = plausible_seconds(e.time)
            if t0 is not None and res.first_t is None and has_date(e.time):
                res.first_t = t0
            return e
        if has_date(e.time):
            if checked:
                t1 = plausible_seconds(e.time)
                if t1 is not None:
                    self._clock.note(t1)
                    self._last_t = self._clock.latest
            else:
                e = self._judged(e, res)
        t = plausible_seconds(e.time)
        if t is not None:
            if res.first_t is None or t < res.first_t:
                res.first_t = t
            if res.last_t is None or t > res.last_t:
                res.last_t = t
            return e
        if e.time is None and self._last_t is not None:
            return e._replace(time=event_stamp(self._last_t))
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


# A range for a worker: path, start, end, resolution, usage_good, queue band low/high, known OOM, origin, and
# whether a start was seen before it with no batch yet (EventReader.before_batches).
ScanJob = tuple[str, int, int, float, float, float, float, tuple[int, str] | None, float, bool | None]


def scan_range(job: ScanJob) -> ChunkResult:
    """Worker: scan bytes [start, end) of a plain file (lines numbered from 1 within the range)."""
    path, start, end, res_s, usage_good, low, high, known_oom, origin, before = job
    collecting = gc.isenabled()
    gc.disable()  # a range makes few cycles: cycle collections were ~3 % of a worker's time
    try:
        return _scan_mapped(path, start, end, Scanner(res_s, usage_good, (low, high), known_oom=known_oom,
                                                         origin_s=origin, before_batches=before))
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
            data = fh.read(max(0, end - start))  # what is left of it
            res = scanner.scan_bytes(data)
            res.section_marks = count_marks(data)
        else:
            with m:
                res = scanner.scan_bytes(m, start=start - base)
                res.section_marks = count_marks(m, start - base)  # ranges end at line ends: no mark is cut
    for b in res.buckets.values():
        b.freeze(FREEZER)  # the parent unpickles two byte strings per histogram, not a dict built value by value
    return res
