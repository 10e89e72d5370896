"""Reading logs: a file follower for live tailing and `open_input` for offline files, .gz and stdin.

The follower is poll-driven (the caller decides when; tests call `poll()` directly, no sleeps) and
handles what a log does to a reader in production, in the manner of mtail:
* start at the end (default) or from the start; a file created later is read from its start;
* partial lines are buffered until their newline arrives;
* rotation (the path now names a new inode): drain the old file, then open the new one at 0;
* truncation (size < our offset, same inode): restart at 0 and count it;
* a file that does not exist yet, or disappears: `exists` is False and polling carries on;
* lines longer than `max_line_bytes` are cut to that length and counted, never held whole.
`\\r` is not a line break: progress-bar fragments stay inside their line.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Protocol, cast

MAX_LINE_BYTES = 1 << 20  # 1 MiB
_CHUNK = 1 << 18


class InputError(Exception):
    """An input that cannot be read (missing, a directory, unreadable): the message says which."""


@dataclass(frozen=True)
class FileId:
    """What identifies a file across renames: device and inode, plus its current size."""

    dev: int
    ino: int
    size: int


class FileSystem(Protocol):
    """The two calls the follower needs; tests may hand in a fake, production uses the OS."""

    def stat(self, path: str) -> FileId:
        """FileId of `path`; raises FileNotFoundError when it does not exist."""
        ...

    def open(self, path: str) -> IO[bytes]:
        """Open `path` for binary reading."""
        ...


class OsFileSystem:
    """The real file system."""

    def stat(self, path: str) -> FileId:
        """os.stat, reduced to what the follower compares."""
        st = os.stat(path)
        return FileId(st.st_dev, st.st_ino, st.st_size)

    def open(self, path: str) -> IO[bytes]:
        """open(path, 'rb') without buffering surprises on a growing file."""
        return open(path, "rb")


class LineSplitter:
    """Bytes in, complete decoded lines out; bounded memory whatever the line length."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, encoding: str = "utf-8") -> None:
        self.max_line_bytes = max_line_bytes
        self.encoding = encoding
        self.truncated = 0  # lines cut to max_line_bytes
        self._carry = b""
        self._discarding = False  # inside an overlong line whose head was already emitted

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held back."""
        return len(self._carry)

    def feed(self, data: bytes) -> list[str]:
        """Add bytes; return the lines they complete (without their newline)."""
        out: list[str] = []
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return out
            data = data[nl + 1:]
            self._discarding = False
        buf = self._carry + data if self._carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._carry = buf
        else:
            complete, self._carry = buf[:cut], buf[cut + 1:]
            if len(complete) > self.max_line_bytes:
                out.extend(self._decode(piece) for piece in complete.split(b"\n"))
            else:
                out.extend(complete.decode(self.encoding, "replace").split("\n"))
        if len(self._carry) > self.max_line_bytes:
            # An overlong line: emit its head now, drop the rest up to the next newline.
            out.append(self._carry[:self.max_line_bytes].decode(self.encoding, "replace"))
            self.truncated += 1
            self._carry = b""
            self._discarding = True
        return out

    def _decode(self, piece: bytes) -> str:
        if len(piece) > self.max_line_bytes:
            self.truncated += 1
            piece = piece[:self.max_line_bytes]
        return piece.decode(self.encoding, "replace")

    def flush(self) -> list[str]:
        """End of input: the unterminated last line, if any."""
        carry, self._carry = self._carry, b""
        self._discarding = False
        return [carry.decode(self.encoding, "replace")] if carry else []

    def reset(self) -> int:
        """Forget a partial line (after truncation); returns how many bytes were dropped."""
        dropped = len(self._carry)
        self._carry = b""
        self._discarding = False
        return dropped


class Follower:
    """Follow one log path across rotation and truncation; call `poll()` to get new lines."""

    def __init__(self, path: str, *, from_start: bool = False, fs: FileSystem | None = None,
                 clock: Callable[[], float] = time.monotonic, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.path = path
        self.fs: FileSystem = fs or OsFileSystem()
        self.clock = clock
        self.rotations = 0
        self.truncations = 0
        self.exists = False
        self.last_data_at: float | None = None  # clock() when a line last arrived
        self._splitter = LineSplitter(max_line_bytes)
        self._fh: IO[bytes] | None = None
        self._id: FileId | None = None
        self._offset = 0
        self._seek_end_on_open = not from_start  # only for a file already there at start

    @property
    def truncated_lines(self) -> int:
        """Lines cut to the maximum line length."""
        return self._splitter.truncated

    @property
    def offset(self) -> int:
        """Byte offset read so far in the current file."""
        return self._offset

    def poll(self) -> list[str]:
        """Every complete line written since the last poll (rotation/truncation handled)."""
        lines: list[str] = []
        if self._fh is None and not self._open(lines):
            return lines
        self._drain(lines)
        try:
            now_id = self.fs.stat(self.path)
        except FileNotFoundError:
            # Gone (moved away or deleted): keep reading the open file until a new one appears.
            self.exists = False
            return self._stamp(lines)
        except OSError:
            return self._stamp(lines)
        self.exists = True
        assert self._id is not None
        if (now_id.dev, now_id.ino) != (self._id.dev, self._id.ino):
            # Rotated: the old file is drained; its unterminated last line is complete now.
            lines.extend(self._splitter.flush())
            self._close()
            self.rotations += 1
            self._seek_end_on_open = False
            if self._open(lines):
                self._drain(lines)
        elif now_id.size < self._offset:
            self.truncations += 1
            self._splitter.reset()
            assert self._fh is not None
            self._fh.seek(0)
            self._offset = 0
            self._id = now_id
            self._drain(lines)
        return self._stamp(lines)

    def _stamp(self, lines: list[str]) -> list[str]:
        if lines:
            self.last_data_at = self.clock()
        return lines

    def _open(self, lines: list[str]) -> bool:
        try:
            fid = self.fs.stat(self.path)
            fh = self.fs.open(self.path)
        except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
            self.exists = False
            self._seek_end_on_open = False  # it did not exist at start: read it whole when it comes
            return False
        self.exists = True
        self._fh = fh
        self._id = fid
        self._offset = 0
        if self._seek_end_on_open:
            self._offset = fh.seek(0, io.SEEK_END)
        self._seek_end_on_open = False
        return True

    def _drain(self, lines: list[str]) -> None:
        fh = self._fh
        if fh is None:
            return
        while True:
            data = fh.read(_CHUNK)
            if not data:
                break
            self._offset += len(data)
            lines.extend(self._splitter.feed(data))

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None
        self._id = None

    def close(self) -> None:
        """Release the file handle."""
        self._close()


class StreamFollower:
    """Follow a pipe or stdin (`-`) without blocking: `poll()` returns the complete lines available.

    Same surface as Follower (rotations/truncations stay 0); `eof` turns True when the writer closes.
    """

    def __init__(self, fd: int | None = None, *, clock: Callable[[], float] = time.monotonic,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.fd = sys.stdin.fileno() if fd is None else fd
        self._was_blocking = os.get_blocking(self.fd)
        os.set_blocking(self.fd, False)
        self.clock = clock
        self.rotations = 0
        self.truncations = 0
        self.exists = True
        self.eof = False
        self.last_data_at: float | None = None
        self._splitter = LineSplitter(max_line_bytes)

    @property
    def truncated_lines(self) -> int:
        """Lines cut to the maximum line length."""
        return self._splitter.truncated

    def poll(self) -> list[str]:
        """Every complete line readable now; at end of stream, the unterminated last line too."""
        lines: list[str] = []
        while not self.eof:
            try:
                data = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                break
            if not data:
                self.eof = True
                self.exists = False
                lines.extend(self._splitter.flush())
                break
            lines.extend(self._splitter.feed(data))
        if lines:
            self.last_data_at = self.clock()
        return lines

    def close(self) -> None:
        """The stream belongs to the caller: only its blocking mode is given back (a terminal or a file
        description shared with the shell must not stay non-blocking)."""
        if self._was_blocking:
            with contextlib.suppress(OSError):  # already closed by its owner
                os.set_blocking(self.fd, True)


def follow(path_or_dash: str, *, from_start: bool = False, clock: Callable[[], float] = time.monotonic,
           max_line_bytes: int = MAX_LINE_BYTES) -> Follower | StreamFollower:
    """A follower for a log path, or for standard input when given `-`."""
    if path_or_dash == "-":
        return StreamFollower(clock=clock, max_line_bytes=max_line_bytes)
    return Follower(path_or_dash, from_start=from_start, clock=clock, max_line_bytes=max_line_bytes)


class InputLines:
    """Lines of an offline input (plain file, .gz, or `-` for stdin), read with bounded memory."""

    def __init__(self, path: str, *, max_line_bytes: int = MAX_LINE_BYTES,
                 stdin: IO[bytes] | None = None) -> None:
        self.path = path
        self._splitter = LineSplitter(max_line_bytes)
        self._fh: IO[bytes]
        if path == "-":
            self._fh = stdin if stdin is not None else sys.stdin.buffer
            self._owned = False
            return
        if os.path.isdir(path):
            raise InputError(f"{path}: is a directory, not a log file")
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed by close()/__exit__
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self._owned = True
        magic = raw.read(2)
        raw.seek(0)
        self._fh = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")) if magic == b"\x1f\x8b" else raw
        self._raw = raw

    @property
    def truncated(self) -> int:
        """Lines cut to the maximum line length."""
        return self._splitter.truncated

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            yield from chunk

    def raw_stream(self) -> IO[bytes]:
        """The undecoded bytes (gzip already inflated), for readers that split lines themselves."""
        return self._fh

    def chunks(self) -> Iterator[list[str]]:
        """The lines a block at a time (what fast readers consume)."""
        split = self._splitter
        read = self._fh.read
        try:
            while True:
                data = read(_CHUNK)
                if not data:
                    break
                lines = split.feed(data)
                if lines:
                    yield lines
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InputError(f"{self.path}: read failed: {exc}") from None
        tail = split.flush()
        if tail:
            yield tail

    def close(self) -> None:
        """Close the file when we opened it."""
        if self._owned:
            self._fh.close()
            self._raw.close()

    def __enter__(self) -> InputLines:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_input(path_or_dash: str, *, max_line_bytes: int = MAX_LINE_BYTES) -> InputLines:
    """Open a log for offline reading: a path (plain or gzip, detected by content) or `-` (stdin).
    Raises InputError with a readable message."""
    return InputLines(path_or_dash, max_line_bytes=max_line_bytes)
