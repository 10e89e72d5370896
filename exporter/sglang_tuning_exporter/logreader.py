"""Multi-line aware reader: turns a stream of log lines into Events.

Single lines go through `logparse`. Two things span lines and are joined here into ONE event
numbered by their first line: Python tracebacks (`Scheduler hit an exception: Traceback ...`,
`Exception in ControllerSingle:` ...) and SGLang's multi-line KV-pool OOM message
(`Prefill out of memory. Try to lower your batch size.` / `Try to allocate N tokens.` / ...).
A traceback that ends in an out-of-memory exception becomes an `oom` event whose phase comes from
the message or, failing that, from the frames (`forward_extend` vs `forward_decode`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import events as ev
from .events import Event
from .logparse import (
    LineClassifier,
    ParseStats,
    capture_event,
    fast_batch,
    oom_detail_fields,
    oom_phase_from_text,
    parse_any,
)

_MAX_BLOCK_LINES = 2000  # a runaway "traceback" stops being collected (the event is still emitted)
_MAX_KEPT_LINES = 200
_DEDUP_DISTANCE = 5000  # lines within which a re-raised OOM repeats an already reported one

_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\S+)')
_EXC_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault))(?:: ?(.*))?$")
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
                   "init_torch_distributed", "initialize", "capture_one_batch_size")


def phase_from_frames(frames: list[tuple[str, str]]) -> str | None:
    """prefill / decode / startup from traceback frames (file, function), innermost first wins."""
    for path, func in reversed(frames):
        if func in _PREFILL_FRAMES or "prefill_cuda_graph" in path:
            return "prefill"
        if func in _DECODE_FRAMES or "decode_cuda_graph" in path:
            return "decode"
        if func in _STARTUP_FRAMES:
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


class EventReader:
    """Feed lines one by one (live tailing) or use read_events (files); `stats` counts outcomes."""

    def __init__(self, start_line: int = 1, classifier: LineClassifier | None = None) -> None:
        self.classifier = classifier or LineClassifier()
        self._next = start_line
        self._block: _Block | None = None
        self._last_oom: tuple[int, str] | None = None

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
        append = out.append
        n = self._next - 1
        self._next += len(lines)
        self.classifier.stats.lines += len(lines)
        by_kind = self.classifier.stats.by_kind
        take = self._take
        fast = fast_batch
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
        return out

    def _take(self, line: str, n: int, out: list[Event]) -> None:
        block = self._block
        if block is not None:
            if block.count < _MAX_BLOCK_LINES and block.accepts(line):
                block.add(line)
                return
            out.append(self._finish())
        r, partial = parse_any(line, n)
        if r is None:
            return
        st = self.classifier.stats
        if r.__class__ is not Event:
            st.unparsed += 1
            if len(st.unparsed_examples) < st.max_examples:
                st.unparsed_examples.append((n, line.rstrip("\n")[:300]))
            return
        e: Event = r
        if partial:
            st.partial += 1
        kind = e.kind
        if kind is ev.DECODE or kind is ev.PREFILL:
            st.by_kind[kind] += 1
            out.append(e)
            return
        if kind == ev.ERROR or (kind == ev.OOM and "exception" not in e.fields):
            # May continue on the next lines: hold it until the record ends.
            self._block = _Block(e, traceback=kind == ev.ERROR)
            return
        st.by_kind[kind] += 1
        if kind == ev.OOM:
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
