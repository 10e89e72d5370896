"""Multi-line aware reader: turns a stream of log lines into Events.

Single lines go through `logparse`. Two things span lines and are joined here into ONE event
numbered by their first line: Python tracebacks (`Scheduler hit an exception: Traceback ...`,
`Exception in ControllerSingle:` ...) and SGLang's multi-line KV-pool OOM message
(`Prefill out of memory. Try to lower your batch size.` / `Try to allocate N tokens.` / ...).
A traceback that ends in an out-of-memory exception becomes an `oom` event whose phase comes from
the message or, failing that, from the frames (`forward_extend` vs `forward_decode`, ...).
"""

from __future__ import annotations

import functools
import gzip
import itertools
import mmap
import multiprocessing
import os
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult
from typing import IO, Any, Generic, TypeVar

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logmessages import POOL_TOO_SMALL
from sglang_tuning_exporter.sources.logparse import (
    GLUE_GATE,
    LineClassifier,
    ParseStats,
    capture_event,
    glue_point,
    oom_detail_fields,
    oom_phase_from_text,
    parse_any,
)
from sglang_tuning_exporter.sources.tail import MAX_LINE_BYTES, InputError, LineSplitter, open_input

_MAX_BLOCK_LINES = 2000  # a runaway "traceback" stops being collected (the event is still emitted)
_MAX_KEPT_LINES = 200
_DEDUP_DISTANCE = 5000  # lines within which a re-raised OOM repeats an already reported one

_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\S+)')
_EXC_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt|Failure|Fault))(?:: ?(.*))?$")
_RANK_TAG = re.compile(r"^\[rank\d+\]:\s?")
_OOM_CONT = re.compile(
    r"^(?:Try to allocate|Ava(?:li|il)able (?:full |swa )?tokens|[\w.]*(?:available|evictable)_size\(\)"
    r"|(?:Full|SWA) LRU list|Possible solutions:|\d\. |Open an issue|\w+_size=|num_reqs=)")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause",
          "Traceback (most recent call last)")
_OOM_TEXT = re.compile(r"(?i)out of memory|OutOfMemoryError|Not enough memory|leave no GPU memory"
                       r"|Capture (?:cuda |CUDA )?graph failed")

# Frames that tell the phase of a failure; the innermost frame that matches decides.
_PREFILL_FRAMES = ("forward_extend", "_execute_extend", "prepare_for_extend", "alloc_for_extend",
                   "alloc_paged_token_slots_extend", "get_new_batch_prefill", "process_batch_result_prefill",
                   "forward_prefill", "run_prefill", "prefill_cuda_graph_runner", "forward_fill_batch")
_DECODE_FRAMES = ("forward_decode", "_execute_decode", "prepare_for_decode", "alloc_for_decode",
                  "alloc_paged_token_slots_decode", "update_running_batch", "process_batch_result_decode",
                  "decode_cuda_graph_runner", "replay", "forward_decode_batch", "retract_decode")
_STARTUP_FRAMES = ("capture", "init_cuda_graphs", "load_model", "init_memory_pool", "profile_max_num_token",
                   "init_torch_distributed", "initialize", "capture_one_batch_size", "init_device_graphs",
                   "init_piecewise_cuda_graphs", "init_attention_backend", "init_cublas")
# SGLang's own sizing failure: the pool does not fit after the weights (raise the fraction). Any other
# out-of-memory at start-up failed in the headroom the fraction leaves (lower it).


def phase_from_frames(frames: list[tuple[str, str]]) -> str | None:
    """prefill / decode / startup from traceback frames (file, function), innermost first wins."""
    for path, func in reversed(frames):
        if func in _PREFILL_FRAMES or "prefill_cuda_graph" in path:
            return "prefill"
        if func in _DECODE_FRAMES or "decode_cuda_graph" in path:
            return "decode"
        if func in _STARTUP_FRAMES:
            return "startup"
    # Before the first batch the scheduler is still being built: constructors (a workspace or buffer
    # allocated in some `__init__`) and no event-loop frame. At run time every traceback passes the loop.
    funcs = [func for _, func in frames]
    if "__init__" in funcs and not any(f.startswith("event_loop") for f in funcs):
        return "startup"
    return None


@dataclass
class _Block:
    """A multi-line record being collected."""

    head: Event
    traceback: bool
    lines: list[str] = field(default_factory=list)
    frames: list[tuple[str, str]] = field(default_factory=list)
    count: int = 0
    exception: str | None = None
    exc_message: list[str] = field(default_factory=list)
    in_exc_message: bool = False

    def accepts(self, line: str) -> bool:
        """True when `line` continues this record."""
        if not line.strip():
            return self.traceback  # blank lines separate chained tracebacks
        s = _RANK_TAG.sub("", line)
        if _OOM_CONT.match(s):
            return True
        if not self.traceback:
            return False
        if s[0] in " \t" or s.startswith(_CHAIN) or _EXC_LINE.match(s):
            return True
        # Text right after the exception line continues a multi-line exception message.
        return self.in_exc_message and not s.startswith("[") and _looks_like_message(s)

    def add(self, line: str) -> None:
        """Take a continuation line."""
        self.count += 1
        s = _RANK_TAG.sub("", line.rstrip("\n"))
        if len(self.lines) < _MAX_KEPT_LINES:
            self.lines.append(s)
        f = _FRAME.match(s)
        if f:
            self.in_exc_message = False
            if len(self.frames) < _MAX_KEPT_LINES:
                self.frames.append((f.group(1), f.group(2)))
            return
        x = _EXC_LINE.match(s)
        if x and s[0] not in " \t":
            self.exception = x.group(1)
            self.exc_message = [x.group(2) or ""]
            self.in_exc_message = True
            return
        if s.startswith(_CHAIN):
            self.in_exc_message = False
            return
        if self.in_exc_message and s.strip() and len(self.exc_message) < 20:
            self.exc_message.append(s.strip())


def _looks_like_message(s: str) -> bool:
    # Lines of an exception message are prose, not another tool's log record.
    return not re.match(r"^(?:[IWEF]\d{4} |\d{4}-\d\d-\d\d |INFO|WARN|ERROR|DEBUG)", s)


def count_scanned(by_kind: Counter[str], decode: int, prefill: int, retract: int) -> None:
    """Add the events the C accelerator read to the statistics by kind."""
    if decode:
        by_kind[ev.DECODE] += decode
    if prefill:
        by_kind[ev.PREFILL] += prefill
    if retract:
        by_kind[ev.RETRACT] += retract


def line_at(data: bytes | mmap.mmap, pos: int) -> tuple[str, int]:
    """The line of `data` starting at `pos` (decoded, invalid bytes replaced) and where the next starts."""
    end = data.find(b"\n", pos)
    if end < 0:
        end = len(data)
    return data[pos:end].decode("utf-8", "replace"), end + 1


class EventReader:
    """Feed lines one by one (live tailing) or use read_events (files); `stats` counts outcomes."""

    def __init__(self, start_line: int = 1, classifier: LineClassifier | None = None) -> None:
        self.classifier = classifier or LineClassifier()
        self._next = start_line
        self._block: _Block | None = None
        self._last_oom: tuple[int, str] | None = None
        # Line of the first re-raised-OOM check made while no OOM was known yet: a reader that starts
        # mid-file (parallel chunks) cannot know the lines before it, so its caller re-checks this.
        self.first_blind_oom_check: int | None = None

    @property
    def stats(self) -> ParseStats:
        """The classifier's counters."""
        return self.classifier.stats

    @property
    def next_line(self) -> int:
        """Number the next fed line will get."""
        return self._next

    def feed(self, line: str) -> list[Event]:
        """One line in (with or without its newline); the events it completes out."""
        return self.feed_lines([line])

    def feed_lines(self, lines: list[str]) -> list[Event]:
        """Many lines at once: the fast path for files (same result as feeding them one by one)."""
        out: list[Event] = []
        self._feed_into(lines, out)
        return out

    def feed_text(self, text: str) -> list[Event]:
        """Whole lines of text at once (the last may lack its newline): feed_lines of its lines."""
        if not text:
            return []
        lines = text.split("\n")
        if text[-1] == "\n":
            lines.pop()
        return self.feed_lines(lines)

    def feed_bytes(self, data: bytes) -> list[Event]:
        """Whole lines of UTF-8 bytes (the last may lack its newline): feed_text of their decoding
        (invalid bytes replaced). With the C accelerator the lines no record needs are never decoded."""
        scan = SCAN
        if scan is None:
            return self.feed_text(data.decode("utf-8", "replace"))
        out: list[Event] = []
        st = self.classifier.stats
        by_kind = st.by_kind
        take = self._take
        scan_buffer = scan.scan_buffer
        size = len(data)
        pos = 0
        while pos < size:
            if self._block is None:
                # C reads lines until one needs Python (see _scan.c for which).
                stop, n, nd, np_, nr = scan_buffer(data, pos, self._next, out)
                st.lines += n - self._next
                self._next = n
                count_scanned(by_kind, nd, np_, nr)
                pos = stop
                if pos >= size:
                    break
            line, pos = line_at(data, pos)
            n = self._next
            self._next += 1
            st.lines += 1
            take(line, n, out)
        return out

    def _feed_into(self, lines: list[str], out: list[Event]) -> None:
        if SCAN is not None and lines:
            # One C entry for the reader: the lines as the bytes they were read from.
            if lines[-1][-1:] == "\n" or lines[0][-1:] == "\n":  # lines given with their newline
                lines = [x[:-1] if x[-1:] == "\n" else x for x in lines]
            text = "\n".join(lines)
            if text.count("\n") == len(lines) - 1:  # (a "line" holding a newline is read as one, below)
                out.extend(self.feed_bytes(text.encode("utf-8", "surrogatepass") + b"\n"))
                return
        append = out.append
        n = self._next - 1
        self._next += len(lines)
        self.classifier.stats.lines += len(lines)
        by_kind = self.classifier.stats.by_kind
        take = self._take
        fast = self.classifier.grammar.fast_batch
        open_block = self._block is not None
        for line in lines:
            n += 1
            if not open_block:
                # Access-log lines dominate busy logs: skip them before any call. Inside an open
                # record every line must be offered to it, so the shortcuts wait.
                if "HTTP/1." in line:
                    continue
                if "batch" in line:
                    e = fast(line, n)
                    if e is not None:
                        by_kind[e.kind] += 1
                        append(e)
                        continue
            take(line, n, out)
            open_block = self._block is not None

    def _take(self, line: str, n: int, out: list[Event]) -> None:
        block = self._block
        if block is not None:
            if block.count < _MAX_BLOCK_LINES and block.accepts(line):
                block.add(line)
                return
            out.append(self._finish())
        if GLUE_GATE in line and self._take_glued(line, n, out):
            return
        r, partial = parse_any(line, n, self.classifier.grammar)
        self._emit(r, partial, line, n, out)

    def _take_glued(self, line: str, n: int, out: list[Event]) -> bool:
        """Two messages on one line (a lost newline): both events, the second timed and ranked like the
        first when it has no prefix of its own. False when the line is not such a pair."""
        cut = glue_point(line)
        if cut < 0:
            return False
        grammar = self.classifier.grammar
        first, p1 = parse_any(line[:cut], n, grammar)
        second, p2 = parse_any(line[cut:], n, grammar)
        if first.__class__ is not Event or second.__class__ is not Event:
            return False
        a: Event = first
        b: Event = second
        if a.kind in (ev.ERROR, ev.OOM):
            return False  # a record that may continue on the next lines: read the line whole
        if b.time is None and not b.rank:
            b = Event(n, b.kind, a.time, dict(a.rank), b.fields)
        self._emit(a, p1, line, n, out)
        self._emit(b, p2, line, n, out)
        return True

    def _emit(self, r: Any, partial: bool, line: str, n: int, out: list[Event]) -> None:
        if r is None:
            return
        st = self.classifier.stats
        if r.__class__ is not Event:
            st.note_unparsed(n, line)
            return
        e: Event = r
        if partial:
            st.partial += 1
        kind = e.kind
        if kind == ev.DECODE or kind == ev.PREFILL:
            st.by_kind[kind] += 1
            out.append(e)
            return
        if kind == ev.ERROR or (kind == ev.OOM and "exception" not in e.fields):
            # May continue on the next lines: hold it until the record ends.
            self._block = _Block(e, traceback=kind == ev.ERROR)
            return
        st.by_kind[kind] += 1
        if kind == ev.OOM:
            self._startup_oom(e.fields)
            self._remember_oom(e)
        out.append(e)
        if kind == ev.STARTUP_MEMORY:
            extra = capture_event(e)
            if extra is not None:
                self.classifier.count(extra)
                out.append(extra)

    def flush(self) -> list[Event]:
        """End of input: emit whatever record is still open."""
        if self._block is None:
            return []
        return [self._finish()]

    def _startup_oom(self, fields: dict[str, Any]) -> None:
        """Tell the two start-up failures apart: `reason` mem_fraction_static_too_small (the pool does not
        fit after the weights: raise) or init_headroom / cuda_graph_capture (an allocation failed in the
        headroom: CUDA-graph capture, workspace, pool preallocation: lower)."""
        if fields.get("phase") != "startup":
            return
        if POOL_TOO_SMALL.search(str(fields.get("message", ""))):
            fields["reason"] = "mem_fraction_static_too_small"
        elif fields.get("reason") in (None, "mem_fraction_static_too_small"):
            fields["reason"] = "init_headroom"

    def _remember_oom(self, e: Event) -> None:
        msg = str(e.fields.get("message", "")).split("\n", 1)[0].strip()
        self._last_oom = (e.line, msg)

    def _finish(self) -> Event:
        block = self._block
        assert block is not None
        self._block = None
        e = self._resolve(block)
        self.classifier.count(e)
        if e.kind == ev.OOM:
            self._remember_oom(e)
        return e

    def _resolve(self, b: _Block) -> Event:
        head = b.head
        fields: dict[str, Any] = dict(head.fields)
        if head.kind == ev.OOM:
            # SGLang's own multi-line OOM message: join the detail lines into the message.
            if b.lines:
                fields["message"] = "\n".join([str(fields.get("message", "")), *b.lines])
            oom_detail_fields(str(fields["message"]), fields)
            if fields.get("phase") == "unknown":
                fields["phase"] = phase_from_frames(b.frames) or "unknown"
            self._startup_oom(fields)
            return Event(head.line, ev.OOM, head.time, dict(head.rank), fields)
        # A traceback-carrying error.
        frame_phase = phase_from_frames(b.frames)
        if b.frames:
            fields["frames"] = len(b.frames)
            fields["last_frame"] = b.frames[-1][1]
        if b.exception:
            fields["exception"] = b.exception
            fields["exception_message"] = "\n".join(b.exc_message).strip()
        text = "\n".join(b.exc_message) if b.exception else str(fields.get("message", ""))
        if b.exception and _OOM_TEXT.search(text + " " + b.exception):
            phase = oom_phase_from_text(text)
            if phase == "unknown":
                phase = frame_phase or "unknown"
            first = text.split("\n", 1)[0].strip()
            last = self._last_oom
            if last is None and self.first_blind_oom_check is None:
                self.first_blind_oom_check = head.line
            if last is not None and last[1] and last[1] == first and head.line - last[0] < _DEDUP_DISTANCE:
                # The scheduler re-raises the OOM it has just logged: one incident, not two.
                fields["phase"] = phase
                fields["same_as_line"] = last[0]
                return Event(head.line, ev.ERROR, head.time, dict(head.rank), fields)
            oom_fields: dict[str, Any] = {"phase": phase, "message": text.strip(), "exception": b.exception,
                                          "error": fields.get("error")}
            oom_detail_fields(text, oom_fields)
            if b.frames:
                oom_fields["last_frame"] = b.frames[-1][1]
            self._startup_oom(oom_fields)
            return Event(head.line, ev.OOM, head.time, dict(head.rank), oom_fields)
        if frame_phase:
            fields["phase"] = frame_phase
        return Event(head.line, ev.ERROR, head.time, dict(head.rank), fields)


def read_events(lines: Iterable[str], start_line: int = 1,
                reader: EventReader | None = None) -> Iterator[Event]:
    """Every event of a finite stream of lines, multi-line records joined; flushes at the end.
    An input with `chunks()` (tail.InputLines) is read a block of lines at a time."""
    r = reader or EventReader(start_line)
    chunks: Callable[[], Iterable[list[str]]] | None = getattr(lines, "chunks", None)
    if chunks is not None:
        feed_lines = r.feed_lines
        for chunk in chunks():
            out = feed_lines(chunk)
            if out:
                yield from out
    else:
        feed = r.feed
        for line in lines:
            out = feed(line)
            if out:
                yield from out
    yield from r.flush()


# ---------------------------------------------------------------------------------------------
# Whole files: blocks of text (sequential) and byte ranges in a process pool (parallel).
# ---------------------------------------------------------------------------------------------
BLOCK_BYTES = 64 << 10  # bytes read and decoded at once: small enough to stay in cache and let events die young
CHUNK_BYTES = 8 << 20  # bytes per parallel task
_CUT = re.compile(rb"\n\[\d")  # a `[2025-...` record head: no open record continues past it
_CUT_PROBE = 1 << 20


def scan_text(text: str, first_line: int = 1) -> tuple[list[Event], ParseStats]:
    """Every event of a text made of whole lines (numbered from `first_line`), and the statistics."""
    reader = EventReader(first_line)
    events = reader.feed_text(text)
    events.extend(reader.flush())
    return events, reader.stats


def _may_hold_long_line(block: bytes, limit: int) -> bool:
    """False only when no line of `block` is longer than `limit` bytes (checked in C).

    A longer line covers a whole aligned window of limit/2 bytes, so it is enough that every such
    window holds a newline; a True answer only sends the block to the exact (slower) splitter."""
    if len(block) <= limit:
        return False
    half = limit // 2
    if half < 1:
        return True
    find = block.find
    return any(find(b"\n", a, a + half) < 0 for a in range(0, len(block), half))


def _stream_events(read: Callable[[int], bytes], reader: EventReader, max_line_bytes: int,
                   block_bytes: int = BLOCK_BYTES) -> Iterator[Event]:
    """Events of a byte stream read in large blocks cut at their last newline; the same lines as
    tail.LineSplitter gives (which takes over, exactly, as soon as a line may exceed the limit)."""
    carry = b""
    feed_bytes = reader.feed_bytes
    while True:
        data = read(block_bytes)
        if not data:
            break
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0 or _may_hold_long_line(buf[:cut], max_line_bytes) or len(buf) - cut - 1 > max_line_bytes:
            if cut < 0 and len(buf) <= max_line_bytes:
                carry = buf
                continue
            yield from _split_rest(buf, read, reader, max_line_bytes, block_bytes)
            return
        carry = buf[cut + 1:]
        out = feed_bytes(buf[:cut + 1])
        if out:
            yield from out
    if carry:
        yield from feed_bytes(carry)
    yield from reader.flush()


def _split_rest(buf: bytes, read: Callable[[int], bytes], reader: EventReader, max_line_bytes: int,
                block_bytes: int) -> Iterator[Event]:
    # Overlong lines: the rest of the stream goes through the exact splitter (cuts and counts them).
    split = LineSplitter(max_line_bytes)
    data = buf
    while data:
        lines = split.feed(data)
        if lines:
            yield from reader.feed_lines(lines)
        data = read(block_bytes)
    yield from reader.feed_lines(split.flush())
    reader.stats.truncated += split.truncated
    yield from reader.flush()


def _reader_of(fh: IO[bytes], path: str) -> Callable[[int], bytes]:
    def read(n: int) -> bytes:
        try:
            return fh.read(n)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InputError(f"{path}: read failed: {exc}") from None
    return read


def read_file_events(path: str, *, reader: EventReader | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                     block_bytes: int = BLOCK_BYTES) -> Iterator[Event]:
    """Every event of a log (plain, gzip, or `-` for stdin), read in large blocks: the events and
    statistics (`reader.stats`, truncated lines included) of read_events over open_input's lines.
    Raises InputError for an input that cannot be read."""
    r = reader or EventReader()
    with open_input(path, max_line_bytes=max_line_bytes) as src:
        yield from _stream_events(_reader_of(src.raw_stream(), path), r, max_line_bytes, block_bytes)


def split_ranges(path: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """Byte ranges of about `chunk_bytes` covering the file, each starting at a `[<digit>` record
    head, where no multi-line record can be open; a range grows until such a line is found."""
    ranges: list[tuple[int, int]] = []
    start = 0
    with open(path, "rb") as fh:
        nominal = chunk_bytes
        while nominal < size:
            fh.seek(nominal - 1)
            m = _CUT.search(fh.read(_CUT_PROBE))
            if m is None:
                nominal += _CUT_PROBE - 2
                continue
            cut = nominal - 1 + m.start() + 1
            ranges.append((start, cut))
            start = cut
            nominal = cut + chunk_bytes
    ranges.append((start, size))
    return ranges


def _count_newlines(job: tuple[str, int, int]) -> int:
    """Worker: newlines in bytes [start, end) of a file."""
    path, start, end = job
    count = 0
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            data = fh.read(min(BLOCK_BYTES, left))
            if not data:
                break
            left -= len(data)
            count += data.count(b"\n")
    return count


T = TypeVar("T")
_Job = tuple[str, int, int, int, int, tuple[int, str] | None]  # path, start, end, first line, limit, known OOM


@dataclass
class _RangeResult(Generic[T]):
    """What one parallel task sends back: the reduction of its events and the reader's state."""

    value: T
    stats: ParseStats
    last_oom: tuple[int, str] | None
    blind_check: int | None


def _range_reader(fh: IO[bytes], start: int, end: int) -> Callable[[int], bytes]:
    """read(n) over bytes [start, end) of an open file."""
    fh.seek(start)
    left = end - start

    def read(n: int) -> bytes:
        nonlocal left
        if left <= 0:
            return b""
        data = fh.read(min(n, left))
        left -= len(data)
        return data
    return read


def _reduce_range(fn: Callable[[Iterator[Event]], T], job: _Job) -> _RangeResult[T]:
    """Worker (or parent, for a re-read): fn over the events of one byte range of a file."""
    path, start, end, first_line, max_line_bytes, known_oom = job
    reader = EventReader(first_line)
    reader._last_oom = known_oom
    with open(path, "rb") as fh:
        value = fn(_stream_events(_range_reader(fh, start, end), reader, max_line_bytes))
    return _RangeResult(value, reader.stats, reader._last_oom, reader.first_blind_oom_check)


def merge_stats(into: ParseStats, part: ParseStats) -> None:
    """Add the statistics of a later part of the same input to `into`."""
    into.lines += part.lines
    into.by_kind.update(part.by_kind)
    into.unparsed += part.unparsed
    into.partial += part.partial
    into.truncated += part.truncated
    room = into.max_examples - len(into.unparsed_examples)
    if room > 0:
        into.unparsed_examples.extend(part.unparsed_examples[:room])


def _is_plain_file(path: str) -> bool:
    if path == "-" or not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        return fh.read(2) != b"\x1f\x8b"


def map_file_parallel(path: str, fn: Callable[[Iterator[Event]], T], workers: int | None = None, *,
                      stats: ParseStats | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                      chunk_bytes: int = CHUNK_BYTES) -> Iterator[T]:
    """`fn(events)` for each byte range of a log, run in a process pool (fork), results in file order.

    The events fn sees are exactly read_file_events' (same line numbers, same multi-line records, a
    re-raised OOM linked to an OOM of the previous range), and the statistics are added to `stats`.
    fn must be a module-level function (it is sent to the workers by name) whose result pickles;
    reducing in the workers is what makes this fast, since building Python objects in the parent
    costs about as much as parsing. A plain file is cut at `[<digit>` record heads into ranges of
    about `chunk_bytes`; workers first count each range's newlines so every range knows its first
    line number. gzip, stdin, small files and one worker: one range read here."""
    workers = workers or os.cpu_count() or 1
    total = stats if stats is not None else ParseStats()
    size = os.path.getsize(path) if _is_plain_file(path) else 0
    if workers < 2 or size < 2 * chunk_bytes or "fork" not in multiprocessing.get_all_start_methods():
        reader = EventReader()
        reader.classifier.stats = total
        yield fn(read_file_events(path, reader=reader, max_line_bytes=max_line_bytes))
        return
    ranges = split_ranges(path, size, chunk_bytes)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        counts = pool.map(_count_newlines, [(path, a, b) for a, b in ranges])
        jobs: list[_Job] = []
        first = 1
        for (a, b), n in zip(ranges, counts, strict=True):
            jobs.append((path, a, b, first, max_line_bytes, None))
            first += n
        task = functools.partial(_reduce_range, fn)
        pending: deque[AsyncResult[_RangeResult[T]]] = deque()
        queue = iter(jobs)
        # At most two ranges per worker in flight: results wait in memory only that long.
        for job in itertools.islice(queue, 2 * workers):
            pending.append(pool.apply_async(task, (job,)))
        last_oom: tuple[int, str] | None = None
        for job in jobs:
            part = pending.popleft().get()
            for nxt in itertools.islice(queue, 1):
                pending.append(pool.apply_async(task, (nxt,)))
            blind = part.blind_check
            if last_oom is not None and blind is not None and blind - last_oom[0] < _DEDUP_DISTANCE:
                # A traceback re-raising an OOM of the previous range: read this range again here,
                # knowing that OOM, so it is linked to it exactly as a sequential read does.
                part = _reduce_range(fn, (*job[:5], last_oom))
            merge_stats(total, part.stats)
            if part.last_oom is not None:
                last_oom = part.last_oom
            yield part.value


def read_file_parallel(path: str, workers: int | None = None, *, stats: ParseStats | None = None,
                       max_line_bytes: int = MAX_LINE_BYTES, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Event]:
    """read_file_events with the parsing done in a process pool (see map_file_parallel): the same
    events in the same order, delivered to this process. Rebuilding them here costs about as much
    as parsing, so this pays only with more than two cores; reduce in the workers when you can."""
    # Events cross the process boundary as their five values (Event.__reduce__), kinds re-interned.
    for events in map_file_parallel(path, list, workers, stats=stats, max_line_bytes=max_line_bytes,
                                    chunk_bytes=chunk_bytes):
        yield from events
