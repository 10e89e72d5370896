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
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Protocol, cast

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.sources.filekind import GZIP_MAGIC, refused, special_file

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
    """The calls the follower needs; tests may hand in a fake, production uses the OS."""

    def stat(self, path: str) -> FileId:
        """FileId of `path`; raises FileNotFoundError when it does not exist."""
        ...

    def open(self, path: str) -> IO[bytes]:
        """Open `path` for binary reading."""
        ...

    def siblings(self, path: str) -> list[tuple[str, FileId, float]]:
        """Regular files beside `path` whose name starts with its name (`x.log.1`, `x.log-2026...`):
        (path, id, mtime as Unix time). Where rotated copies of `path` are."""
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

    def siblings(self, path: str) -> list[tuple[str, FileId, float]]:
        """Rotated copies of `path` (see FileSystem.siblings); an unreadable directory has none."""
        folder, name = os.path.split(os.path.abspath(path))
        out: list[tuple[str, FileId, float]] = []
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if entry.name == name or not entry.name.startswith(name):
                        continue
                    try:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    out.append((entry.path, FileId(st.st_dev, st.st_ino, st.st_size), st.st_mtime))
        except OSError:
            return []
        return out


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


class _Open:
    """One open file being read: its handle, identity, offset, partial line and last bytes read."""

    __slots__ = ("fh", "id", "last_data_at", "offset", "path", "splitter", "tail")

    def __init__(self, path: str, fh: IO[bytes], fid: FileId, splitter: LineSplitter, now: float) -> None:
        self.path = path
        self.fh = fh
        self.id = fid
        self.offset = 0
        self.splitter = splitter
        self.tail = b""  # the last FINGERPRINT_BYTES read: what must still be before `offset`
        self.last_data_at = now

    def read(self, lines: list[str], now: float) -> int:
        """Everything up to the end of the file into `lines`; returns the bytes read."""
        total = 0
        while True:
            data = self.fh.read(_CHUNK)
            if not data:
                break
            total += len(data)
            self.offset += len(data)
            self.tail = (self.tail + data)[-limits.FINGERPRINT_BYTES:]
            if data[:1] == b"\x00" and not self.splitter.pending:
                # The NUL hole of copytruncate under a writer without O_APPEND (it goes on at its old
                # offset): no line, skipped so the line after it is read, not cut as one over-long line.
                data = data.lstrip(b"\x00")
            lines.extend(self.splitter.feed(data))
        if total:
            self.last_data_at = now
        return total


class Follower:
    """Follow one log path across rotation and truncation; call `poll()` to get new lines.

    Rotation (a new inode at the path): the old file stays open and is read until it has been quiet
    for ROTATED_DRAIN_QUIET_S (logrotate `create` without a reopen signal: the writer goes on in the
    renamed file for a while); rotated files that came and went between two polls (several rotations,
    `x.log.1` that was `x.log` after our last poll) are found beside the path and read whole.
    Truncation: the size below our offset, or the bytes just before our offset no longer those we read
    (copytruncate, then regrowth past our offset before the next poll). The tail written before the
    truncation is read from the copy when one beside the path still holds our bytes; what cannot be
    read is counted in `unread_bytes` (a partial line dropped, a rotated file already compressed).
    """

    def __init__(self, path: str, *, from_start: bool = False, fs: FileSystem | None = None,
                 clock: Callable[[], float] = time.monotonic, max_line_bytes: int = MAX_LINE_BYTES,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self.fs: FileSystem = fs or OsFileSystem()
        self.clock = clock
        self.wall = wall  # Unix time, compared with the mtimes of rotated files
        self.rotations = 0
        self.truncations = 0
        self.unread_bytes = 0
        self.exists = False
        self.problem: tuple[str, str] | None = None  # (reason, detail) when the path exists but cannot be read
        self.last_data_at: float | None = None  # clock() when a line last arrived
        self._max_line_bytes = max_line_bytes
        self._cur: _Open | None = None
        self._old: list[_Open] = []  # rotated away, read until quiet
        self._seen: deque[tuple[int, int]] = deque(maxlen=64)  # (dev, ino) of files we have read
        self._cut_closed = 0  # lines cut to the maximum length in files closed since
        self._last_poll_wall: float | None = None
        self._seek_end_on_open = not from_start  # only for a file already there at start

    @property
    def _splitter(self) -> LineSplitter:
        """The current file's splitter (a fresh one before any file was opened)."""
        if self._cur is None:
            return LineSplitter(self._max_line_bytes)
        return self._cur.splitter

    @property
    def truncated_lines(self) -> int:
        """Lines cut to the maximum line length."""
        return self._cut_closed + sum(o.splitter.truncated for o in (*self._old, *([self._cur] if self._cur else [])))

    @property
    def offset(self) -> int:
        """Byte offset read so far in the current file."""
        return self._cur.offset if self._cur is not None else 0

    @property
    def draining(self) -> int:
        """Rotated-away files still being read."""
        return len(self._old)

    def poll(self) -> list[str]:
        """Every complete line written since the last poll (rotation/truncation handled)."""
        lines: list[str] = []
        now = self.clock()
        wall = self.wall()
        since = self._last_poll_wall
        self._last_poll_wall = wall
        self._drain_old(lines, now)
        cur = self._cur
        if cur is None:
            opened = self._open(lines, now)
            if opened is not None:
                opened.read(lines, now)
            return self._stamp(lines)
        self._check_truncated(cur, lines, since)
        cur.read(lines, now)
        try:
            now_id = self.fs.stat(self.path)
        except FileNotFoundError:
            # Gone (moved away or deleted): keep reading the open file until a new one appears.
            self.exists = False
            return self._stamp(lines)
        except OSError:
            return self._stamp(lines)
        self.exists = True
        if (now_id.dev, now_id.ino) != (cur.id.dev, cur.id.ino):
            # Rotated: keep reading the old file until it is quiet; files rotated in between are read whole.
            self._old.append(cur)
            self._cur = None
            self.rotations += 1
            self._between(lines, now_id, since)
            self._seek_end_on_open = False
            opened = self._open(lines, now)
            if opened is not None:
                opened.read(lines, now)
        return self._stamp(lines)

    def _drain_old(self, lines: list[str], now: float) -> None:
        keep: list[_Open] = []
        for o in self._old:
            if o.read(lines, now) or now - o.last_data_at < limits.ROTATED_DRAIN_QUIET_S:
                keep.append(o)
                continue
            lines.extend(o.splitter.flush())  # quiet: its unterminated last line is complete now
            self._retire(o)
        self._old = keep

    def _retire(self, o: _Open) -> None:
        self._cut_closed += o.splitter.truncated
        with contextlib.suppress(OSError):
            o.fh.close()

    def _known(self, fid: FileId) -> bool:
        key = (fid.dev, fid.ino)
        return key in self._seen or any((o.id.dev, o.id.ino) == key for o in self._old)

    def _between(self, lines: list[str], new_id: FileId, since: float | None) -> None:
        """Files rotated away since the last poll that we never opened: read whole, oldest first."""
        if since is None:
            return
        found = [(mtime, path, fid) for path, fid, mtime in self.fs.siblings(self.path)
                 if mtime >= since - 1.0 and (fid.dev, fid.ino) != (new_id.dev, new_id.ino) and not self._known(fid)]
        for _, path, fid in sorted(found, key=lambda f: f[0]):
            try:
                fh = self.fs.open(path)
            except OSError:
                self.unread_bytes += fid.size
                continue
            self.rotations += 1
            self._seen.append((fid.dev, fid.ino))
            with contextlib.closing(fh):
                if fh.read(2) == b"\x1f\x8b":  # already compressed: not ours to unpack
                    self.unread_bytes += fid.size
                    continue
                fh.seek(0)
                o = _Open(path, fh, fid, LineSplitter(self._max_line_bytes), 0.0)
                o.read(lines, 0.0)
                lines.extend(o.splitter.flush())
                self._cut_closed += o.splitter.truncated

    def _check_truncated(self, cur: _Open, lines: list[str], since: float | None) -> None:
        """Truncated since the last read? Then read the lost tail from a copy if one has it, restart at 0."""
        if cur.offset == 0:
            return
        fh = cur.fh
        size = fh.seek(0, io.SEEK_END)
        intact = size >= cur.offset
        if intact and cur.tail:
            fh.seek(cur.offset - len(cur.tail))
            intact = fh.read(len(cur.tail)) == cur.tail
        fh.seek(cur.offset if intact else 0)
        if intact:
            return
        self.truncations += 1
        if not self._read_copy(cur, lines, since):
            self.unread_bytes += cur.splitter.reset()
        cur.offset = 0
        cur.tail = b""

    def _read_copy(self, cur: _Open, lines: list[str], since: float | None) -> bool:
        """copytruncate: a sibling holding our bytes just before our offset has what was written after
        our last read and before the truncation; read it from our offset on. False when none does."""
        n = len(cur.tail)
        if since is None or not n:
            return False
        for path, fid, mtime in self.fs.siblings(self.path):
            if mtime < since - 1.0 or fid.size < cur.offset or (fid.dev, fid.ino) == (cur.id.dev, cur.id.ino):
                continue
            try:
                fh = self.fs.open(path)
            except OSError:
                continue
            with contextlib.closing(fh):
                fh.seek(cur.offset - n)
                if fh.read(n) != cur.tail:
                    continue
                copy = _Open(path, fh, fid, cur.splitter, 0.0)  # the same bytes: the partial line goes on
                copy.offset = cur.offset
                copy.read(lines, 0.0)
                return True
        return False

    def _stamp(self, lines: list[str]) -> list[str]:
        if lines:
            self.last_data_at = self.clock()
        return lines

    def _open(self, lines: list[str], now: float) -> _Open | None:
        try:
            fid = self.fs.stat(self.path)
            fh = self.fs.open(self.path)
        except PermissionError as exc:
            # There, but not ours to read: say so (not "not found"); read it whole once it is readable.
            self.exists = False
            self.problem = ("permission_denied", f"cannot read {self.path}: {exc.strerror or 'permission denied'}")
            self._seek_end_on_open = False
            return None
        except IsADirectoryError:
            self.exists = False
            self.problem = ("read_error", f"{self.path} is a directory, not a log file")
            return None
        except (FileNotFoundError, NotADirectoryError):
            self.exists = False
            self.problem = None
            self._seek_end_on_open = False  # it did not exist at start: read it whole when it comes
            return None
        why = refused(fh)
        if why is not None:  # checked at every open: at start and after each rotation
            with contextlib.suppress(OSError):
                fh.close()
            self.exists = False
            self.problem = ("read_error", f"{self.path}: {why}")
            return None
        self.exists = True
        self.problem = None
        cur = self._cur = _Open(self.path, fh, fid, LineSplitter(self._max_line_bytes), now)
        self._seen.append((fid.dev, fid.ino))
        if self._seek_end_on_open:
            cur.offset = fh.seek(0, io.SEEK_END)
            if cur.offset:
                fh.seek(cur.offset - min(cur.offset, limits.FINGERPRINT_BYTES))
                cur.tail = fh.read(limits.FINGERPRINT_BYTES)
        self._seek_end_on_open = False
        return cur

    def close(self) -> None:
        """Release the file handles."""
        for o in self._old:
            self._retire(o)
        self._old = []
        if self._cur is not None:
            self._retire(self._cur)
        self._cur = None


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
        why = special_file(path)
        if why is not None:
            raise InputError(f"{path}: {why}")
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed by close()/__exit__
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self._owned = True
        magic = raw.read(2)
        raw.seek(0)
        self._fh = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")) if magic == GZIP_MAGIC else raw
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
