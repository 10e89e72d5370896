"""The event reader: a stream of log lines in, Events out, multi-line records joined.

Single lines go through `logparse` (with the reader's own `grammar.Grammar`, or the C drop-in on runs
of lines no open record needs); tracebacks and SGLang's multi-line OOM message are collected and
resolved by `logrecords` into ONE event numbered by their first line. Whole files, sequential or in a
process pool, are read by `logfiles`.
"""

from __future__ import annotations

import mmap
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logparse import (
    GLUE_GATE,
    LineClassifier,
    ParseStats,
    capture_event,
    glue_point,
    parse_any,
)
from sglang_tuning_exporter.sources.logrecords import MAX_BLOCK_LINES, Block, resolve, startup_oom


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
        self._block: Block | None = None
        # SGLang's phase-less `Out of memory.` message, held until the record after it: the scheduler's
        # traceback re-raising it names the phase by its frames (alloc_for_extend / alloc_for_decode).
        self._pending: dict[tuple[tuple[str, int], ...], Event] = {}  # by rank (TP ranks interleave)
        # Between a start (`server_args`, `Load weight begin`) and the first Decode/Prefill line (True): an OOM
        # of no phase there failed before any batch (the headroom the static fraction leaves). None: not known
        # yet (a parallel range starting later in the file is told the state before it: `before_batches`).
        self.before_batches: bool | None = None
        # Line of the first phase-less OOM judged while that state was not known (its caller re-reads).
        self.first_blind_init: int | None = None
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
            if self._block is None and not self._pending:
                # C reads lines until one needs Python (see _scan.c for which).
                stop, n, nd, np_, nr = scan_buffer(data, pos, self._next, out)
                st.lines += n - self._next
                self._next = n
                count_scanned(by_kind, nd, np_, nr)
                if nd or np_:
                    self.before_batches = False
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
        open_block = self._block is not None or bool(self._pending)
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
                        self.before_batches = False
                        continue
            take(line, n, out)
            open_block = self._block is not None or bool(self._pending)

    def _take(self, line: str, n: int, out: list[Event]) -> None:
        block = self._block
        if block is not None:
            if block.count < MAX_BLOCK_LINES and block.accepts(line):
                block.add(line)
                return
            self._finish(out)
        if GLUE_GATE in line and self._take_glued(line, n, out):
            return
        r, partial = parse_any(line, n, self.classifier.grammar)
        if self._pending and (r.__class__ is not Event or r.kind not in (ev.ERROR, ev.OOM)) and line.strip():
            self._release(out)  # the record after the message is not its traceback: the phase stays unknown
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
            self.before_batches = False
            return
        if kind == ev.SERVER_ARGS or (kind == ev.STARTUP_MEMORY and e.fields.get("stage") == "load_weight_begin"):
            self.before_batches = True  # a start: no batch yet
        if kind == ev.ERROR or (kind == ev.OOM and "exception" not in e.fields):
            # May continue on the next lines: hold it until the record ends.
            self._block = Block(e, traceback=kind == ev.ERROR)
            return
        st.by_kind[kind] += 1
        if kind == ev.OOM:
            e = self._at_init(e)
            startup_oom(e.fields)
            self._remember_oom(e)
        out.append(e)
        if kind == ev.STARTUP_MEMORY:
            extra = capture_event(e)
            if extra is not None:
                self.classifier.count(extra)
                out.append(extra)

    @property
    def holding(self) -> bool:
        """True while a record is open or an OOM message waits for its traceback: every line must then
        be offered to `feed` (no shortcut may read it)."""
        return self._block is not None or bool(self._pending)

    def end_record(self) -> list[Event]:
        """Close the open record (a line that does not continue it was seen); an OOM message it held may
        go on waiting for its traceback."""
        out: list[Event] = []
        if self._block is not None:
            self._finish(out)
        return out

    def flush(self) -> list[Event]:
        """End of input: emit whatever record is still open."""
        out: list[Event] = []
        if self._block is not None:
            self._finish(out)
        if self._pending:
            self._release(out)
        return out

    def batches_read(self) -> None:
        """Decode/Prefill lines were read elsewhere (diagnose's C bucket reader): the server is past its start."""
        self.before_batches = False

    def _at_init(self, e: Event) -> Event:
        """An OOM of no phase after a start and before any batch: a start-up failure in the headroom."""
        if e.kind != ev.OOM or e.fields.get("phase") != "unknown" or not self.before_batches:
            if self.before_batches is None and e.kind == ev.OOM and e.fields.get("phase") == "unknown" \
                    and self.first_blind_init is None:
                self.first_blind_init = e.line
            return e
        fields = {**e.fields, "phase": "startup", "before_first_batch": True}
        startup_oom(fields)
        return Event(e.line, e.kind, e.time, dict(e.rank), fields)

    def _release(self, out: list[Event], key: tuple[tuple[str, int], ...] | None = None) -> None:
        """Emit the held OOM message of rank `key` (every held one when None), in line order."""
        keys = [key] if key is not None else list(self._pending)
        out.extend(sorted((self._pending.pop(k) for k in keys if k in self._pending), key=lambda e: e.line))

    def _remember_oom(self, e: Event) -> None:
        msg = str(e.fields.get("message", "")).split("\n", 1)[0].strip()
        self._last_oom = (e.line, msg)

    def _finish(self, out: list[Event]) -> None:
        block = self._block
        assert block is not None
        self._block = None
        e, blind = resolve(block, self._last_oom)
        if not any(func.startswith("event_loop") for _, func in block.frames):  # the loop runs: past start
            e = self._at_init(e)
        if blind and self.first_blind_oom_check is None:
            self.first_blind_oom_check = block.head.line
        self.classifier.count(e)
        if e.kind == ev.OOM:
            self._remember_oom(e)
        key = tuple(sorted(e.rank.items()))
        pending = self._pending.get(key)
        if pending is not None and e.kind == ev.ERROR and e.fields.get("same_as_line") is not None:
            # The traceback re-raising the held message (same first line) tells its phase.
            phase = e.fields.get("phase")
            if phase in ("prefill", "decode", "startup"):
                fields = {**pending.fields, "phase": phase}
                startup_oom(fields)
                if e.fields.get("last_frame"):
                    fields["last_frame"] = e.fields["last_frame"]
                self._pending[key] = Event(pending.line, pending.kind, pending.time, dict(pending.rank), fields)
                e = Event(e.line, e.kind, e.time, dict(e.rank), {**e.fields, "same_as_line": pending.line})
            self._release(out, key)
        elif e.kind not in (ev.ERROR, ev.OOM):
            self._release(out)
        if e.kind == ev.OOM and block.head.kind == ev.OOM and e.fields.get("phase") == "unknown":
            self._pending[key] = e  # wait for the traceback that follows
            return
        out.append(e)


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


def scan_text(text: str, first_line: int = 1) -> tuple[list[Event], ParseStats]:
    """Every event of a text made of whole lines (numbered from `first_line`), and the statistics."""
    reader = EventReader(first_line)
    events = reader.feed_text(text)
    events.extend(reader.flush())
    return events, reader.stats
