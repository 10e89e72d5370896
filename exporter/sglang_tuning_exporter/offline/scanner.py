"""The fast reader of `diagnose`: scans text into per-rank time buckets (dated Decode/Prefill lines,
summed in C when the accelerator is built) and events (everything else), chunk by chunk; one range of a
plain file per worker."""

from __future__ import annotations

import dataclasses
import gc
import heapq
import math
import mmap
import operator
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from sglang_tuning_exporter.core.events import RETRACT, Event
from sglang_tuning_exporter.core.timeparse import (
    BACKWARD_TOLERANCE_S,
    event_seconds,
    plausible_seconds,
)
from sglang_tuning_exporter.core.versions import version_tuple
from sglang_tuning_exporter.pipeline.observations import batch_usage, number
from sglang_tuning_exporter.pipeline.signals import Bucket, FrozenHist, use_freezer
from sglang_tuning_exporter.pipeline.window import EventKey, bucket_start, tp_dedup
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logparse import parse_line
from sglang_tuning_exporter.sources.logreader import (
    _MAX_BLOCK_LINES,
    EventReader,
    line_at,
)

# --- fast path ---------------------------------------------------------------------------------
# `[2025-01-12 10:11:12(.123)? DP0 TP0] Decode batch...` and `... Prefill batch...` are the commonest
# SGLang lines of a busy log (access lines are commoner, and are skipped).  The scan keeps such lines
# per (rank, time bucket) after reading only the stamp; at the end of the chunk one `findall` per
# bucket reads the canonical bodies (0.3-0.5.x; the patterns start with a literal, so the engine
# finds them with a fast scan).  A bucket with any other shape is read line by line with the full
# parser.  Every other line goes through the multi-line event reader.  A test proves both paths give
# the same signals and findings on the corpus and on every scenario log.
# Decode fields between usage and graph that the signals do not use: speculative decoding, PD queues.
_DECODE_EXTRA = (r"(?:accept len: \d+\.\d+, (?:accept rate: \d+\.\d+, )?)?"
                 r"(?:pre-allocated usage: \d+\.\d+, #prealloc-req: \d+, #transfer-req: \d+, "
                 r"(?:#host-receive-req: \d+, )?#retracted-req: \d+, )?")
_DECODE_TAIL = (r"#running-req: (\d+), #token: \d+, token usage: (\d+\.\d+), " + _DECODE_EXTRA
                + r"(?:cuda graph: (True|False), )?gen throughput \(token/s\): (\d+\.\d+), #queue-req: (\d+)")
_DECODE_ROW = re.compile(r"\] Decode batch(?: \[\d+\])?[.,] " + _DECODE_TAIL)

_PREFILL_ROW = re.compile(
    r"\] Prefill batch(?: \[\d+\])?[.,] #new-seq: \d+, #new-token: (\d+), #cached-token: (\d+), "
    r"token usage: (\d+\.\d+), #running-req: (\d+), #queue-req: (\d+)")
_REST = re.compile(r"(\.\d+)?((?: [A-Z_]+\d+)*) ?$")
_TAG = re.compile(r" ([A-Z_]+?)(\d+)")
_CACHE_MAX = 4096
if SCAN is not None:
    use_freezer(SCAN.freeze_hist)  # the frozen histograms diagnose's workers send, built in C
_D_HEAD, _P_HEAD = "] Decode batch", "] Prefill batch"
_TWO_HTTP = re.compile(r"HTTP/1\.[^\n]*HTTP/1\.")  # a line holding `HTTP/1.` twice (see scan_text)
_ACC = struct.Struct(f"{len(SCAN.ACC_FIELDS)}d") if SCAN is not None else None
_Pending = tuple[list[float], list[str]]  # times and lines of the fast Decode (or Prefill) lines of a bucket
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


def _tags(text: str) -> tuple[int | None, int | None]:
    dp = pp = None
    for name, num in _TAG.findall(text):
        if name == "DP":
            dp = int(num)
        elif name == "PP":
            pp = int(num)
    return dp, pp


class Scanner:
    """Scans text into per-rank buckets (fast path) and events (everything else), chunk by chunk."""

    def __init__(self, resolution_s: float, usage_good: float, band: tuple[float, float] = (100.0, 2000.0), *,
                 fast: bool = True, known_oom: tuple[int, str] | None = None) -> None:
        # One reader for the scanner's whole stream: a traceback or OOM message that continues past the
        # end of one scan call is completed by the next (its lines are numbered from 1 across calls).
        self.reader = EventReader(1)
        self.reader._last_oom = known_oom  # an OOM logged just before this stream (parallel ranges)
        self.use_fast = fast  # False: every line goes through the full parser (tests compare both)
        self.res = resolution_s
        self.usage_good = usage_good
        self.band = band
        self._minutes: dict[str, float | None] = {}
        self._tag_cache: dict[str, tuple[float, int | None, int | None] | None] = {}
        self._seconds: dict[str, float] = {}  # `YYYY-MM-DD HH:MM:SS` of a valid stamp -> epoch seconds
        self._last_t: float | None = None  # last dated time seen (fast lines and dated events)
        self._rows: dict[_BucketKey, _Pending] = {}
        self._prows: dict[_BucketKey, _Pending] = {}  # the same for fast Prefill lines
        # Decode and Prefill lines summed by the C accelerator: bucket key -> [totals, 4 histograms]
        self._cols: tuple[dict[_BucketKey, list[Any]], dict[_BucketKey, list[Any]]] = ({}, {})
        self._c_retracts: list[Event] = []  # retraction events read in C (summed in _end when possible)

    def _stamp(self, line: str, p: int) -> tuple[float, int | None, int | None] | None:
        """(time, dp, pp) of `[YYYY-MM-DD HH:MM:SS(.fff)? TAGS]` ending at `p`, or None."""
        lb = line.rfind("[", 0, p)
        if lb < 0 or p - lb < 20 or line[lb + 5] != "-" or line[lb + 11] != " " or line[lb + 17] != ":":
            return None
        minutes = self._minutes
        minute = line[lb + 1:lb + 17]
        base = minutes.get(minute, -1.0)
        if base == -1.0:
            if len(minutes) >= _CACHE_MAX:
                minutes.clear()
            base = minutes[minute] = plausible_seconds(minute.replace(" ", "T") + ":00")
        sec = line[lb + 18:lb + 20]
        if base is None or not sec.isdigit():
            return None
        rest = line[lb + 20:p]
        tags = self._tag_cache.get(rest, False)
        if tags is False:
            if len(self._tag_cache) >= _CACHE_MAX:
                self._tag_cache.clear()
            m = _REST.match(rest)
            tags = None if m is None else (float(m.group(1) or 0.0), *_tags(m.group(2)))
            self._tag_cache[rest] = tags
        if tags is None:
            return None
        frac, dp, pp = tags  # type: ignore[misc]
        return base + int(sec) + frac, dp, pp

    @staticmethod
    def _bucket_rows(res: ChunkResult, key: _BucketKey, lines: list[str],
                     row: re.Pattern[str]) -> tuple[Bucket, list[Any]]:
        """The bucket of `key`, and the rows of `lines` when every line is canonical (else [])."""
        b = res.buckets.get(key)
        if b is None:
            b = res.buckets[key] = Bucket()
        text = "\n".join(lines)
        rows = row.findall(text) if "\r" not in text and "\x1b" not in text else []
        return b, (rows if len(rows) == len(lines) else [])

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

    def _flush_prefill(self, res: ChunkResult) -> None:
        """Read the Prefill lines collected per bucket: one findall per bucket, C-level statistics."""
        for key, (times, lines) in self._prows.items():
            b, rows = self._bucket_rows(res, key, lines, _PREFILL_ROW)
            if rows:
                new_col, cached_col, u_col, r_col, q_col = zip(*rows, strict=True)
                n = len(rows)
                b.prefill.add_text_columns(r_col, u_col, ("",) * n, (None,) * n, q_col, self.usage_good, self.band)
                b.prefill_new += sum(map(int, new_col))
                b.prefill_cached += sum(map(int, cached_col))
                b.prefill_n += n
            else:
                for line in lines:  # some line is not canonical: read each with the full parser
                    self._prefill_sample(line, b)
            self._span(res, key, times)
        self._prows.clear()

    def _prefill_sample(self, line: str, b: Bucket) -> None:
        """One Prefill line through the full parser, turned into observations as observations.py does."""
        e = parse_line(line, 0)
        if e is None or e.kind != "prefill":
            return
        f = e.fields

        def num(k: str) -> float | None:
            v = f.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        b.prefill.add(num("num_queue_reqs"), num("num_running_reqs"), batch_usage(f), None, None, self.usage_good,
                      self.band)
        new, cached = num("num_new_tokens"), num("num_cached_tokens")
        if new is not None:
            b.prefill_new += new
            b.prefill_n += 1
        if cached is not None:
            b.prefill_cached += cached

    @staticmethod
    def _span(res: ChunkResult, key: _BucketKey, times: list[float]) -> None:
        Scanner._span_bounds(res, key, min(times), max(times))

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

    def _flush_rows(self, res: ChunkResult) -> None:
        """Read the Decode lines collected per bucket: one findall per bucket, C-level statistics."""
        for key, (times, lines) in self._rows.items():
            b, rows = self._bucket_rows(res, key, lines, _DECODE_ROW)
            if rows:
                r_col, u_col, g_col, tp_col, q_col = zip(*rows, strict=True)
                b.decode.add_text_columns(r_col, u_col, g_col, tp_col, q_col, self.usage_good, self.band)
                if any(g_col):
                    _note_floor(res, "0.4.7")
            else:
                for line in lines:  # some line is not canonical: read each with the full parser
                    self._decode_sample(line, b, res)
            self._span(res, key, times)
        self._rows.clear()

    def _decode_sample(self, line: str, b: Bucket, res: ChunkResult) -> None:
        """One Decode line through the full parser, turned into a sample as observations.py does."""
        e = parse_line(line, 0)
        if e is None or e.kind != "decode":
            return
        f = e.fields
        usage = batch_usage(f)
        graph = f.get("cuda_graph")
        if isinstance(graph, bool):
            _note_floor(res, "0.4.7")

        def num(k: str) -> float | None:
            v = f.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        b.decode.add(num("num_queue_reqs"), num("num_running_reqs"), usage,
                     None if not isinstance(graph, bool) else float(graph), num("gen_throughput"),
                     self.usage_good, self.band)

    def _fast_key(self, line: str, p: int) -> tuple[_BucketKey, float] | None:
        """Bucket key and time of a Decode/Prefill line whose head `] ... batch` is at `p`, or None."""
        lb = 0 if line[0] == "[" else line.rfind("[", 0, p)
        if lb < 0 or p - lb < 20:
            return None
        base = self._minutes.get(line[lb + 1:lb + 17])
        tags = self._tag_cache.get(line[lb + 20:p])
        sec = line[lb + 18:lb + 20]
        if base is not None and tags is not None and line[lb + 17] == ":" and sec.isdigit():
            t = base + int(sec) + tags[0]
            dp, pp = tags[1], tags[2]
        else:
            st = self._stamp(line, p)  # fills the caches; None when not a stamp
            if st is None:
                return None
            t, dp, pp = st
        lt = self._last_t
        if lt is None or t > lt:
            self._last_t = t
        elif t < lt - BACKWARD_TOLERANCE_S:
            return None  # out of order or a clock set back: the full path's log clock decides
        return (dp, pp, (t // self.res) * self.res), t

    def _begin(self) -> tuple[ChunkResult, int]:
        return ChunkResult(first_line=self.reader.next_line), self.reader.stats.unparsed

    def _end(self, res: ChunkResult, unparsed0: int, final: bool) -> ChunkResult:
        reader = self.reader
        if final:
            for e in reader.flush():
                res.events.append(self._timed(e, res))
        self._sum_retractions(res)
        self._flush_columns(res)
        self._flush_rows(res)
        self._flush_prefill(res)
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
            key = (replica[0], replica[1], bucket_start(t, self.res))
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
        """Scan text made of whole lines (the last may lack its newline) without splitting it into lines:
        `str.find` jumps from one `] Decode batch` / `] Prefill batch` head to the next; the lines between
        two heads are skipped in C when they are all access lines, else go through the event reader."""
        if not self.use_fast:
            lines = text.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            return self.scan(lines, final=final)
        res, unparsed0 = self._begin()
        reader = self.reader
        find, rfind, count = text.find, text.rfind, text.count
        size = len(text)
        # An access line holds `HTTP/1.` once; a gap whose lines hold it as often as it has lines is all
        # access lines unless some line holds it twice, which this one search rules out for the block.
        skip_ok = _TWO_HTTP.search(text) is None
        skip_ok = skip_ok and find("\r") < 0  # a CR line may hide a record after its progress bar
        rows, prows = self._rows, self._prows
        secs, tag_cache, minutes = self._seconds, self._tag_cache, self._minutes
        res_s = self.res
        fast = 0
        last_t: float | None = None
        nd = find(_D_HEAD)
        np_ = find(_P_HEAD)
        pos = 0
        skipped = 0  # lines passed over since the reader's count was last brought up to date
        open_rec = reader._block is not None  # a multi-line record is open in the reader
        while pos < size:
            if nd >= 0 and (np_ < 0 or nd < np_):
                p, pending = nd, rows
            elif np_ >= 0:
                p, pending = np_, prows
            else:
                p = -1
            ls = size if p < 0 else (rfind("\n", pos, p) + 1 or pos)
            if ls > pos:  # the gap [pos, ls): whole lines without a fast head
                k = count("\n", pos, ls)
                if ls == size and text[-1] != "\n":
                    k += 1
                if skip_ok and not open_rec and count("HTTP/1.", pos, ls) == k:
                    skipped += k  # access lines only
                else:
                    reader._next += skipped
                    skipped = 0
                    if last_t is not None:
                        self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
                        last_t = None
                    gap = text[pos:ls].split("\n")
                    if gap[-1] == "":
                        gap.pop()
                    self._feed(gap, res)
                    open_rec = reader._block is not None
            if p < 0:
                break
            le = find("\n", p)
            if le < 0:
                le = size
            pos = le + 1
            if pending is prows and 0 <= nd < le:
                p, pending = nd, rows  # a Decode head later on the line wins, as in `scan`
            if nd >= 0 and nd < pos:
                nd = find(_D_HEAD, pos)
            if np_ >= 0 and np_ < pos:
                np_ = find(_P_HEAD, pos)
            line = text[ls:le]
            if not open_rec:
                t = -1.0
                if text.startswith("[", ls):
                    stamp = text[ls + 1:ls + 20]
                    base = secs.get(stamp)
                    if base is None and text.startswith(":", ls + 17) and stamp[17:].isdigit():
                        m = minutes.get(stamp[:16])  # a new second of a known minute
                        if m is not None:
                            if len(secs) >= _CACHE_MAX:
                                secs.clear()
                            base = secs[stamp] = m + int(stamp[17:])
                    tags = tag_cache.get(text[ls + 20:p])
                    if base is not None and tags is not None:
                        t = base + tags[0]
                        key = (tags[1], tags[2], (t // res_s) * res_s)
                if "HTTP/1." in line and "\r" not in line:
                    skipped += 1  # an access line that happens to hold a head: never an event
                    continue
                if t < 0:
                    kt = self._fast_key(line, p - ls)  # validates the stamp and fills the caches
                    if kt is not None:
                        key, t = kt
                ref = last_t if last_t is not None else self._last_t
                if ref is not None and t < ref - BACKWARD_TOLERANCE_S:
                    t = -1.0  # out of order or a clock set back: the full path's log clock decides
                if t >= 0:
                    pend = pending.get(key)
                    if pend is None:
                        pend = pending[key] = ([], [])
                    pend[0].append(t)
                    pend[1].append(line)
                    if last_t is None or t > last_t:
                        last_t = t
                    skipped += 1
                    fast += 1
                    continue
            else:
                blk = reader._block
                if blk is not None and (blk.count >= _MAX_BLOCK_LINES or not blk.accepts(line)):
                    # The line ends the open record: emit it now, then read the line itself again (as
                    # when a parallel range starts with it).
                    reader._next += skipped
                    skipped = 0
                    if last_t is not None:
                        self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
                        last_t = None
                    for e in reader.flush():
                        res.events.append(self._timed(e, res))
                    open_rec = False
                    pos = ls
                    nd, np_ = find(_D_HEAD, ls), find(_P_HEAD, ls)
                    continue
            reader._next += skipped
            skipped = 0
            if last_t is not None:
                self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
                last_t = None
            self._feed([line], res)
            open_rec = reader._block is not None
        reader._next += skipped
        if last_t is not None:
            self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
        res.fast += fast
        return self._end(res, unparsed0, final)

    def scan(self, lines: Iterable[str], *, final: bool = True) -> ChunkResult:
        """Scan lines one by one (stdin, gzip; `final=False` keeps a multi-line record open for the next call)."""
        res, unparsed0 = self._begin()
        self._scan_lines(lines, res)
        return self._end(res, unparsed0, final)

    def _scan_lines(self, lines: Iterable[str], res: ChunkResult) -> None:
        reader = self.reader
        columns = self._rows
        res_s = self.res
        stamp_of = self._stamp
        use_fast = self.use_fast
        fast = 0
        last_t: float | None = None
        minutes = self._minutes
        tag_cache = self._tag_cache
        idle = reader._block is None  # no multi-line record open in the reader
        prows = self._prows
        for line in lines:
            if use_fast and idle:
                if "HTTP/1." in line and "\r" not in line:
                    # An access line (most lines of a busy server): never an event for the reader.
                    reader._next += 1
                    continue
                p = line.find("] Decode batch")
                if p >= 0:
                    pending = columns
                else:
                    p = line.find("] Prefill batch")
                    pending = prows
                if p >= 0:
                    lb = 0 if line[0] == "[" else line.rfind("[", 0, p)
                    if lb >= 0 and p - lb >= 20:
                        base = minutes.get(line[lb + 1:lb + 17])
                        tags = tag_cache.get(line[lb + 20:p])
                        sec = line[lb + 18:lb + 20]
                        if base is not None and tags is not None and line[lb + 17] == ":" and sec.isdigit():
                            t = base + int(sec) + tags[0]
                            dp, pp = tags[1], tags[2]
                        else:
                            st = stamp_of(line, p)  # fills the caches; None when not a stamp
                            if st is None:
                                t = -1.0
                            else:
                                t, dp, pp = st
                        ref = last_t if last_t is not None else self._last_t
                        if ref is not None and t < ref - BACKWARD_TOLERANCE_S:
                            t = -1.0  # out of order or a clock set back: the full path's log clock decides
                        if t >= 0:
                            key = (dp, pp, (t // res_s) * res_s)
                            pend = pending.get(key)
                            if pend is None:
                                pend = pending[key] = ([], [])
                            pend[0].append(t)
                            pend[1].append(line)
                            if last_t is None or t > last_t:
                                last_t = t
                            reader._next += 1  # the reader numbers lines itself: keep its count
                            fast += 1
                            continue
            if last_t is not None:
                self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
                last_t = None
            if "\x00" in line:
                res.nul_lines += 1
            out = reader.feed(line)
            if out:
                for e in out:
                    res.events.append(self._timed(e, res))
            idle = reader._block is None
        if last_t is not None:
            self._last_t = last_t if self._last_t is None else max(self._last_t, last_t)
        res.fast += fast

    def scan_bytes(self, data: bytes | mmap.mmap, *, final: bool = True, start: int = 0) -> ChunkResult:
        """scan_text of UTF-8 bytes from offset `start` (invalid bytes replaced). With the C accelerator,
        runs of lines no multi-line record needs are read in C: access and chatter lines skipped, each
        Decode/Prefill line's time and columns summed into its bucket group (`self._cols`); the lines it
        hands back go through `scan`'s own per-line logic.  `data` may be a read-only mmap of the file
        (the workers' way: no copy of the range into fresh memory)."""
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
                                                                self._last_t or 0.0, BACKWARD_TOLERANCE_S)
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
            if blk is not None and (blk.count >= _MAX_BLOCK_LINES or not blk.accepts(line)):
                # The line ends the open record: emit it now, then read the line again (as scan_text does).
                for e in reader.flush():
                    res.events.append(self._timed(e, res))
                continue
            pos = nxt
            self._scan_lines((line,), res)
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


_Job = tuple[str, int, int, float, float, float, float, tuple[int, str] | None]


def _scan_range(job: _Job) -> ChunkResult:
    """Worker: scan bytes [start, end) of a plain file (lines numbered from 1 within the range)."""
    path, start, end, res_s, usage_good, low, high, known_oom = job
    collecting = gc.isenabled()
    gc.disable()  # a range makes few cycles: cycle collections were ~3 % of a worker's time
    try:
        return _scan_mapped(path, start, end, Scanner(res_s, usage_good, (low, high), known_oom=known_oom))
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
