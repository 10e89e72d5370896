"""Whole log files: read sequentially in large blocks of bytes (`read_file_events`), with the same events,
line numbers and statistics as one `logreader.EventReader` over every line; cut into byte ranges at record
heads (`split_ranges`) for diagnose's parallel path (offline/parallel.py).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterator
from typing import IO

from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.logreader import EventReader
from sglang_tuning_exporter.sources.tail import MAX_LINE_BYTES, InputError, LineSplitter, open_input

BLOCK_BYTES = 64 << 10  # bytes read and decoded at once: small enough to stay in cache and let events die young
CHUNK_BYTES = 8 << 20  # bytes per parallel task
_CUT = re.compile(rb"\n\[\d")  # a `[2025-...` record head: no open record continues past it
_CUT_PROBE = 1 << 20


def may_hold_long_line(block: bytes, limit: int) -> bool:
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


class LineBlocks:
    """Blocks of whole lines read from `read` (the last may lack its newline). A line longer than
    `max_line_bytes` is skipped, an empty line in its place (line numbers hold), and counted in
    `oversized`: memory stays a block and a line, time linear in the input (a gzip bomb of NULs, one
    endless line, used to be concatenated block after block)."""

    def __init__(self, read: Callable[[int], bytes], block_bytes: int, max_line_bytes: int) -> None:
        self.read, self.block_bytes, self.max_line_bytes = read, block_bytes, max_line_bytes
        self.oversized = 0
        self.bytes_read = 0

    def __iter__(self) -> Iterator[bytes]:
        carry = b""
        skipping = False  # inside an over-long line, up to its newline
        limit = self.max_line_bytes
        while data := self.read(self.block_bytes):
            self.bytes_read += len(data)
            if skipping:
                nl = data.find(b"\n")
                if nl < 0:
                    continue
                data = data[nl + 1:]
                skipping = False
                yield b"\n"
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n") + 1
            carry = buf[cut:]
            if cut:
                yield self._capped(buf[:cut]) if may_hold_long_line(buf[:cut], limit) else buf[:cut]
            if len(carry) > limit:
                carry, skipping = b"", True
                self.oversized += 1
        if carry:
            yield carry
        elif skipping:
            yield b"\n"  # the over-long last line, unterminated: still a line (skipped)

    def _capped(self, block: bytes) -> bytes:
        """`block` (whole lines) with each line longer than the limit emptied and counted."""
        out: list[bytes] = []
        pos, find, limit = 0, block.find, self.max_line_bytes
        while pos < len(block):
            nl = find(b"\n", pos)
            if nl - pos > limit:
                out.append(b"\n")
                self.oversized += 1
            else:
                out.append(block[pos:nl + 1])
            pos = nl + 1
        return b"".join(out)


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
        if cut < 0 or may_hold_long_line(buf[:cut], max_line_bytes) or len(buf) - cut - 1 > max_line_bytes:
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


_SNIFF_MAX_BLOCKS = 8192  # 64 MiB of leading NULs at most


def sniff(path: str) -> str:
    """`gzip`, `binary` or `text`: what the file's first bytes say (one open for both questions)."""
    with open(path, "rb") as fh:
        head = fh.read(8192)
        if head[:2] == b"\x1f\x8b":
            return "gzip"
        # A log rotated with copytruncate under a writer without O_APPEND starts with a run of NULs:
        # judge the text after that run (an all-NUL file is caught later by the NUL-line count).
        for _ in range(_SNIFF_MAX_BLOCKS):  # bounded: an endless NUL source is binary, not a long head
            if not head or head.strip(b"\x00"):
                break
            head = fh.read(8192)
        else:
            return "binary"
        head = head.lstrip(b"\x00") + fh.read(8192)
    head = head[:8192]
    # NULs, or mostly bytes that are no UTF-8 (a log is text; a few odd bytes are counted, not refused)
    bad = head.decode("utf-8", "replace").count("\ufffd")
    return "binary" if b"\x00" in head or bad * 4 > len(head) else "text"


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
